// OpenAI's error body and the HTTP response for an ApiError (frontend/api_error.h, which the routes
// throw too: request validation throws it naming the field; the routes turn it, and osprey::Error as
// a 400, into a response).
#pragma once

#include <string>

#include "core/json.h"
#include "frontend/api_error.h"
#include "http/message.h"

namespace osprey::server {

using frontend::ApiError;

// {"error": {...}} with null for an empty param or code.
inline json::Value error_body(const std::string& message, const std::string& type, const std::string& param,
                              const std::string& code) {
    json::Value e;
    e.set("message", message);
    e.set("type", type);
    e.set("param", param.empty() ? json::Value() : json::Value(param));
    e.set("code", code.empty() ? json::Value() : json::Value(code));
    json::Value body;
    body.set("error", std::move(e));
    return body;
}

inline http::HttpResponse error_response(const ApiError& e) {
    return http::HttpResponse::json(e.status, error_body(e.what(), e.type, e.param, e.code).dump());
}

// Throws ApiError(400) naming `param` (a field path) with `message` appended: "temperature: must be ...".
[[noreturn]] inline void bad_param(const std::string& param, const std::string& message,
                                   const std::string& code = "invalid_value") {
    throw ApiError(400, param + ": " + message, param, code);
}

}  // namespace osprey::server
