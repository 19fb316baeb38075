// Multi-token steps through the whole server: the engine with speculative decoding (n-gram lookup,
// and a draft model that proposes the script itself, so every proposal is accepted and each step
// emits up to k + 1 tokens) behind the HTTP server, streaming chat completions over SSE. The
// streamed reasoning, content and tool-call arguments, the finish reason, usage counts, stop
// strings and max_tokens equal those of the same server without speculation; /metrics shows the
// acceptance counters per proposer.
#include <gtest/gtest.h>

#include <thread>

#include "backends/eagle3_proposer.h"
#include "core/json.h"
#include "engine/engine.h"
#include "model/eagle3.h"
#include "model/gpt_oss_ref.h"
#include "model/scripted_runner.h"
#include "model/synthetic.h"
#include "model/test_reference_util.h"
#include "server/openai_server.h"
#include "server_test_util.h"

namespace osprey::server {
namespace {

struct Outcome {
    std::string reasoning, content, tool_name, tool_args, finish_reason;
    int completion_tokens = -1;
    int n_chunks = 0;
};

// One server (scripted backend, optional speculation) for the duration of a scope.
class SpecServer {
public:
    // The scripted backend (tokens by output index, whatever the prompt).
    SpecServer(const std::string& script, engine::SpecMethod method) {
        const auto ids = test::harmony_tokenizer().encode(script, tok::Specials::allowed);
        runner_ = std::make_unique<model::ScriptedRunner>(model::preset_config("tiny"), ids);
        start(method, ids);
    }
    // A real model (the CPU reference on `weights`) with an EAGLE-3 head, which needs the target's
    // hidden states; forced_len >= 0 accepts that many proposals per step (the test mode).
    SpecServer(const model::Weights& weights, const std::filesystem::path& head, int forced_len) {
        runner_ = std::make_unique<model::CpuReference>(weights);
        if (!head.empty()) {
            proposer_ = backends::make_eagle3_proposer(head, *runner_, &weights.embedding);
            forced_len_ = forced_len;
        }
        start(head.empty() ? engine::SpecMethod::none : engine::SpecMethod::eagle3, {});
    }

    void start(engine::SpecMethod method, const std::vector<int32_t>& ids) {
        engine::EngineOptions eo;
        eo.max_kv_tokens = 1 << 16;
        eo.max_model_len = 8192;
        eo.speculative.method = method;
        eo.speculative.num_tokens = 4;
        if (method == engine::SpecMethod::draft) {
            // The draft "model" samples the same script: it proposes exactly what the target emits.
            draft_ = std::make_unique<model::ScriptedRunner>(model::preset_config("tiny"), ids);
            eo.speculative.draft_runner = draft_.get();
        }
        if (method == engine::SpecMethod::eagle3) {
            eo.speculative.custom = proposer_;
            eo.speculative.forced_accept_len = forced_len_;
        }
        engine_ = std::make_unique<engine::Engine>(*runner_, eo);
        engine_->start();
        ServerOptions so;
        so.model_name = "m";
        api_ = std::make_unique<OpenAiServer>(*engine_, test::harmony_tokenizer(), so);
        http::HttpServerOptions ho;
        ho.port = 0;
        ho.error_response = OpenAiServer::transport_error;
        http_ = std::make_unique<http::HttpServer>(ho, [this](const http::HttpRequest& r) { return api_->handle(r); });
        loop_ = std::thread([this] { http_->run(); });
    }
    ~SpecServer() {
        http_->stop();
        loop_.join();
        http_.reset();
        engine_->stop();
    }

    // Sends one request and reads the response to the end (the server closes: Connection: close).
    std::string roundtrip(const std::string& method_path, const std::string& body) {
        const int fd = test::connect_loopback(http_->port());
        std::string req = method_path + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n";
        if (!body.empty())
            req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
        req += "\r\n" + body;
        test::send_all(fd, req);
        std::string out;
        char buf[65536];
        for (;;) {
            const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
            if (n <= 0) break;
            out.append(buf, size_t(n));
        }
        ::close(fd);
        return out;
    }

    Outcome stream_chat(const std::string& extra) {
        const std::string body = R"({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true,
            "stream_options": {"include_usage": true})" + extra + "}";
        const std::string r = roundtrip("POST /v1/chat/completions", body);
        Outcome o;
        // SSE events: "data: {...}\n\n" (inside HTTP chunks; the chunk framing lines hold no "data: ").
        size_t pos = 0;
        while ((pos = r.find("data: {", pos)) != std::string::npos) {
            const size_t end = r.find("\n\n", pos);
            const json::Value v = json::parse(r.substr(pos + 6, end - pos - 6));
            pos = end;
            ++o.n_chunks;
            if (const json::Value* u = v.find("usage"); u && u->is_object())
                o.completion_tokens = int(u->at("completion_tokens").as_int());
            const json::Value* choices = v.find("choices");
            if (!choices || choices->size() == 0) continue;
            const json::Value& c = choices->as_array()[0];
            if (const json::Value* f = c.find("finish_reason"); f && f->is_string()) o.finish_reason = f->as_string();
            const json::Value& d = c.at("delta");
            if (const json::Value* x = d.find("reasoning_content"); x && x->is_string()) o.reasoning += x->as_string();
            if (const json::Value* x = d.find("content"); x && x->is_string()) o.content += x->as_string();
            if (const json::Value* calls = d.find("tool_calls"); calls && calls->is_array())
                for (const json::Value& call : calls->as_array()) {
                    const json::Value& fn = call.at("function");
                    if (const json::Value* n = fn.find("name"); n && n->is_string()) o.tool_name += n->as_string();
                    if (const json::Value* a = fn.find("arguments"); a && a->is_string()) o.tool_args += a->as_string();
                }
        }
        return o;
    }

    engine::EngineStats stats() const { return engine_->stats(); }

private:
    std::unique_ptr<model::ModelRunner> runner_, draft_;
    std::shared_ptr<engine::Proposer> proposer_;
    int forced_len_ = -1;
    std::unique_ptr<engine::Engine> engine_;
    std::unique_ptr<OpenAiServer> api_;
    std::unique_ptr<http::HttpServer> http_;
    std::thread loop_;
};

constexpr const char* kReasoningScript =
    "<|channel|>analysis<|message|>The user says hi. Reply briefly and kindly.<|end|><|start|>assistant"
    "<|channel|>final<|message|>Hi there, friend! How are you doing today?";
constexpr const char* kToolScript =
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
    "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"unit\": \"celsius\"}<|call|>";
constexpr const char* kTools =
    R"(, "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}}}])";

void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
    EXPECT_EQ(a.reasoning, b.reasoning) << what;
    EXPECT_EQ(a.content, b.content) << what;
    EXPECT_EQ(a.tool_name, b.tool_name) << what;
    EXPECT_EQ(a.tool_args, b.tool_args) << what;
    EXPECT_EQ(a.finish_reason, b.finish_reason) << what;
    EXPECT_EQ(a.completion_tokens, b.completion_tokens) << what;
}

TEST(ServerSpeculative, MultiTokenStepsStreamLikeSingleTokenOnes) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"reasoning+content, length", R"(, "max_tokens": 30)"},
        {"reasoning+content, max_tokens 1", R"(, "max_tokens": 1)"},
        {"reasoning+content, max_tokens 23", R"(, "max_tokens": 23)"},
        {"reasoning+content, to the end", R"(, "max_tokens": 200)"},
        {"stop string", R"(, "max_tokens": 200, "stop": ["friend"])"},
        {"stop string across tokens", R"(, "max_tokens": 200, "stop": ["re, fr"])"},
        {"logprobs", R"(, "max_tokens": 40, "logprobs": true, "top_logprobs": 2)"},
    };
    std::vector<Outcome> plain, tool_plain;
    {
        SpecServer s(kReasoningScript, engine::SpecMethod::none);
        for (const auto& [name, extra] : cases) plain.push_back(s.stream_chat(extra));
    }
    {
        SpecServer s(kToolScript, engine::SpecMethod::none);
        tool_plain.push_back(s.stream_chat(std::string(R"(, "max_tokens": 200)") + kTools));
    }
    ASSERT_EQ(plain[0].finish_reason, "length");
    ASSERT_FALSE(plain[0].reasoning.empty());
    ASSERT_FALSE(plain[3].content.empty());
    EXPECT_EQ(plain[4].finish_reason, "stop");
    EXPECT_EQ(tool_plain[0].tool_name, "get_weather");
    EXPECT_EQ(tool_plain[0].finish_reason, "tool_calls");

    for (engine::SpecMethod m : {engine::SpecMethod::ngram, engine::SpecMethod::draft}) {
        const std::string label = engine::spec_method_name(m);
        {
            SpecServer s(kReasoningScript, m);
            for (size_t i = 0; i < cases.size(); ++i)
                expect_same(s.stream_chat(cases[i].second), plain[i], label + ": " + cases[i].first);
            const engine::EngineStats st = s.stats();
            EXPECT_GT(st.n_spec_verifies, 0u) << label;
            if (m == engine::SpecMethod::draft) {
                EXPECT_EQ(st.n_spec_accepted_tokens, st.n_spec_draft_tokens) << "the draft proposes the script";
                EXPECT_GT(st.n_spec_accepted_tokens, 2 * st.n_spec_verifies) << "several tokens per step";
            }
            const std::string metrics = s.roundtrip("GET /metrics", "");
            EXPECT_NE(metrics.find("osprey_spec_decode_num_accepted_tokens_total{proposer=\"" + label + "\"}"),
                      std::string::npos)
                << metrics;
            EXPECT_NE(metrics.find("osprey_spec_decode_mean_accepted_length{proposer=\"" + label + "\"}"),
                      std::string::npos);
        }
        {
            SpecServer s(kToolScript, m);
            expect_same(s.stream_chat(std::string(R"(, "max_tokens": 200)") + kTools), tool_plain[0],
                        label + ": tool call");
        }
    }
}

// EAGLE-3 through the server on the real tiny model. A random head is exact but almost never right,
// so (1) without forcing, the streamed reply equals the one without speculation; (2) with the forced
// test mode accepting all 4 proposals, every step emits 5 tokens: the stream is consistent (its
// deltas add up to the non-streamed reply of the same server, usage and max_tokens exact).
TEST(ServerSpeculative, Eagle3OnTheTinyModel) {
    const model::Weights weights =
        model::Weights::load(model::test::synthetic_checkpoint("server-spec-tiny", model::preset_config("tiny"), 3));
    const std::filesystem::path head =
        std::filesystem::temp_directory_path() / ("osprey-server-eagle3-" + std::to_string(::getpid()));
    model::write_synthetic_eagle3(model::preset_config("tiny"), head, 4);
    const std::string extra = R"(, "max_tokens": 23, "temperature": 0)";
    Outcome plain;
    {
        SpecServer s(weights, {}, -1);
        plain = s.stream_chat(extra);
    }
    ASSERT_EQ(plain.completion_tokens, 23);
    {
        SpecServer s(weights, head, -1);
        expect_same(s.stream_chat(extra), plain, "eagle3");
        EXPECT_GT(s.stats().n_spec_verifies, 0u);
    }
    {
        SpecServer s(weights, head, 4);
        const Outcome streamed = s.stream_chat(extra);
        EXPECT_EQ(streamed.completion_tokens, 23) << "max_tokens is never overshot";
        EXPECT_EQ(streamed.finish_reason, "length");
        const engine::EngineStats st = s.stats();
        EXPECT_EQ(st.n_spec_accepted_tokens, st.n_spec_draft_tokens) << "the forced mode accepts every proposal";
        EXPECT_GT(st.n_spec_accepted_tokens, 2 * st.n_spec_verifies) << "several tokens per step";
        // The same request without streaming, on the same (deterministic) server.
        const std::string r = s.roundtrip("POST /v1/chat/completions",
                                          R"({"model": "m", "messages": [{"role": "user", "content": "hi"}])" + extra + "}");
        const size_t body = r.find("\r\n\r\n");
        ASSERT_NE(body, std::string::npos);
        const json::Value v = json::parse(r.substr(body + 4));
        const json::Value& msg = v.at("choices").as_array()[0].at("message");
        const json::Value* content = msg.find("content");
        const json::Value* reasoning = msg.find("reasoning_content");
        EXPECT_EQ(streamed.content, content && content->is_string() ? content->as_string() : "");
        EXPECT_EQ(streamed.reasoning, reasoning && reasoning->is_string() ? reasoning->as_string() : "");
        EXPECT_EQ(v.at("usage").at("completion_tokens").as_int(), 23);
    }
    std::error_code ec;
    std::filesystem::remove_all(head, ec);
}

}  // namespace
}  // namespace osprey::server
