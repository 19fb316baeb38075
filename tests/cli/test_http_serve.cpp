// The HTTP client, the SSE parser and the load generator, against an in-process fake streaming
// server on a loopback port (reasoning deltas first, as a Harmony model's analysis channel).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "benchtool/http_client.h"
#include "benchtool/serve_bench.h"
#include "core/check.h"
#include "core/json.h"
#include "fake_sse_server.h"

namespace osprey::benchtool {
namespace {

TEST(Url, ParsesHostPortAndPrefix) {
    Url u = parse_url("http://127.0.0.1:8000");
    EXPECT_EQ(u.host, "127.0.0.1");
    EXPECT_EQ(u.port, 8000);
    EXPECT_EQ(u.base_path, "");
    u = parse_url("http://example.org/proxy/");
    EXPECT_EQ(u.port, 80);
    EXPECT_EQ(u.base_path, "/proxy");
    u = parse_url("http://[::1]:9000");
    EXPECT_EQ(u.host, "::1");
    EXPECT_EQ(u.port, 9000);
    EXPECT_THROW(parse_url("https://x"), Error);
    EXPECT_THROW(parse_url("http://:80"), Error);
    EXPECT_THROW(parse_url("http://h:0"), Error);
    EXPECT_THROW(parse_url("http://h:99999"), Error);
    EXPECT_THROW(parse_url("http://h:8x"), Error);
    EXPECT_THROW(parse_url("http://[::1"), Error);
}

TEST(Sse, EventsSurviveAnySplitAndLineEnding) {
    const std::string stream =
        ": comment\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: line1\ndata: line2\n\ndata:[DONE]\r\rdata: tail";
    for (size_t split = 0; split <= stream.size(); ++split) {
        std::vector<std::string> events;
        SseParser p([&](const std::string& d) { events.push_back(d); });
        p.feed(std::string_view(stream).substr(0, split));
        p.feed(std::string_view(stream).substr(split));
        p.finish();
        ASSERT_EQ(events.size(), 4u) << "split at " << split;
        EXPECT_EQ(events[0], "{\"a\":1}");
        EXPECT_EQ(events[1], "line1\nline2");
        EXPECT_EQ(events[2], "[DONE]");
        EXPECT_EQ(events[3], "tail");
    }
}

TEST(Http, ReadsContentLengthAndChunkedBodies) {
    test::FakeSseServer server({.n_reasoning = 1, .n_content = 1, .delay_ms = 0});
    const Url url = parse_url(server.url());
    const HttpResponse models = http_request(url, "GET", "/v1/models", {}, "");
    EXPECT_EQ(models.status, 200);
    EXPECT_EQ(models.header("Content-Type"), "application/json");
    EXPECT_EQ(json::parse(models.body).at("data").as_array()[0].at("id").as_string(), "fake-model");
    std::string streamed;
    const HttpResponse chat = http_request(url, "POST", "/v1/chat/completions", {{"Content-Type", "application/json"}},
                                           "{}", [&](std::string_view b) { streamed.append(b); });
    EXPECT_EQ(chat.status, 200);
    EXPECT_TRUE(chat.body.empty());
    EXPECT_NE(streamed.find("think0"), std::string::npos);
    EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos);
    EXPECT_EQ(streamed.find("\r\n0\r\n"), std::string::npos);  // chunk framing removed
    EXPECT_THROW(http_request(url, "GET", "/", {{"Bad\r\nHeader", "x"}}, ""), Error);
}

TEST(Http, ConnectionRefusedIsAClearError) {
    int port = 0;
    {
        test::FakeSseServer s({});
        port = s.port();
    }  // closed: nothing listens there now
    try {
        http_request(parse_url("http://127.0.0.1:" + std::to_string(port)), "GET", "/", {}, "", nullptr, 2);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cannot connect"), std::string::npos) << e.what();
    }
}

ServeOptions fake_options(const test::FakeSseServer& s) {
    ServeOptions o;
    o.url = s.url();
    o.concurrencies = {1, 3};
    o.requests_per_level = 3;
    o.input_len = 12;
    o.output_len = 16;
    o.len_sigma = 0;
    return o;
}

TEST(ServeBench, ReasoningCountsAsTheFirstTokenAndUsageGivesTokenCounts) {
    test::FakeSseServer server({.n_reasoning = 3, .n_content = 4, .delay_ms = 20});
    const auto levels = run_serve(fake_options(server), nullptr);
    ASSERT_EQ(levels.size(), 2u);
    for (const ServeLevel& L : levels) {
        EXPECT_EQ(L.n_ok, 3) << L.first_error;
        EXPECT_EQ(L.n_failed, 0);
        EXPECT_TRUE(L.usage_reported);
        EXPECT_DOUBLE_EQ(L.mean_output_tokens, 7);  // 3 reasoning + 4 content (server usage)
        EXPECT_DOUBLE_EQ(L.mean_input_tokens, 11);
        // The first text is the first reasoning delta, one 20 ms delay after the start, and 6 more
        // delays follow it: E2E - TTFT >= 120 ms, so TPOT >= 20 ms. (Were TTFT taken at the first
        // content delta, only 3 delays would follow it: TPOT ~ 10 ms.) Lower bounds only, since the
        // server's sleeps guarantee them on any machine.
        EXPECT_GE(L.ttft_s.min, 0.019);
        EXPECT_GE(L.tpot_s.min, 0.019);
        EXPECT_GE(L.e2e_s.min, 0.139);
        EXPECT_EQ(L.itl_s.n, 3 * 6);  // 6 gaps between 7 text deltas, 3 requests
        EXPECT_EQ(L.tpot_s.n, 3);
    }
    EXPECT_EQ(levels[1].concurrency, 3);
    // 1 models request + 6 chat requests; the body asks for a stream with usage and never for ignore_eos.
    EXPECT_EQ(server.requests_seen(), 7);
    // /metrics was asked before and after each level; a server without it (404) leaves no counters.
    EXPECT_EQ(server.metrics_requests_seen(), 4);
    for (const ServeLevel& L : levels) EXPECT_TRUE(L.server_counters.empty());
    const json::Value body = json::parse(server.last_body());
    EXPECT_EQ(body.at("model").as_string(), "fake-model");
    EXPECT_TRUE(body.at("stream").as_bool());
    EXPECT_TRUE(body.at("stream_options").at("include_usage").as_bool());
    EXPECT_EQ(body.at("max_tokens").as_int(), 16);
    EXPECT_EQ(body.find("ignore_eos"), nullptr);
    EXPECT_EQ(body.at("messages").as_array()[0].at("content").as_string().size() > 12, true);
}

TEST(ServeBench, CountersAreParsedFromPrometheusText) {
    const std::string text =
        "# HELP osprey_prefix_cache_hits_total Prompt tokens found in the prefix cache.\n"
        "# TYPE osprey_prefix_cache_hits_total counter\n"
        "osprey_prefix_cache_hits_total 1536\n"
        "my_osprey_window_restores_total 99\n"  // another metric whose name ends the same
        "osprey_window_restores_total 7\n"
        "osprey_num_preemptions_total 0";
    const auto c = parse_counters(text, kServeCounterNames);
    ASSERT_EQ(c.size(), 3u);  // osprey_forked_prompt_tokens_total is absent
    EXPECT_EQ(c[0], std::make_pair(std::string("osprey_prefix_cache_hits_total"), 1536.0));
    EXPECT_EQ(c[1], std::make_pair(std::string("osprey_window_restores_total"), 7.0));
    EXPECT_EQ(c[2], std::make_pair(std::string("osprey_num_preemptions_total"), 0.0));
    EXPECT_TRUE(parse_counters("", kServeCounterNames).empty());
}

TEST(ServeBench, ReasoningFieldAndClientSideCountsWithoutUsage) {
    test::FakeSseServer server({.n_reasoning = 2, .n_content = 2, .delay_ms = 5, .reasoning_field = "reasoning",
                                .send_usage = false});
    ServeOptions o = fake_options(server);
    o.concurrencies = {2};
    o.request_rate = 50;  // Poisson arrivals
    const auto levels = run_serve(o, nullptr);
    ASSERT_EQ(levels.size(), 1u);
    EXPECT_EQ(levels[0].n_ok, 3);
    EXPECT_FALSE(levels[0].usage_reported);
    EXPECT_DOUBLE_EQ(levels[0].mean_output_tokens, 4);  // text-carrying deltas
    EXPECT_EQ(levels[0].to_json().at("token_counts").as_string(), "client count");
}

TEST(ServeBench, ServerErrorsAreCountedWithTheFirstMessage) {
    test::FakeSseServer server({.status = 503});
    ServeOptions o = fake_options(server);
    o.concurrencies = {2};
    const auto levels = run_serve(o, nullptr);
    EXPECT_EQ(levels[0].n_ok, 0);
    EXPECT_EQ(levels[0].n_failed, 3);
    EXPECT_EQ(levels[0].first_error.rfind("HTTP 503: ", 0), 0u) << levels[0].first_error;
    EXPECT_NE(levels[0].first_error.find("overloaded"), std::string::npos) << levels[0].first_error;
    EXPECT_EQ(levels[0].to_json().at("first_error").as_string(), levels[0].first_error);
}

TEST(ServeBench, RejectsBadOptions) {
    test::FakeSseServer server({});
    ServeOptions o = fake_options(server);
    o.concurrencies = {0};
    EXPECT_THROW(run_serve(o, nullptr), Error);
    o = fake_options(server);
    o.len_sigma = -1;
    EXPECT_THROW(run_serve(o, nullptr), Error);
    o = fake_options(server);
    o.url = "ftp://x";
    EXPECT_THROW(run_serve(o, nullptr), Error);
}

}  // namespace
}  // namespace osprey::benchtool
