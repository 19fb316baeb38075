// OpenAI sampling parameters -> the engine's: temperature, top_p, max_tokens /
// max_completion_tokens / max_output_tokens, stop, seed, n, logprobs / top_logprobs, presence /
// frequency penalties, logit_bias; extensions top_k, min_p, repetition_penalty (as in vLLM).
// Wrong types and ranges throw ApiError naming the field. Tests: tests/server/test_chat_request.cpp.
#pragma once

#include "frontend/generation_params.h"
#include "server/json_fields.h"

namespace osprey::server {

struct GenerationLimits {
    int max_n = 16;
    int max_top_logprobs = 20;
    int vocab_size = 201088;
};

// Reads every sampling-related member of `f` that `api` knows (marking them used).
frontend::GenerationParams parse_generation_params(Fields& f, frontend::Api api, const GenerationLimits& limits);

}  // namespace osprey::server
