// The fuzz targets (see fuzz_targets.h).
#include "fuzz/fuzz_targets.h"

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "core/check.h"
#include "core/json.h"
#include "frontend/harmony_prompt.h"
#include "harmony/render.h"
#include "http/message.h"
#include "server/api_error.h"
#include "server/chat_request.h"
#include "tokenizer/tokenizer.h"

namespace osprey::fuzz {

namespace {

[[noreturn]] void fail(const char* what, std::string_view detail = {}) {
    std::fprintf(stderr, "fuzz contract broken: %s %.*s\n", what, int(detail.size()), detail.data());
    std::abort();
}

const tok::Tokenizer& tokenizer() {
    static const tok::Tokenizer t = [] {
        const char* env = std::getenv("OSPREY_TIKTOKEN_FILE");
        return tok::Tokenizer::from_tiktoken_file(
            env && *env ? env : std::string(OSPREY_SHARED_DIR) + "/data/o200k_base.tiktoken");
    }();
    return t;
}

}  // namespace

int http_request(const uint8_t* data, size_t size) {
    http::HttpLimits limits;
    limits.max_header_bytes = 4096;
    limits.max_body_bytes = 8192;
    std::string buffer(reinterpret_cast<const char*>(data), size);
    // Pipelined: parse requests off the front until the bytes run out or are refused.
    for (int i = 0; i < 64; ++i) {
        std::optional<http::HttpParseError> err;
        http::HttpParseProgress progress;
        const size_t before = buffer.size();
        std::optional<http::HttpRequest> r = http::parse_http_request(buffer, limits, err, &progress);
        if (err) {
            const int s = err->status;
            if (s != 400 && s != 413 && s != 417 && s != 431 && s != 501 && s != 505) fail("unexpected status");
            if (err->message.empty()) fail("empty error message");
            return 0;
        }
        if (!r) {
            if (buffer.size() != before) fail("incomplete request consumed bytes");
            if (progress.head_complete && progress.content_length > limits.max_body_bytes) fail("body over the limit");
            return 0;
        }
        if (buffer.size() >= before) fail("request consumed nothing");
        if (r->body.size() > limits.max_body_bytes) fail("body over the limit");
        if (r->target.empty() || r->method.empty()) fail("empty method or target");
        if (r->minor_version == 1 && !r->header("host")) fail("HTTP/1.1 request without Host");
        if (r->path.size() > r->target.size()) fail("path longer than the target");
    }
    return 0;
}

int json_document(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    json::Value v;
    try {
        v = json::parse(text);
    } catch (const Error&) {
        return 0;
    }
    // Accepted: it serialises to JSON that parses back to the same value, compact and indented.
    const std::string compact = v.dump();
    try {
        if (!(json::parse(compact) == v)) fail("dump/parse round trip differs:", compact.substr(0, 200));
        if (!(json::parse(v.dump(2)) == v)) fail("indented round trip differs");
    } catch (const Error& e) {
        fail("own output does not parse:", e.what());
    }
    return 0;
}

int chat_request(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const json::Value body = json::parse(text);
        server::ChatRequest r = server::parse_chat_request(body, server::GenerationLimits{});
        std::vector<int32_t> prompt = harmony::render_for_completion(r.conversation).tokens(tokenizer());
        const std::vector<int32_t> forced = frontend::forced_call_tokens(tokenizer(), r.forced);
        prompt.insert(prompt.end(), forced.begin(), forced.end());
        if (prompt.empty()) fail("empty prompt");
        for (int32_t t : prompt)
            if (t < 0 || t >= int32_t(tokenizer().vocab_size())) fail("token outside the vocabulary");
    } catch (const server::ApiError& e) {
        if (e.status < 400 || e.status >= 500) fail("ApiError with a non-4xx status:", e.what());
    } catch (const Error&) {
        // a clean refusal (bad JSON, a conversation that does not render)
    }
    return 0;
}

std::vector<std::string> http_seeds() {
    return {
        "GET /health HTTP/1.1\r\nHost: a\r\n\r\n",
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\nConnection: keep-alive\r\n\r\n{\"a\":1}",
        "GET /v1/models?x=1 HTTP/1.0\r\nAuthorization: Bearer k\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n",
        "POST /x HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\nabcd",
        "\r\n\r\nOPTIONS * HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
    };
}

std::vector<std::string> json_seeds() {
    return {
        R"({"a": [1, -2.5e3, true, false, null, "x\u00e9\ud83d\ude00"], "b": {"c": {}}, "d": 18446744073709551615})",
        R"([[[[]]], "\"\\\/\b\f\n\r\t", 0.1, 1E400, -0, 9223372036854775807, -9223372036854775808])",
        "\"\xc3\xa9\"",
    };
}

std::vector<std::string> chat_seeds() {
    return {
        R"({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi <|start|>"}]},
        {"role": "assistant", "reasoning_content": "r", "tool_calls": [{"id": "c", "type": "function",
          "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"x": {"type": "integer", "enum": [1, 2], "default": 18446744073709551615}}}}}],
      "tool_choice": "required", "temperature": 0.5, "top_p": 0.9, "max_tokens": 9, "stop": ["x"], "seed": 3,
      "logit_bias": {"5": 1}, "reasoning_effort": "low", "n": 2, "logprobs": true, "top_logprobs": 2})",
        R"({"model": "m", "messages": [{"role": "developer", "content": "d"}, {"role": "user", "content": "q"}],
      "tools": [{"type": "function", "function": {"name": "g", "description": "x", "parameters": {"type": "object",
        "properties": {"y": {"oneOf": [{"type": "string"}, {"type": "number", "default": 1.5}]}}}}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}, "response_format": {"type": "json_object"}})",
    };
}

}  // namespace osprey::fuzz
