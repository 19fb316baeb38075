// Host-side half of the CUDA sampler (kernels/cuda/sampling.h): validates each row's SamplingParams and
// SamplingState and packs them into the small flat arrays the kernel reads (per-row parameters, the
// logit-bias lists, the token histories of rows with penalties). No CUDA here, so it is unit-tested on
// the CPU (tests/kernels/test_sampling_pack.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "core/check.h"
#include "core/sampling.h"

#if defined(__CUDACC__)
#define OSPREY_SAMPLING_HD __host__ __device__
#else
#define OSPREY_SAMPLING_HD
#endif

namespace osprey::cuda {

inline constexpr int kSampleMaxTopLogprobs = 20;  // top_logprobs the GPU sampler returns at most
inline constexpr int kSampleIdBits = 18;          // token ids live in the low bits of the sort key
inline constexpr int kSampleMaxVocab = 1 << kSampleIdBits;

// Row flags (SampleRowParams::flags).
inline constexpr int32_t kSampleGreedy = 1;       // temperature <= 0: argmax
inline constexpr int32_t kSampleTruncate = 2;     // top-k, top-p or min-p is on
inline constexpr int32_t kSampleTopK = 4;         // 0 < top_k < vocab_size
inline constexpr int32_t kSampleTopP = 8;         // top_p < 1
inline constexpr int32_t kSampleMinP = 16;        // min_p > 0
inline constexpr int32_t kSampleRepetition = 32;  // repetition_penalty != 1 (prompt and output ids)
inline constexpr int32_t kSampleCounted = 64;     // frequency or presence penalty != 0 (output ids)

// The per-row parameters the kernel reads (one small struct per row, uploaded each call).
struct SampleRowParams {
    float inv_temperature = 1.0f;  // 1 / temperature as float (1 for greedy rows: no scaling)
    float log_min_p = 0.0f;        // std::log(min_p) in float, as the CPU sampler computes it
    float top_p = 1.0f;
    float repetition_penalty = 1.0f;
    float frequency_penalty = 0.0f;
    float presence_penalty = 0.0f;
    int32_t top_k = 0;
    int32_t top_logprobs = 0;   // 0..kSampleMaxTopLogprobs, already clamped to vocab_size
    int32_t flags = 0;          // kSample*
    int32_t bias_begin = 0;     // into the bias arrays
    int32_t n_bias = 0;
    int32_t prompt_begin = 0;   // into the history array (only with kSampleRepetition)
    int32_t n_prompt = 0;
    int32_t output_begin = 0;   // into the history array (with kSampleRepetition or kSampleCounted)
    int32_t n_output = 0;
    int32_t work_row = -1;      // row of the edit scratch buffers; -1: no bias and no penalties
    uint64_t seed = 0;
    uint64_t step = 0;
};

// What the kernel writes per row (copied back to the host, ~180 bytes).
struct SampleRowResult {
    int32_t token = -1;
    float logprob = 0.0f;
    int32_t n_top = 0;
    int32_t error = 0;  // nonzero: a history id or bias id outside the vocabulary reached the kernel
    int32_t top_ids[kSampleMaxTopLogprobs] = {};
    float top_logprobs[kSampleMaxTopLogprobs] = {};
};

// Everything uploaded for one call. bias_ids/bias_values: [n_bias total]; history: [n_history total].
struct SamplePack {
    std::vector<SampleRowParams> rows;  // [n_rows]
    std::vector<int32_t> bias_ids;
    std::vector<float> bias_values;
    std::vector<int32_t> history;
    int n_work_rows = 0;  // rows with bias or penalties (each gets a scratch row of vocab_size)
};

// The CPU sampler's seeded draw (kernels/cpu/sampling.h, sample_uniform), written once for host and
// device: splitmix64 of (seed, step); a double in [0, 1) with 53 random bits.
OSPREY_SAMPLING_HD inline uint64_t sample_splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
OSPREY_SAMPLING_HD inline double sample_uniform_hd(uint64_t seed, uint64_t step) {
    const uint64_t h = sample_splitmix64(seed ^ sample_splitmix64(step ^ 0x632BE59BD9B4E019ull));
    return double(h >> 11) * 0x1.0p-53;
}

// Validates and packs. Throws osprey::Error naming the row and the bad value (the same rules as the
// engine's request validation, plus the GPU sampler's limits: top_logprobs <= 20, vocab_size <= 2^18,
// 1/temperature finite).
inline void pack_sample_rows(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                             int vocab_size, SamplePack& out) {
    OSPREY_CHECK(params.size() == state.size(), "sample: ", params.size(), " parameter sets for ", state.size(),
                 " states");
    OSPREY_CHECK(vocab_size > 0 && vocab_size <= kSampleMaxVocab, "sample: vocab_size ", vocab_size,
                 " is outside [1, ", kSampleMaxVocab, "] (the GPU sampler keys ids in ", kSampleIdBits, " bits)");
    out.rows.assign(params.size(), SampleRowParams{});
    out.bias_ids.clear();
    out.bias_values.clear();
    out.history.clear();
    out.n_work_rows = 0;
    auto check_ids = [&](size_t r, const char* what, const int32_t* ids, int32_t n) {
        OSPREY_CHECK(n >= 0, "sample row ", r, ": ", n, " ", what, " tokens");
        OSPREY_CHECK(n == 0 || ids != nullptr, "sample row ", r, ": ", n, " ", what, " tokens but no pointer");
        for (int32_t i = 0; i < n; ++i)
            OSPREY_CHECK(ids[i] >= 0 && ids[i] < vocab_size, "sample row ", r, ": ", what, " token ", ids[i],
                         " at position ", i, " is outside the vocabulary of ", vocab_size);
    };
    for (size_t r = 0; r < params.size(); ++r) {
        const SamplingParams& p = params[r];
        const SamplingState& s = state[r];
        SampleRowParams& q = out.rows[r];
        OSPREY_CHECK(!std::isnan(p.temperature), "sample row ", r, ": temperature is NaN");
        OSPREY_CHECK(p.top_logprobs >= 0 && p.top_logprobs <= kSampleMaxTopLogprobs, "sample row ", r,
                     ": top_logprobs ", p.top_logprobs, " is outside [0, ", kSampleMaxTopLogprobs, "]");
        OSPREY_CHECK(!std::isnan(p.top_p), "sample row ", r, ": top_p is NaN");
        OSPREY_CHECK(p.min_p >= 0.0f && p.min_p <= 1.0f, "sample row ", r, ": min_p ", p.min_p,
                     " is outside [0, 1]");
        OSPREY_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f, "sample row ", r,
                     ": repetition_penalty ", p.repetition_penalty, " must be finite and > 0");
        OSPREY_CHECK(std::isfinite(p.frequency_penalty) && std::isfinite(p.presence_penalty), "sample row ", r,
                     ": frequency_penalty ", p.frequency_penalty, " and presence_penalty ", p.presence_penalty,
                     " must be finite");
        const bool greedy = p.is_greedy();
        if (!greedy) {
            q.inv_temperature = 1.0f / p.temperature;  // the CPU sampler's factor, bit for bit
            OSPREY_CHECK(std::isfinite(q.inv_temperature), "sample row ", r, ": temperature ", p.temperature,
                         " is too small (1/temperature overflows)");
        }
        q.top_k = p.top_k;
        q.top_p = p.top_p;
        q.log_min_p = p.min_p > 0.0f ? std::log(p.min_p) : -std::numeric_limits<float>::infinity();
        q.repetition_penalty = p.repetition_penalty;
        q.frequency_penalty = p.frequency_penalty;
        q.presence_penalty = p.presence_penalty;
        q.top_logprobs = std::min(p.top_logprobs, vocab_size);
        q.seed = p.seed;
        q.step = s.step;
        const bool top_k = p.top_k > 0 && p.top_k < vocab_size;
        const bool top_p = p.top_p < 1.0f;
        const bool min_p = p.min_p > 0.0f;
        const bool repetition = p.repetition_penalty != 1.0f;
        const bool counted = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
        q.flags = (greedy ? kSampleGreedy : 0) | (top_k || top_p || min_p ? kSampleTruncate : 0) |
                  (top_k ? kSampleTopK : 0) | (top_p ? kSampleTopP : 0) | (min_p ? kSampleMinP : 0) |
                  (repetition ? kSampleRepetition : 0) | (counted ? kSampleCounted : 0);

        q.bias_begin = int32_t(out.bias_ids.size());
        for (const auto& [token, bias] : p.logit_bias) {
            OSPREY_CHECK(token >= 0 && token < vocab_size, "sample row ", r, ": logit_bias token ", token,
                         " is outside the vocabulary of ", vocab_size);
            OSPREY_CHECK(!std::isnan(bias), "sample row ", r, ": logit_bias for token ", token, " is NaN");
            out.bias_ids.push_back(token);
            out.bias_values.push_back(bias);
        }
        q.n_bias = int32_t(p.logit_bias.size());
        if (repetition) {
            check_ids(r, "prompt", s.prompt_tokens, s.n_prompt_tokens);
            q.prompt_begin = int32_t(out.history.size());
            q.n_prompt = s.n_prompt_tokens;
            out.history.insert(out.history.end(), s.prompt_tokens, s.prompt_tokens + s.n_prompt_tokens);
        }
        if (repetition || counted) {
            check_ids(r, "output", s.output_tokens, s.n_output_tokens);
            q.output_begin = int32_t(out.history.size());
            q.n_output = s.n_output_tokens;
            out.history.insert(out.history.end(), s.output_tokens, s.output_tokens + s.n_output_tokens);
        }
        OSPREY_CHECK(out.history.size() < size_t(std::numeric_limits<int32_t>::max()),
                     "sample: token histories too long (", out.history.size(), " ids)");
        if (q.n_bias > 0 || q.n_prompt > 0 || q.n_output > 0) q.work_row = out.n_work_rows++;
    }
}

// The device results as the engine's SampleResult (top list only when requested).
inline void unpack_sample_result(const SampleRowResult& g, size_t row, SampleResult& out) {
    OSPREY_CHECK(g.error == 0, "sample row ", row, ": the GPU sampler saw a token id outside the vocabulary");
    OSPREY_CHECK(g.n_top >= 0 && g.n_top <= kSampleMaxTopLogprobs && g.token >= 0, "sample row ", row,
                 ": the GPU sampler returned token ", g.token, " with ", g.n_top, " alternatives");
    out.token = g.token;
    out.logprob = g.logprob;
    out.top.clear();
    for (int i = 0; i < g.n_top; ++i) out.top.emplace_back(g.top_ids[i], g.top_logprobs[i]);
}

}  // namespace osprey::cuda
