// The whole server in-process (HttpServer + OpenAiServer + Engine over the scripted backend) driven
// through raw sockets: keep-alive, pipelining, chunked SSE, many idle connections on one thread,
// disconnects cancelling generation, and bad requests that leave other clients untouched.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "engine/engine.h"
#include "model/scripted_runner.h"
#include "model/synthetic.h"
#include "server/openai_server.h"
#include "server_test_util.h"

namespace osprey::server {
namespace {

using namespace std::chrono_literals;

class ServerE2E : public ::testing::Test {
protected:
    void SetUp() override {
        // No stop token in the script: past its end the runner repeats the last token until max_tokens.
        const auto ids = test::harmony_tokenizer().encode("<|channel|>final<|message|>Hi there, friend", tok::Specials::allowed);
        runner_ = std::make_unique<model::ScriptedRunner>(model::preset_config("tiny"), ids);
        engine::EngineOptions eo;
        eo.max_kv_tokens = 1 << 20;
        eo.max_model_len = 131072;
        engine_ = std::make_unique<engine::Engine>(*runner_, eo);
        engine_->start();
        ServerOptions so;
        so.model_name = "m";
        api_ = std::make_unique<OpenAiServer>(*engine_, test::harmony_tokenizer(), so);
        http::HttpServerOptions ho;
        ho.port = 0;
        ho.limits.max_body_bytes = 4096;
        ho.error_response = OpenAiServer::transport_error;
        http_ = std::make_unique<http::HttpServer>(ho, [this](const http::HttpRequest& r) { return api_->handle(r); });
        loop_ = std::thread([this] { http_->run(); });
    }
    void TearDown() override {
        http_->stop();
        loop_.join();
        http_.reset();
        engine_->stop();
    }

    int connect_client() { return test::connect_loopback(http_->port()); }
    static void send_all(int fd, const std::string& s) { test::send_all(fd, s); }
    // Reads one whole response (Content-Length or chunked) from `buffer` + the socket.
    static std::string read_response(int fd, std::string& buffer) {
        for (;;) {
            const size_t head = buffer.find("\r\n\r\n");
            if (head != std::string::npos) {
                const std::string h = buffer.substr(0, head);
                const size_t cl = h.find("Content-Length: ");
                if (cl != std::string::npos) {
                    const size_t n = std::stoul(h.substr(cl + 16));
                    if (buffer.size() >= head + 4 + n) {
                        std::string r = buffer.substr(0, head + 4 + n);
                        buffer.erase(0, head + 4 + n);
                        return r;
                    }
                } else if (const size_t end = buffer.find("\r\n0\r\n\r\n", head); end != std::string::npos) {
                    std::string r = buffer.substr(0, end + 7);
                    buffer.erase(0, end + 7);
                    return r;
                }
            }
            char tmp[65536];
            const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
            if (n <= 0) return "EOF:" + buffer;
            buffer.append(tmp, size_t(n));
        }
    }
    static std::string post(const std::string& path, const std::string& body) {
        return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body;
    }
    static std::string chat(int max_tokens, bool stream) {
        return post("/v1/chat/completions", R"({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": )" +
                                                std::to_string(max_tokens) + (stream ? ", \"stream\": true}" : "}"));
    }

    std::unique_ptr<model::ScriptedRunner> runner_;
    std::unique_ptr<engine::Engine> engine_;
    std::unique_ptr<OpenAiServer> api_;
    std::unique_ptr<http::HttpServer> http_;
    std::thread loop_;
};

TEST_F(ServerE2E, KeepAliveAndPipelining) {
    const int fd = connect_client();
    std::string buffer;
    send_all(fd, "GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
    EXPECT_NE(read_response(fd, buffer).find("{\"status\":\"ok\"}"), std::string::npos);
    send_all(fd, chat(6, false));
    const std::string r = read_response(fd, buffer);
    EXPECT_NE(r.find("HTTP/1.1 200 OK"), std::string::npos) << r;
    EXPECT_NE(r.find("\"content\":\"Hi there,\""), std::string::npos) << r;
    EXPECT_NE(r.find("\"finish_reason\":\"length\""), std::string::npos) << r;
    // Three requests in one write: answered in order, the generation in the middle included.
    send_all(fd, "GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n" + chat(3, false) + "GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
    EXPECT_NE(read_response(fd, buffer).find("\"object\":\"list\""), std::string::npos);
    EXPECT_NE(read_response(fd, buffer).find("chat.completion"), std::string::npos);
    EXPECT_NE(read_response(fd, buffer).find("\"status\":\"ok\""), std::string::npos);
    ::close(fd);
}

TEST_F(ServerE2E, StreamingIsChunkedServerSentEvents) {
    const int fd = connect_client();
    std::string buffer;
    send_all(fd, chat(8, true));
    const std::string r = read_response(fd, buffer);
    EXPECT_NE(r.find("Transfer-Encoding: chunked"), std::string::npos) << r;
    EXPECT_NE(r.find("Content-Type: text/event-stream"), std::string::npos);
    EXPECT_NE(r.find("data: {\"id\":\"chatcmpl-"), std::string::npos);
    EXPECT_NE(r.find("\"finish_reason\":\"length\""), std::string::npos);
    EXPECT_NE(r.find("data: [DONE]\n\n"), std::string::npos);
    // The connection stays usable after the stream.
    send_all(fd, "GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
    EXPECT_NE(read_response(fd, buffer).find("\"status\":\"ok\""), std::string::npos);
    ::close(fd);
}

TEST_F(ServerE2E, DisconnectCancelsTheGeneration) {
    runner_->set_step_delay(2ms);  // 130000 tokens would take minutes
    const int fd = connect_client();
    send_all(fd, chat(130000, true));
    std::string got;
    while (got.find("data: ", got.find("data: ", got.find("data: ") + 1) + 1) == std::string::npos) {
        char tmp[4096];
        const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
        ASSERT_GT(n, 0);
        got.append(tmp, size_t(n));  // until tokens are streaming
    }
    const uint64_t finished_before = engine_->stats().n_finished;
    ::close(fd);
    const auto t0 = std::chrono::steady_clock::now();
    while (engine_->stats().n_finished == finished_before && std::chrono::steady_clock::now() - t0 < 5s)
        std::this_thread::sleep_for(1ms);
    const engine::EngineStats s = engine_->stats();
    EXPECT_EQ(s.n_finished, finished_before + 1);  // ended (aborted), long before its 130000 tokens
    EXPECT_EQ(s.n_running + s.n_waiting, 0);
    EXPECT_LT(s.n_generated_tokens, 2000u);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(waited, 1.0);
    std::printf("cancelled %.1f ms after the disconnect, %llu tokens generated\n", waited * 1e3,
                static_cast<unsigned long long>(s.n_generated_tokens));
}

// Graceful shutdown (issue 15): drain() lets a short request finish, answers /health and new
// generations with 503 while draining, and at the deadline ends each stream still running with an
// error event and [DONE] (responses API too), a non-streaming request with a 503; run() returns.
TEST_F(ServerE2E, DrainFinishesShortRequestsAndEndsLongStreamsCleanly) {
    runner_->set_step_delay(2ms);
    const int chat_fd = connect_client(), responses_fd = connect_client(), plain_fd = connect_client(),
              short_fd = connect_client(), probe_fd = connect_client();
    send_all(chat_fd, chat(130000, true));
    send_all(responses_fd, post("/v1/responses", R"({"model": "m", "input": "hi", "stream": true, "max_output_tokens": 130000})"));
    send_all(plain_fd, chat(130000, false));
    std::string started[2];  // what the streams sent before the drain (they have started)
    for (int i = 0; i < 2; ++i) {
        char tmp[4096];
        const ssize_t n = ::recv(i == 0 ? chat_fd : responses_fd, tmp, sizeof tmp, 0);
        ASSERT_GT(n, 0);
        started[i].assign(tmp, size_t(n));
    }
    send_all(short_fd, chat(100, false));  // ~0.2 s at 2 ms a step: it ends within the timeout
    std::this_thread::sleep_for(50ms);
    api_->context().draining = true;
    http_->drain(1.0);
    std::string buffer;
    const std::string done_short = read_response(short_fd, buffer);
    EXPECT_NE(done_short.find("HTTP/1.1 200 OK"), std::string::npos) << done_short;
    EXPECT_NE(done_short.find("Connection: close"), std::string::npos);
    buffer.clear();
    send_all(probe_fd, "GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
    const std::string health = read_response(probe_fd, buffer);
    EXPECT_NE(health.find("HTTP/1.1 503"), std::string::npos) << health;
    EXPECT_NE(health.find("{\"status\":\"draining\"}"), std::string::npos);
    for (int i = 0; i < 2; ++i) {
        const std::string r = read_response(i == 0 ? chat_fd : responses_fd, started[i]);
        EXPECT_EQ(r.rfind("EOF:", 0), std::string::npos) << "the stream was cut: " << r.substr(r.size() - 300);
        EXPECT_NE(r.find("\"code\":\"server_shutdown\""), std::string::npos);
        EXPECT_NE(r.find("data: [DONE]\n\n"), std::string::npos);
    }
    std::string b;
    const std::string plain = read_response(plain_fd, b);
    EXPECT_NE(plain.find("HTTP/1.1 503"), std::string::npos) << plain;
    loop_.join();  // run() returned by itself
    loop_ = std::thread([] {});
    for (int fd : {chat_fd, responses_fd, plain_fd, short_fd, probe_fd}) ::close(fd);
}

TEST_F(ServerE2E, ManyIdleConnectionsAndBadClientsDoNotBlockOthers) {
    std::vector<int> idle;
    for (int i = 0; i < 300; ++i) idle.push_back(connect_client());
    const int bad = connect_client();
    send_all(bad, "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n{\"a\":");  // bad JSON
    const int big = connect_client();
    send_all(big, "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 999999\r\n\r\n");
    const int half = connect_client();
    send_all(half, "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{");  // never finished

    const int good = connect_client();
    std::string buffer;
    send_all(good, chat(4, false));
    const std::string r = read_response(good, buffer);
    EXPECT_NE(r.find("HTTP/1.1 200 OK"), std::string::npos) << r;
    std::string b1, b2;
    const std::string bad_reply = read_response(bad, b1);
    EXPECT_NE(bad_reply.find("HTTP/1.1 400"), std::string::npos) << bad_reply;
    EXPECT_NE(bad_reply.find("not valid JSON"), std::string::npos) << bad_reply;
    EXPECT_NE(read_response(big, b2).find("HTTP/1.1 413"), std::string::npos);
    EXPECT_GE(http_->n_connections(), 300u);
    for (int fd : idle) ::close(fd);
    for (int fd : {bad, big, half, good}) ::close(fd);
}

TEST_F(ServerE2E, ErrorsAreOpenAiShaped) {
    const int fd = connect_client();
    std::string buffer;
    send_all(fd, post("/v1/chat/completions", R"({"model": "other", "messages": [{"role": "user", "content": "x"}]})"));
    const std::string r = read_response(fd, buffer);
    EXPECT_NE(r.find("HTTP/1.1 404"), std::string::npos) << r;
    EXPECT_NE(r.find(R"("type":"not_found_error","param":"model","code":"model_not_found")"), std::string::npos) << r;
    send_all(fd, post("/v1/completions", std::string("{\"model\": \"m\", \"prompt\": \"\xc3\x28\"}")));
    EXPECT_NE(read_response(fd, buffer).find("not valid UTF-8"), std::string::npos);
    ::close(fd);
}

// Token-id prompts (/v1/completions) and /detokenize share one validation (json_fields.h
// token_id_array): a bad element is named by its index; an empty prompt is refused, an empty
// /detokenize list is not.
TEST_F(ServerE2E, TokenIdArraysNameTheBadElement) {
    const int fd = connect_client();
    std::string buffer;
    send_all(fd, post("/v1/completions", R"({"model": "m", "prompt": [1, 2, -5], "max_tokens": 1})"));
    std::string r = read_response(fd, buffer);
    EXPECT_NE(r.find("HTTP/1.1 400"), std::string::npos) << r;
    EXPECT_NE(r.find(R"("param":"prompt[2]")"), std::string::npos) << r;
    EXPECT_NE(r.find("outside the vocabulary"), std::string::npos) << r;
    send_all(fd, post("/v1/completions", R"({"model": "m", "prompt": [1, "x"], "max_tokens": 1})"));
    r = read_response(fd, buffer);
    EXPECT_NE(r.find(R"("param":"prompt[1]")"), std::string::npos) << r;
    EXPECT_NE(r.find("a token id (integer)"), std::string::npos) << r;
    send_all(fd, post("/v1/completions", R"({"model": "m", "prompt": [], "max_tokens": 1})"));
    r = read_response(fd, buffer);
    EXPECT_NE(r.find("must not be empty"), std::string::npos) << r;
    send_all(fd, post("/detokenize", R"({"tokens": [3, 1000000000]})"));
    r = read_response(fd, buffer);
    EXPECT_NE(r.find(R"("param":"tokens[1]")"), std::string::npos) << r;
    send_all(fd, post("/detokenize", R"({"tokens": []})"));
    r = read_response(fd, buffer);
    EXPECT_NE(r.find("HTTP/1.1 200"), std::string::npos) << r;
    ::close(fd);
}

// Chat completions and responses submit through the front end's one submit_rendered(); its errors
// still name each API's own fields.
TEST_F(ServerE2E, OutputLimitErrorsNameEachApisField) {
    const int fd = connect_client();
    std::string buffer;
    send_all(fd, chat(200000, false));  // the legacy max_tokens; the error names its successor
    const std::string c = read_response(fd, buffer);
    EXPECT_NE(c.find("HTTP/1.1 400"), std::string::npos) << c;
    EXPECT_NE(c.find("max_completion_tokens asks for 200000 more"), std::string::npos) << c;
    EXPECT_NE(c.find(R"("param":"max_completion_tokens","code":"context_length_exceeded")"), std::string::npos) << c;
    send_all(fd, post("/v1/responses", R"({"model": "m", "input": "hi", "max_output_tokens": 200000})"));
    const std::string r = read_response(fd, buffer);
    EXPECT_NE(r.find("HTTP/1.1 400"), std::string::npos) << r;
    EXPECT_NE(r.find(R"("param":"max_output_tokens","code":"context_length_exceeded")"), std::string::npos) << r;
    ::close(fd);
}

}  // namespace
}  // namespace osprey::server
