// CPU sampler (see sampling.h for the order of operations).
#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/check.h"

namespace osprey::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Sorted order of candidates: larger logit first, lower id on ties (deterministic).
struct ByLogit {
    const float* x;
    bool operator()(int32_t a, int32_t b) const { return x[a] > x[b] || (x[a] == x[b] && a < b); }
};

// Steps 1-3: bias and penalties, in place. x: [vocab_size].
void apply_bias_and_penalties(std::vector<float>& x, const SamplingParams& p, const SamplingState& s) {
    const int vocab_size = int(x.size());
    for (const auto& [token, bias] : p.logit_bias) {
        OSPREY_CHECK(token >= 0 && token < vocab_size, "logit_bias token ", token, " is outside the vocabulary of ",
                     vocab_size);
        x[size_t(token)] += bias;
    }
    const bool repetition = p.repetition_penalty != 1.0f;
    const bool counted = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
    if (!repetition && !counted) return;

    // Output token counts, and a mark on every token seen in prompt or output.
    std::vector<int32_t> seen;                              // distinct tokens of prompt and output
    std::vector<int32_t> count(size_t(vocab_size), 0);      // [vocab_size] occurrences in the output
    std::vector<uint8_t> in_prompt(size_t(vocab_size), 0);  // [vocab_size]
    auto check_id = [&](int32_t t) {
        OSPREY_CHECK(t >= 0 && t < vocab_size, "sampling history holds token ", t, " outside the vocabulary");
    };
    for (int32_t i = 0; i < s.n_output_tokens; ++i) {
        const int32_t t = s.output_tokens[i];
        check_id(t);
        if (count[size_t(t)]++ == 0) seen.push_back(t);
    }
    if (repetition) {
        for (int32_t i = 0; i < s.n_prompt_tokens; ++i) {
            const int32_t t = s.prompt_tokens[i];
            check_id(t);
            if (count[size_t(t)] == 0 && !in_prompt[size_t(t)]) seen.push_back(t);
            in_prompt[size_t(t)] = 1;
        }
    }
    for (int32_t t : seen) {
        float& v = x[size_t(t)];
        if (repetition) v = v > 0.0f ? v / p.repetition_penalty : v * p.repetition_penalty;
        const int32_t c = count[size_t(t)];
        if (c > 0) v -= p.frequency_penalty * float(c) + p.presence_penalty;
    }
}

}  // namespace

double sample_uniform(uint64_t seed, uint64_t step) {
    const uint64_t h = splitmix64(seed ^ splitmix64(step ^ 0x632BE59BD9B4E019ull));
    return double(h >> 11) * 0x1.0p-53;
}

void sample_row(std::span<const float> logits, const SamplingParams& p, const SamplingState& s, SampleResult& out) {
    const int vocab_size = int(logits.size());
    OSPREY_CHECK(vocab_size > 0, "sampling needs at least one logit");
    std::vector<float> x(logits.begin(), logits.end());  // [vocab_size] working logits
    for (float& v : x)
        if (std::isnan(v)) v = kNegInf;
    int32_t best = 0;
    if (s.allowed) {  // step 0: constrained decoding's mask
        for (int32_t t = 0; t < vocab_size; ++t)
            if (!((s.allowed[t >> 5] >> (t & 31)) & 1)) x[size_t(t)] = kNegInf;
        while (best + 1 < vocab_size && !((s.allowed[best >> 5] >> (best & 31)) & 1)) ++best;
    }
    apply_bias_and_penalties(x, p, s);
    if (s.allowed)  // a bias must not bring a refused token back
        for (int32_t t = 0; t < vocab_size; ++t)
            if (!((s.allowed[t >> 5] >> (t & 31)) & 1)) x[size_t(t)] = kNegInf;

    // Step 4: greedy or temperature.
    for (int32_t t = best + 1; t < vocab_size; ++t)
        if (x[size_t(t)] > x[size_t(best)]) best = t;
    const bool greedy = p.is_greedy();
    if (!greedy && p.temperature != 1.0f) {
        const float inv = 1.0f / p.temperature;
        for (float& v : x) v *= inv;
    }
    const float x_max = x[size_t(best)];

    // Step 5: log-softmax normaliser (double accumulation). An all -inf row (everything biased
    // away) degenerates to token `best` with logprob 0.
    double sum = 0.0;
    if (std::isfinite(x_max))
        for (float v : x) sum += std::exp(double(v) - double(x_max));
    const double log_z = std::isfinite(x_max) ? double(x_max) + std::log(sum) : 0.0;
    auto logprob_of = [&](int32_t t) {
        return std::isfinite(x_max) ? float(double(x[size_t(t)]) - log_z) : (t == best ? 0.0f : kNegInf);
    };

    out.top.clear();
    if (p.top_logprobs > 0) {
        const int n = std::min(p.top_logprobs, vocab_size);
        std::vector<int32_t> ids(static_cast<size_t>(vocab_size));
        std::iota(ids.begin(), ids.end(), 0);
        std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), ByLogit{x.data()});
        for (int i = 0; i < n; ++i) out.top.emplace_back(ids[size_t(i)], logprob_of(ids[size_t(i)]));
    }

    if (greedy || !std::isfinite(x_max)) {
        out.token = best;
        out.logprob = logprob_of(best);
        return;
    }

    const double u = sample_uniform(p.seed, s.step);
    const bool truncate = (p.top_k > 0 && p.top_k < vocab_size) || p.top_p < 1.0f || p.min_p > 0.0f;
    if (!truncate) {
        // Step 7 over the whole vocabulary, in id order (the order does not change the distribution).
        const double target = u * sum;
        double acc = 0.0;
        int32_t chosen = best;
        for (int32_t t = 0; t < vocab_size; ++t) {
            const double w = std::exp(double(x[size_t(t)]) - double(x_max));
            if (w == 0.0) continue;
            acc += w;
            chosen = t;
            if (acc > target) break;
        }
        out.token = chosen;
        out.logprob = logprob_of(chosen);
        return;
    }

    // Step 6: the kept tokens are a prefix of the sorted order; find how long it is.
    // Candidates below the min-p threshold can never be kept, so they are dropped before sorting.
    std::vector<int32_t> ids;
    ids.reserve(size_t(vocab_size));
    const float min_p_floor = p.min_p > 0.0f ? x_max + std::log(p.min_p) : kNegInf;
    for (int32_t t = 0; t < vocab_size; ++t)
        if (x[size_t(t)] >= min_p_floor && x[size_t(t)] != kNegInf) ids.push_back(t);
    int keep = int(ids.size());
    if (p.top_k > 0) keep = std::min(keep, p.top_k);
    const ByLogit order{x.data()};

    // Weights relative to the largest logit; the top-k set's total for top-p's renormalisation.
    auto weight = [&](int32_t t) { return std::exp(double(x[size_t(t)]) - double(x_max)); };
    int sorted = 0;  // ids[0, sorted) are in final order
    auto sort_prefix = [&](int n) {
        n = std::min(n, int(ids.size()));
        if (n <= sorted) return;
        std::partial_sort(ids.begin() + sorted, ids.begin() + n, ids.end(), order);
        sorted = n;
    };
    if (p.top_p < 1.0f) {
        // Total weight of the top-k set (the whole vocabulary when top_k is off).
        double total = 0.0;
        if (p.top_k > 0 && p.top_k < vocab_size) {
            std::vector<int32_t> all(static_cast<size_t>(vocab_size));
            std::iota(all.begin(), all.end(), 0);
            const int k = std::min(p.top_k, vocab_size);
            std::nth_element(all.begin(), all.begin() + (k - 1), all.end(), order);
            for (int i = 0; i < k; ++i) total += weight(all[size_t(i)]);
        } else {
            total = sum;
        }
        // Grow the sorted prefix until it holds top_p of the mass.
        const double needed = double(p.top_p) * total;
        double acc = 0.0;
        int n_top_p = -1;
        for (int chunk = 64; n_top_p < 0; chunk *= 4) {
            const int before = sorted;
            sort_prefix(std::min(keep, before + chunk));
            for (int i = before; i < sorted; ++i) {
                acc += weight(ids[size_t(i)]);
                if (acc >= needed) {
                    n_top_p = i + 1;
                    break;
                }
            }
            if (sorted >= keep && n_top_p < 0) n_top_p = keep;  // rounding: keep everything allowed
        }
        keep = std::min(keep, n_top_p);
    }
    keep = std::max(keep, 1);
    sort_prefix(keep);

    double kept = 0.0;
    for (int i = 0; i < keep; ++i) kept += weight(ids[size_t(i)]);
    const double target = u * kept;
    double acc = 0.0;
    int32_t chosen = ids[0];
    for (int i = 0; i < keep; ++i) {
        acc += weight(ids[size_t(i)]);
        chosen = ids[size_t(i)];
        if (acc > target) break;
    }
    out.token = chosen;
    out.logprob = logprob_of(chosen);
}

void sample_rows(std::span<const float> logits, int vocab_size, std::span<const SamplingParams> params,
                 std::span<const SamplingState> state, std::span<SampleResult> out, ThreadPool& pool) {
    const size_t n_rows = params.size();
    OSPREY_CHECK(state.size() == n_rows && out.size() == n_rows, "sample_rows: ", n_rows, " params, ", state.size(),
                 " states and ", out.size(), " results");
    OSPREY_CHECK(vocab_size > 0 && logits.size() == n_rows * size_t(vocab_size), "sample_rows: ", logits.size(),
                 " logits for ", n_rows, " rows of ", vocab_size);
    pool.parallel_for(int64_t(n_rows), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r)
            sample_row(logits.subspan(size_t(r) * size_t(vocab_size), size_t(vocab_size)), params[size_t(r)],
                       state[size_t(r)], out[size_t(r)]);
    });
}

}  // namespace osprey::cpu
