// Issue 19's findings, each against the whole server in-process (HttpServer + OpenAiServer + Engine
// over the scripted backend) through raw sockets: bounded metric labels with /health fast meanwhile,
// slow clients that cannot hold every slot (head deadline, body rate, per-address limit, eviction),
// backpressure (pause, release of the batch slot, cancel past the output limit, write timeout),
// half-close, Expect: 100-continue, Host, and a disconnect during a long prefill.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include "engine/engine.h"
#include "model/scripted_runner.h"
#include "model/synthetic.h"
#include "server/openai_server.h"
#include "server_test_util.h"

namespace osprey::server {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

size_t rss_bytes() {
    std::ifstream f("/proc/self/statm");
    size_t pages = 0, resident = 0;
    f >> pages >> resident;
    return resident * size_t(::sysconf(_SC_PAGESIZE));
}

class Hardening : public ::testing::Test {
protected:
    // Starts the server; tests adjust the options first.
    void start() {
        const auto ids =
            test::harmony_tokenizer().encode("<|channel|>final<|message|>Hi there, friend", tok::Specials::allowed);
        runner_ = std::make_unique<model::ScriptedRunner>(model::preset_config("tiny"), ids);
        runner_->set_step_delay(step_delay_);
        eo_.max_kv_tokens = 1 << 20;
        eo_.max_model_len = 131072;
        engine_ = std::make_unique<engine::Engine>(*runner_, eo_);
        engine_->start();
        so_.model_name = "m";
        api_ = std::make_unique<OpenAiServer>(*engine_, test::harmony_tokenizer(), so_);
        ho_.port = 0;
        ho_.error_response = OpenAiServer::transport_error;
        http_ = std::make_unique<http::HttpServer>(ho_, [this](const http::HttpRequest& r) { return api_->handle(r); });
        loop_ = std::thread([this] { http_->run(); });
    }
    void TearDown() override {
        if (!http_) return;
        http_->stop();
        loop_.join();
        http_.reset();
        engine_->stop();
    }

    int connect_client(const char* source = "127.0.0.1", int rcvbuf = 0) {
        return test::connect_loopback(http_->port(), source, rcvbuf);
    }
    static void send_all(int fd, const std::string& s) { test::send_all(fd, s); }
    // Everything until the server closes (or `until` appears, or the receive timeout).
    static std::string read_until(int fd, const std::string& until = "") {
        std::string got;
        char tmp[65536];
        while (until.empty() || got.find(until) == std::string::npos) {
            const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
            if (n <= 0) break;
            got.append(tmp, size_t(n));
        }
        return got;
    }
    static std::string get(const std::string& path, const std::string& extra = "") {
        return "GET " + path + " HTTP/1.1\r\nHost: t\r\n" + extra + "\r\n";
    }
    static std::string post(const std::string& path, const std::string& body, const std::string& extra = "") {
        return "POST " + path + " HTTP/1.1\r\nHost: t\r\n" + extra + "Content-Length: " + std::to_string(body.size()) +
               "\r\n\r\n" + body;
    }
    static std::string chat_body(const std::string& extra, const std::string& content = "hi") {
        return R"({"model": "m", "messages": [{"role": "user", "content": ")" + content + R"("}])" + extra + "}";
    }
    // Seconds one GET /health takes on a new connection ("" when it fails).
    double health_latency() {
        const auto t0 = Clock::now();
        const int fd = connect_client();
        send_all(fd, get("/health", "Connection: close\r\n"));
        const std::string r = read_until(fd);
        ::close(fd);
        return r.find("{\"status\":\"ok\"}") != std::string::npos ? since(t0) : 1e9;
    }
    engine::EngineStats stats() const { return engine_->stats(); }
    template <typename F>
    static bool wait_for(F ok, double timeout_s) {
        const auto t0 = Clock::now();
        while (!ok()) {
            if (since(t0) > timeout_s) return false;
            std::this_thread::sleep_for(5ms);
        }
        return true;
    }

    std::chrono::microseconds step_delay_{0};
    engine::EngineOptions eo_;
    ServerOptions so_;
    http::HttpServerOptions ho_;
    std::unique_ptr<model::ScriptedRunner> runner_;
    std::unique_ptr<engine::Engine> engine_;
    std::unique_ptr<OpenAiServer> api_;
    std::unique_ptr<http::HttpServer> http_;
    std::thread loop_;
};

// Finding 1: 20 000 unauthenticated requests with unique paths add no label, no memory and nothing to
// /metrics; /health stays fast meanwhile (/metrics is rendered off the event loop).
TEST_F(Hardening, UniqueUnauthenticatedPathsDoNotGrowMetricsOrMemory) {
    so_.api_key = "k";
    start();
    const int probe = connect_client();
    send_all(probe, get("/metrics"));
    const std::string before = read_until(probe, "osprey_model_info");
    const size_t rss_before = rss_bytes();

    std::atomic<bool> flooding{true};
    double worst_health = 0;
    std::thread health([&] {
        while (flooding) {
            worst_health = std::max(worst_health, health_latency());
            std::this_thread::sleep_for(20ms);
        }
    });
    constexpr int kRequests = 20000, kBatch = 200;
    const std::string pad(2048, 'x');
    const int fd = connect_client();
    for (int b = 0; b < kRequests / kBatch; ++b) {
        std::string batch;
        for (int i = 0; i < kBatch; ++i) batch += get("/v1/" + std::to_string(b * kBatch + i) + pad);
        send_all(fd, batch);
        std::string got;
        int n = 0;
        char tmp[65536];
        while (n < kBatch) {
            const ssize_t r = ::recv(fd, tmp, sizeof tmp, 0);
            ASSERT_GT(r, 0);
            got.append(tmp, size_t(r));
            for (size_t p = got.find("HTTP/1.1 401"); p != std::string::npos; p = got.find("HTTP/1.1 401", p + 1)) ++n;
            if (const size_t last = got.rfind("HTTP/1.1 401"); last != std::string::npos) got.erase(0, last + 1);
        }
    }
    ::close(fd);
    // A scrape while the flood was served, and after: the same labels, the same size.
    send_all(probe, get("/metrics"));
    std::string after = read_until(probe, "osprey_model_info");
    flooding = false;
    health.join();
    ::close(probe);
    const long grew = long(rss_bytes()) - long(rss_before);
    std::printf("/metrics %zu -> %zu bytes; RSS %+ld KiB; slowest /health %.1f ms\n", before.size(), after.size(),
                grew / 1024, worst_health * 1e3);
    EXPECT_NE(after.find("osprey_http_requests_total{route=\"other\",status=\"401\"} 20000"), std::string::npos)
        << after;
    EXPECT_EQ(after.find("/v1/1"), std::string::npos);
    EXPECT_LT(after.size(), before.size() + 200);
    EXPECT_LT(grew, 16l << 20);
    EXPECT_LT(worst_health, 0.5);
}

// Finding 2: connections trickling a byte at a time hold no slot for long, and never keep a
// well-behaved client out, even with the connection table full.
TEST_F(Hardening, SlowlorisCannotStarveAWellBehavedClient) {
    ho_.max_connections = 48;
    ho_.header_timeout_s = 2;
    start();
    std::vector<int> slow;
    for (int i = 0; i < 48; ++i) {
        slow.push_back(connect_client("127.0.0.2"));
        send_all(slow.back(), "G");
    }
    std::atomic<bool> trickling{true};
    std::thread trickle([&] {
        while (trickling) {  // one byte per connection every 100 ms: never a whole head
            for (int fd : slow) ::send(fd, "E", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            std::this_thread::sleep_for(100ms);
        }
    });
    std::this_thread::sleep_for(300ms);
    double worst = 0;
    for (int i = 0; i < 20; ++i) worst = std::max(worst, health_latency());
    // The trickling ones are cut off by the head deadline (408), counted from their first byte.
    const auto t0 = Clock::now();
    int closed = 0;
    for (int fd : slow) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 4000) > 0 && read_until(fd).find("408") != std::string::npos) ++closed;
    }
    trickling = false;
    trickle.join();
    for (int fd : slow) ::close(fd);
    std::printf("slowest /health %.1f ms; %d of 48 trickling connections closed with 408 after %.1f s\n", worst * 1e3,
                closed, since(t0));
    EXPECT_LT(worst, 1.0);
    EXPECT_GT(closed, 0);
}

TEST_F(Hardening, ConnectionsPerAddressAreLimited) {
    ho_.max_connections_per_ip = 8;
    start();
    std::vector<int> fds;
    for (int i = 0; i < 8; ++i) fds.push_back(connect_client("127.0.0.2"));
    const int ninth = connect_client("127.0.0.2");
    EXPECT_NE(read_until(ninth).find("HTTP/1.1 429"), std::string::npos);
    EXPECT_LT(health_latency(), 1.0);  // another address is not affected
    ::close(ninth);
    ::close(fds.back());
    fds.pop_back();
    std::this_thread::sleep_for(50ms);
    const int again = connect_client("127.0.0.2");  // a slot of the address was freed
    send_all(again, get("/health", "Connection: close\r\n"));
    EXPECT_NE(read_until(again).find("200 OK"), std::string::npos);
    ::close(again);
    for (int fd : fds) ::close(fd);
}

TEST_F(Hardening, BodiesMustArriveAtTheMinimumRate) {
    ho_.header_timeout_s = 1;
    ho_.min_body_rate = 1000;  // 2000 bytes: due 1 + 2 s after the head
    start();
    const int fd = connect_client();
    send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 2000\r\n\r\n");
    const auto t0 = Clock::now();
    std::string got;
    while (since(t0) < 8) {
        if (::send(fd, "x", 1, MSG_NOSIGNAL) <= 0) break;
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 100) > 0) {
            got = read_until(fd);
            break;
        }
    }
    ::close(fd);
    EXPECT_NE(got.find("HTTP/1.1 408"), std::string::npos) << got;
    EXPECT_GT(since(t0), 2.5);
    EXPECT_LT(since(t0), 5.0);
}

// Finding 3: a client that does not read pauses its stream (the engine stops generating for it),
// gives up its batch slot after paused_release_s, and resumes when it reads again.
TEST_F(Hardening, AStreamWhoseClientDoesNotReadIsPausedThenReleased) {
    step_delay_ = 500us;
    eo_.paused_release_s = 0.5;
    ho_.stream_pause_bytes = 32 * 1024;
    start();
    const int fd = connect_client("127.0.0.1", 4096);
    send_all(
        fd, post("/v1/chat/completions",
                 chat_body(R"(, "stream": true, "n": 4, "logprobs": true, "top_logprobs": 20, "max_tokens": 100000)")));
    // Generation stops on its own: the count settles while nothing is read.
    uint64_t last = 0;
    auto settled = Clock::now();
    ASSERT_TRUE(wait_for(
        [&] {
            const uint64_t n = stats().n_generated_tokens;
            if (n != last) last = n, settled = Clock::now();
            return n > 0 && since(settled) > 0.5;
        },
        20));
    EXPECT_GT(stats().n_paused, 0);
    EXPECT_TRUE(wait_for([&] { return stats().n_running == 0; }, 3)) << "the paused request keeps its batch slot";
    EXPECT_EQ(stats().n_waiting, 4);
    const uint64_t paused_at = stats().n_generated_tokens;
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(stats().n_generated_tokens, paused_at);
    std::printf("paused after %llu tokens (of 400000 asked for)\n", static_cast<unsigned long long>(paused_at));
    EXPECT_LT(paused_at, 20000u);
    // Reading resumes it.
    char tmp[65536];
    const auto t0 = Clock::now();
    while (stats().n_generated_tokens < paused_at + 100 && since(t0) < 10) ::recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
    EXPECT_GE(stats().n_generated_tokens, paused_at + 100);
    ::close(fd);
    EXPECT_TRUE(wait_for([&] { return stats().n_running + stats().n_waiting == 0; }, 5));
}

TEST_F(Hardening, AStreamPastTheOutputLimitIsCancelled) {
    ho_.stream_pause_bytes = 4096;
    ho_.max_output_bytes = 4096;  // one step of 16 samples with 20 top logprobs is far more
    start();
    const int fd = connect_client("127.0.0.1", 4096);
    send_all(
        fd,
        post("/v1/chat/completions",
             chat_body(R"(, "stream": true, "n": 16, "logprobs": true, "top_logprobs": 20, "max_tokens": 100000)")));
    EXPECT_TRUE(wait_for([&] { return stats().n_finished == 16; }, 10))
        << "not cancelled: " << stats().n_generated_tokens << " tokens, " << read_until(fd, "data").substr(0, 300);
    EXPECT_TRUE(wait_for([&] { return http_->n_connections() == 0; }, 5));
    ::close(fd);
}

TEST_F(Hardening, OutputNobodyReadsIsDroppedAfterTheWriteTimeout) {
    ho_.write_timeout_s = 1;
    step_delay_ = 200us;
    start();
    const int fd = connect_client("127.0.0.1", 4096);
    send_all(fd, post("/v1/chat/completions",
                      chat_body(R"(, "stream": true, "logprobs": true, "top_logprobs": 20, "max_tokens": 100000)")));
    EXPECT_TRUE(wait_for([&] { return stats().n_finished == 1; }, 8)) << "still generating for nobody";
    EXPECT_TRUE(wait_for([&] { return http_->n_connections() == 0; }, 3));
    ::close(fd);
}

// Finding 4.
TEST_F(Hardening, HalfClosedClientsStillGetTheirAnswers) {
    start();
    int fd = connect_client();
    send_all(fd, get("/health"));
    ::shutdown(fd, SHUT_WR);
    std::string r = read_until(fd);
    EXPECT_NE(r.find("{\"status\":\"ok\"}"), std::string::npos) << r;
    EXPECT_NE(r.find("Connection: close"), std::string::npos) << r;
    ::close(fd);
    fd = connect_client();
    send_all(fd, post("/v1/chat/completions", chat_body(R"(, "stream": true, "max_tokens": 20)")));
    ::shutdown(fd, SHUT_WR);
    r = read_until(fd);
    EXPECT_NE(r.find("data: [DONE]"), std::string::npos) << r;
    EXPECT_NE(r.find("\"finish_reason\":\"length\""), std::string::npos) << r;
    ::close(fd);
}

TEST_F(Hardening, ExpectContinueIsAnswered) {
    ho_.limits.max_body_bytes = 4096;
    start();
    const int fd = connect_client();
    const std::string body = chat_body(R"(, "max_tokens": 3)");
    send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n");
    EXPECT_EQ(read_until(fd, "\r\n\r\n"), "HTTP/1.1 100 Continue\r\n\r\n");
    send_all(fd, body);
    EXPECT_NE(read_until(fd, "}}").find("HTTP/1.1 200"), std::string::npos);
    ::close(fd);
    const int big = connect_client();  // refused before the body is sent
    send_all(big,
             "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n");
    const std::string r = read_until(big);
    EXPECT_EQ(r.rfind("HTTP/1.1 413", 0), 0u) << r;
    ::close(big);
    const int odd = connect_client();
    send_all(odd, "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nExpect: teapot\r\nContent-Length: 2\r\n\r\n");
    EXPECT_EQ(read_until(odd).rfind("HTTP/1.1 417", 0), 0u);
    ::close(odd);
}

TEST_F(Hardening, Http11WithoutHostIsRefused) {
    start();
    const int fd = connect_client();
    send_all(fd, "GET /health HTTP/1.1\r\n\r\n");
    const std::string r = read_until(fd);
    EXPECT_EQ(r.rfind("HTTP/1.1 400", 0), 0u) << r;
    EXPECT_NE(r.find("Host"), std::string::npos) << r;
    ::close(fd);
}

// A client that goes away during a long prefill cancels it within one chunk (streaming: the probe
// sent on EOF draws a reset; non-streaming: the EOF itself).
TEST_F(Hardening, ADisconnectDuringPrefillCancelsWithinAChunk) {
    step_delay_ = 20ms;
    eo_.max_batch_tokens = 64;
    start();
    std::string words;
    for (int i = 0; i < 1500; ++i) words += "word ";
    for (const char* stream : {"true", "false"}) {
        const uint64_t finished = stats().n_finished;
        const uint64_t prefilled = stats().n_prefill_tokens;
        const int fd = connect_client();
        send_all(fd, post("/v1/chat/completions",
                          chat_body(std::string(", \"stream\": ") + stream + ", \"max_tokens\": 5", words)));
        ASSERT_TRUE(wait_for([&] { return stats().n_prefill_tokens > prefilled; }, 5));
        ::close(fd);
        const auto t0 = Clock::now();
        EXPECT_TRUE(wait_for([&] { return stats().n_finished > finished; }, 5));
        const double waited = since(t0);
        const uint64_t chunks = (stats().n_prefill_tokens - prefilled) / 64;
        std::printf("stream=%s: cancelled %.0f ms after the disconnect, after %llu prefill chunks of ~24\n", stream,
                    waited * 1e3, static_cast<unsigned long long>(chunks));
        EXPECT_LT(waited, 0.2);
        EXPECT_LT(chunks, 10u);
    }
}

}  // namespace
}  // namespace osprey::server
