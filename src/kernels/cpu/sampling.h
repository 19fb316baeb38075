// The CPU sampler: turns one row of logits into a token with the request's SamplingParams (greedy,
// temperature, top-k, top-p, min-p, repetition/frequency/presence penalties, logit bias, seeded
// draw, log-probabilities). The reference for the CUDA sampler; tests: tests/engine/test_sampling.cpp.
#pragma once

#include <cstdint>
#include <span>

#include "core/sampling.h"
#include "core/thread_pool.h"

namespace osprey::cpu {

// The seeded draw: a uniform number in [0, 1) that depends only on (seed, step), so a request's
// tokens are reproducible whatever else shares its batch (a counter-based generator: splitmix64
// of the pair; the CUDA sampler uses the same function).
double sample_uniform(uint64_t seed, uint64_t step);

// The order of operations, per row:
//   0. tokens outside state.allowed (constrained decoding) get -inf (and keep it whatever the bias);
//   1. logit bias is added;
//   2. repetition penalty (HF style) on every token of prompt and output: positive logits are
//      divided by it, negative ones multiplied;
//   3. frequency and presence penalties (OpenAI style) from the output's token counts;
//   4. greedy (temperature 0): the largest logit, lowest id on ties; otherwise logits / temperature;
//   5. log-probabilities (chosen token and top_logprobs) come from the softmax at this point,
//      before truncation (at temperature 1 for greedy rows);
//   6. truncation: top-k, then top-p on the renormalised top-k set, then min-p (tokens whose
//      probability is below min_p times the largest one are dropped); at least one token stays;
//   7. the token whose cumulative probability (kept tokens, most likely first, renormalised)
//      first exceeds sample_uniform(seed, step).
// NaN logits are treated as -infinity. logits: [vocab_size].
void sample_row(std::span<const float> logits, const SamplingParams& params, const SamplingState& state,
                SampleResult& out);

// Rows in parallel. logits: [n_rows, vocab_size]; params, state, out: [n_rows].
void sample_rows(std::span<const float> logits, int vocab_size, std::span<const SamplingParams> params,
                 std::span<const SamplingState> state, std::span<SampleResult> out,
                 ThreadPool& pool = ThreadPool::global());

}  // namespace osprey::cpu
