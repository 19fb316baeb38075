// The OpenAI-compatible routes, one file each: chat_completions.cpp, completions.cpp,
// responses.cpp. Each parses and validates its body (ApiError on a bad field), submits to the
// engine and returns a job that streams (SSE) or answers once finished.
#pragma once

#include <string>

#include "core/json.h"
#include "engine/request.h"
#include "http/server.h"
#include "server/server_context.h"

namespace osprey::server {

// What the route sees of the request besides its body, and what it says back to the router.
struct RequestInfo {
    // In: the X-Request-Id header (empty when none). Out: the request id in effect (the header's,
    // else the body's "request_id", else the response's own id), echoed as X-Request-Id.
    std::string request_id;
};

http::Reply handle_chat_completions(ServerContext& ctx, const json::Value& body, RequestInfo& info);
http::Reply handle_completions(ServerContext& ctx, const json::Value& body, RequestInfo& info);
http::Reply handle_responses(ServerContext& ctx, const json::Value& body, RequestInfo& info);
// POST /tokenize and /detokenize (vLLM's shape).
http::HttpResponse handle_tokenize(ServerContext& ctx, const json::Value& body);
http::HttpResponse handle_detokenize(ServerContext& ctx, const json::Value& body);
http::HttpResponse get_stored_response(ServerContext& ctx, const std::string& id);
// GET /v1/responses/{id}/input_items: the stored response's input, as items (newest last).
http::HttpResponse get_response_input_items(ServerContext& ctx, const std::string& id, const std::string& query);
http::HttpResponse delete_stored_response(ServerContext& ctx, const std::string& id);

// The id of a request's response: prefix + the client's request id when it gave one, else a new id.
std::string response_id(ServerContext& ctx, const char* prefix, const std::string& request_id);

// Throws ApiError(404, model_not_found) unless `model` is one of the served model's names.
void check_model(const ServerContext& ctx, const std::string& model);

// OpenAI's per-token logprob object {"token", "logprob", "bytes", "top_logprobs": [...]}.
json::Value token_logprob_json(const tok::Tokenizer& tokenizer, const engine::Event& e);

// "usage" of the chat and completions APIs.
json::Value usage_json(int prompt_tokens, int completion_tokens, int cached_tokens, int reasoning_tokens);

}  // namespace osprey::server
