// Sampling parameters and results shared by the engine and every backend's sampler.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace osprey {

struct SamplingParams {
    float temperature = 1.0f;  // 0 means greedy
    int top_k = 0;             // 0: off
    float top_p = 1.0f;        // 1: off
    float min_p = 0.0f;        // 0: off
    float repetition_penalty = 1.0f;  // 1: off (HF-style: divides positive logits, multiplies negative)
    float frequency_penalty = 0.0f;   // OpenAI-style, subtracted per occurrence in the output
    float presence_penalty = 0.0f;    // OpenAI-style, subtracted once if present in the output
    std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logit of the token
    uint64_t seed = 0;         // with the step index, fixes the random draw whatever the batch holds
    int top_logprobs = 0;      // also return this many most likely tokens with log-probabilities
    bool logprobs = false;     // return the chosen token's log-probability

    bool is_greedy() const { return temperature <= 0.0f; }
};

// Per-row state the sampler needs besides the logits.
struct SamplingState {
    const int32_t* prompt_tokens = nullptr;  // for the repetition penalty
    int32_t n_prompt_tokens = 0;
    const int32_t* output_tokens = nullptr;  // for all penalties
    int32_t n_output_tokens = 0;
    uint64_t step = 0;  // index of the token being sampled in this request's output
    // Constrained decoding: [ceil(vocab_size / 32)] words, bit t % 32 of word t / 32 set when token t
    // may be sampled; every other token's logit is -inf before anything else (bias, penalties,
    // log-probabilities). Null: no constraint this step.
    const uint32_t* allowed = nullptr;
};

struct SampleResult {
    int32_t token = -1;
    float logprob = 0.0f;  // of the chosen token (after temperature, before truncation)
    std::vector<std::pair<int32_t, float>> top;  // top_logprobs alternatives, most likely first
};

// A scored position (prompt scoring): the log-probability of the token that actually follows, its
// rank among all tokens (1: the most likely), and the top alternatives, most likely first.
struct TokenScore {
    float logprob = 0.0f;
    int rank = 0;
    std::vector<std::pair<int32_t, float>> top;
};

}  // namespace osprey
