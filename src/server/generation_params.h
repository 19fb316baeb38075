// OpenAI sampling parameters -> the engine's: temperature, top_p, max_tokens /
// max_completion_tokens / max_output_tokens, stop, seed, n, logprobs / top_logprobs, presence /
// frequency penalties, logit_bias; extensions top_k, min_p, repetition_penalty (as in vLLM).
// Wrong types and ranges throw ApiError naming the field. Tests: tests/server/test_generation_params.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/sampling.h"
#include "server/json_fields.h"

namespace osprey::server {

// Which API's spelling of the parameters to read.
enum class Api { chat, completions, responses };

struct GenerationParams {
    SamplingParams sampling;          // seed: the request's, else a fresh random one
    std::optional<int> max_tokens;    // absent: as many as the context allows
    std::vector<std::string> stop;    // stop strings (text level; not included in the output)
    int n = 1;
    bool stream = false;
    bool include_usage = false;       // stream_options.include_usage
    bool echo = false;                // completions: prepend the prompt
};

struct GenerationLimits {
    int max_n = 16;
    int max_top_logprobs = 20;
    int vocab_size = 201088;
};

// Reads every sampling-related member of `f` that `api` knows (marking them used).
GenerationParams parse_generation_params(Fields& f, Api api, const GenerationLimits& limits);

// Picks max_new_tokens for a prompt of n_prompt tokens (without a max-tokens field: default_max when
// > 0, else the rest of the context, as vLLM does), or throws ApiError(400, context_length_exceeded)
// naming `prompt_param` or the max-tokens field.
int resolve_max_tokens(const GenerationParams& p, Api api, int n_prompt, int max_model_len,
                       const std::string& prompt_param, int default_max = 0);

}  // namespace osprey::server
