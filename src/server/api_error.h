// Errors of the OpenAI-compatible API: an HTTP status plus the fields of OpenAI's error body
// {"error": {"message", "type", "param", "code"}}. Request validation throws ApiError; the routes
// turn it (and osprey::Error, as a 400) into a response.
#pragma once

#include <string>

#include "core/check.h"
#include "core/json.h"
#include "http/message.h"

namespace osprey::server {

struct ApiError : Error {
    int status = 400;
    std::string type = "invalid_request_error";
    std::string param;  // the offending field ("messages[1].content"), empty when none
    std::string code;   // machine-readable ("invalid_type", "context_length_exceeded"), may be empty

    ApiError(int status, std::string message, std::string param = {}, std::string code = {})
        : Error(message), status(status), param(std::move(param)), code(std::move(code)) {
        if (status == 401) type = "authentication_error";
        else if (status == 404) type = "not_found_error";
        else if (status == 429) type = "rate_limit_error";
        else if (status >= 500) type = "server_error";
    }
};

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
