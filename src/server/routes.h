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

http::Reply handle_chat_completions(ServerContext& ctx, const json::Value& body);
http::Reply handle_completions(ServerContext& ctx, const json::Value& body);
http::Reply handle_responses(ServerContext& ctx, const json::Value& body);
http::HttpResponse get_stored_response(ServerContext& ctx, const std::string& id);
http::HttpResponse delete_stored_response(ServerContext& ctx, const std::string& id);

// Throws ApiError(404, model_not_found) unless `model` is the served model.
void check_model(const ServerContext& ctx, const std::string& model);

// OpenAI's per-token logprob object {"token", "logprob", "bytes", "top_logprobs": [...]}.
json::Value token_logprob_json(const tok::Tokenizer& tokenizer, const engine::Event& e);

// "usage" of the chat and completions APIs.
json::Value usage_json(int prompt_tokens, int completion_tokens, int cached_tokens, int reasoning_tokens);

}  // namespace osprey::server
