// What a request asks to generate, as the routes read it from OpenAI's parameters: sampling, the
// output limit, stop strings, n, streaming. The front end submits it to the engine;
// resolve_max_tokens fits the output limit to the context.
// Tests: tests/server/test_chat_request.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/sampling.h"
#include "engine/request.h"

namespace osprey::frontend {

// The API a request came through: which spelling of the parameters the routes read, and which
// max-tokens field errors name.
enum class Api { chat, completions, responses };

struct GenerationParams {
    SamplingParams sampling;          // seed: the request's, else a fresh random one
    std::optional<int> max_tokens;    // absent: as many as the context allows
    std::vector<std::string> stop;    // stop strings (text level; not included in the output)
    int n = 1;
    bool stream = false;
    bool include_usage = false;       // stream_options.include_usage
    bool echo = false;                // completions: prepend the prompt
    // vLLM's extras.
    int min_tokens = 0;                   // stop tokens are masked until this many tokens were generated
    std::vector<int32_t> stop_token_ids;  // more tokens that end the output (not shown)
    bool skip_special_tokens = true;      // completions: special tokens add no text (chat: Harmony parses them)
    bool include_stop_str_in_output = false;
    int priority = 0;                     // vLLM's sense: lower runs first (the engine's is the opposite)
    std::string request_id;               // the client's id for the request (body "request_id")
    // Completions prompt scoring: log-probabilities of each prompt token given the ones before it,
    // with this many alternatives (-1: off). Set by echo + logprobs, or by prompt_logprobs.
    int prompt_logprobs = -1;
};

// Copies what the engine does with the request (sampling, n, min_tokens, priority, prompt scoring,
// the client's stop tokens added to `request.stop_token_ids`).
void apply_to_request(const GenerationParams& p, engine::Request& request);

// Picks max_new_tokens for a prompt of n_prompt tokens (without a max-tokens field: default_max when
// > 0, else the rest of the context, as vLLM does), or throws ApiError(400, context_length_exceeded)
// naming `prompt_param` or the max-tokens field.
int resolve_max_tokens(const GenerationParams& p, Api api, int n_prompt, int max_model_len,
                       const std::string& prompt_param, int default_max = 0);

}  // namespace osprey::frontend
