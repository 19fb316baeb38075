// Errors of the OpenAI-compatible API: an HTTP status plus the fields of OpenAI's error body
// {"error": {"message", "type", "param", "code"}}. The front end throws it for requests the engine
// cannot take (a prompt that does not render or fit, a full queue); the routes throw it for invalid
// fields and turn it (and osprey::Error, as a 400) into a response.
#pragma once

#include <string>

#include "core/check.h"

namespace osprey::frontend {

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

}  // namespace osprey::frontend
