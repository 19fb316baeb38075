// Randomised robustness of the request parsers (untrusted input): mutated HTTP requests and mutated
// chat / completions / responses bodies must parse, ask for more bytes, or fail with a clear error
// (HttpParseError, ApiError, osprey::Error), never crash or throw anything else. Iterations:
// $OSPREY_FUZZ_ITERS (default 3000 per target, a second or two).
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "http/message.h"
#include "server/api_error.h"
#include "server/chat_request.h"

namespace osprey::server {
namespace {

int iterations() {
    const char* env = std::getenv("OSPREY_FUZZ_ITERS");
    return env && *env ? std::atoi(env) : 3000;
}

std::string mutate(std::string s, std::mt19937& rng) {
    const int n_edits = 1 + int(rng() % 4);
    static const char kInteresting[] = "{}[]\",:\\\r\n 0-1e9.nulltruefalse\xff\xc3\x80";
    for (int e = 0; e < n_edits && !s.empty(); ++e) {
        const size_t pos = rng() % s.size();
        switch (rng() % 4) {
            case 0: s.erase(pos, 1 + rng() % 8); break;
            case 1: s.insert(pos, 1, kInteresting[rng() % (sizeof kInteresting - 1)]); break;
            case 2: s[pos] = char(rng() % 256); break;
            case 3: s.insert(pos, s.substr(rng() % s.size(), rng() % 16)); break;
        }
    }
    return s;
}

TEST(RequestFuzz, HttpParserNeverCrashes) {
    std::mt19937 rng(1);
    const std::string seeds[] = {
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\nConnection: keep-alive\r\n\r\n{\"a\":1}",
        "GET /v1/models?x=1 HTTP/1.0\r\nAuthorization: Bearer k\r\n\r\nGET / HTTP/1.1\r\n\r\n",
    };
    http::HttpLimits limits;
    limits.max_body_bytes = 64;
    limits.max_header_bytes = 200;
    for (int i = 0; i < iterations(); ++i) {
        std::string b = mutate(seeds[i % 2], rng);
        std::optional<http::HttpParseError> err;
        for (int k = 0; k < 4; ++k) {
            const size_t before = b.size();
            std::optional<http::HttpRequest> r;
            ASSERT_NO_THROW(r = http::parse_http_request(b, limits, err));
            if (err) {
                EXPECT_GE(err->status, 400);
                EXPECT_FALSE(err->message.empty());
                break;
            }
            if (!r) break;
            EXPECT_LT(b.size(), before);  // a parsed request consumes bytes
            EXPECT_LE(r->body.size(), limits.max_body_bytes);
        }
    }
}

TEST(RequestFuzz, ChatBodiesFailOnlyWithClearErrors) {
    std::mt19937 rng(2);
    const std::string seed = R"({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "reasoning_content": "r", "tool_calls": [{"id": "c", "type": "function",
          "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"x": {"type": "integer", "enum": [1, 2]}}}}}],
      "temperature": 0.5, "top_p": 0.9, "max_tokens": 9, "stop": ["x"], "seed": 3, "logit_bias": {"5": 1},
      "reasoning_effort": "low", "n": 2, "logprobs": true, "top_logprobs": 2})";
    int accepted = 0;
    for (int i = 0; i < iterations(); ++i) {
        const std::string text = mutate(seed, rng);
        try {
            const json::Value body = json::parse(text);
            ChatRequest r = parse_chat_request(body, GenerationLimits{});
            ++accepted;
        } catch (const ApiError& e) {
            EXPECT_GE(e.status, 400);
            EXPECT_FALSE(std::string(e.what()).empty());
        } catch (const Error& e) {
            EXPECT_FALSE(std::string(e.what()).empty());
        } catch (const std::exception& e) {
            ADD_FAILURE() << "unexpected exception type: " << e.what() << " for " << text;
        }
    }
    EXPECT_GT(accepted, 0);  // some mutations stay valid, so the happy path is exercised too
}

}  // namespace
}  // namespace osprey::server
