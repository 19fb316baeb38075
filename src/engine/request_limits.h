// What the engine accepts: validate_request() throws osprey::Error naming the first problem.
#pragma once

#include "engine/request.h"

namespace osprey::engine {

struct RequestLimits {
    int vocab_size = 0;
    int max_model_len = 0;  // prompt + max_new_tokens
    int max_n = 16;
    int max_top_logprobs = 20;
};

void validate_request(const Request& request, const RequestLimits& limits);

}  // namespace osprey::engine
