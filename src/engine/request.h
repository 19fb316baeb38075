// What callers give the engine (a Request) and what they get back (a stream of Events). Token ids
// only: the server turns text and chat messages into ids and back. Checked by validate_request().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/sampling.h"
#include "engine/token_constraint.h"

namespace osprey::engine {

struct Request {
    std::string id;                       // caller's name for the request (logs, cancel by id); may repeat
    std::vector<int32_t> prompt;          // [n_prompt] token ids, at least one
    SamplingParams sampling;              // temperature 0 is greedy; seed fixes the draws (see sampling.h)
    std::vector<int32_t> stop_token_ids;  // generation stops after producing any of these
    int max_new_tokens = 256;             // >= 1; prompt + max_new_tokens must fit max_model_len
    int priority = 0;                     // higher runs first; equal priorities run first-come-first-served
    int n = 1;                            // independent samples; they share the prompt's KV pages
    // Structured output: the tokens each sample may generate (each sample advances a clone). Null:
    // unconstrained, at no cost.
    std::shared_ptr<const TokenConstraint> constraint;
    int min_tokens = 0;                   // stop_token_ids cannot be sampled before this many output tokens
    // Prompt scoring: >= 0 asks for the log-probability of every prompt token after the first given
    // the tokens before it, with this many most likely alternatives (Event::prompt_logprobs, sent
    // before the first token). Needs ModelRunner::supports_prompt_scoring(). -1: off.
    int prompt_logprobs = -1;
};

// The seed sample `sample` of a request draws with: the request's own for sample 0, a mix of
// (seed, sample) for the others, so n > 1 samples differ yet each is reproducible.
uint64_t sample_seed(uint64_t seed, int sample);

enum class FinishReason { stop, length, abort, error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error"

struct Usage {
    int prompt_tokens = 0;      // of the request (the same for every sample)
    int completion_tokens = 0;  // of this sample, the stop token included
    int cached_tokens = 0;      // prompt tokens whose KV came from the prefix cache (first admission)
};

// One event of a request's stream. Every sample yields its tokens in order, then exactly one
// finish event; the stream is over when every sample has finished (RequestStream::done()).
struct Event {
    enum class Kind { token, finish };
    Kind kind = Kind::token;
    int sample = 0;  // which of the request's n samples, 0 <= sample < n

    // Kind::token: a generated token (stop tokens are not sent as tokens: see stop_token).
    int32_t token = -1;
    float logprob = 0.0f;                        // when SamplingParams::logprobs
    std::vector<std::pair<int32_t, float>> top;  // SamplingParams::top_logprobs alternatives

    // The first event of sample 0 when Request::prompt_logprobs >= 0: one entry per prompt token from
    // the second on, in order (each given the tokens before it).
    std::vector<TokenScore> prompt_logprobs = {};

    // Kind::finish
    FinishReason reason = FinishReason::stop;
    int32_t stop_token = -1;  // the stop token that ended the sample (reason stop), else -1
    std::string error;        // reason error: what went wrong
    Usage usage;
};

}  // namespace osprey::engine
