// The GPU sampler (kernels/cuda/sampling.h): one table for the test (tests/kernels/test_sampling_cuda.cu,
// against kernels/cpu/sampling.h) and the benchmark (bench/bench_sampling.cu). Vocabulary sizes around
// the kernel's tile constants (kSampleThreads, kSampleChunk) with random parameters per row (the
// combinations the engine accepts), and the real 201088 for batches 1..128 with bench_sampling's
// parameter sets (greedy, temperature, top-k, top-p, logprobs, penalties; peaked and broad logits).
//
// Check, exactness rule: weights, sums and log-probabilities are double on both sides; only the
// summation order differs (relative ~1e-16), so a draw can differ only when u lands that close to a
// cumulative boundary: with a few thousand draws per run that has probability ~1e-12. A mismatch is
// therefore counted as a rounding flip only when the two tokens are neighbours in the draw order
// (sorted order for truncated rows, id order for the others); every flip is noted, at most one per
// 2000 draws is tolerated, and any other mismatch fails.
//
// Perf: the kernel alone (CUDA events) and the whole Sampler::sample call (pack, upload, kernel, copy
// back, sync; wall clock). Bytes count one read of the logits (the kernel reads each row a few times,
// mostly from L2), so the bandwidth column is a lower bound on the traffic. Input sets rotate so that
// the logits read by consecutive runs total more than the L2. Batches of 64 and 128 with fixed
// parameters are perf-only (their class is checked by real_vocab_batch_128).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/cases/harness.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cuda/sampling.h"

namespace osprey::cases::sampling {

inline constexpr int kVocab = 201088;
inline constexpr float kInf = std::numeric_limits<float>::infinity();

// Token histories the states point into (kept alive by whoever holds the states).
struct Histories {
    std::vector<std::vector<int32_t>> prompt, output;
};

// Runs the kernel directly on a poisoned result buffer; checks that the counts scratch is zero afterwards.
inline std::vector<SampleResult> run_gpu(Result& r, const std::vector<float>& logits, int vocab,
                                         const std::vector<SamplingParams>& params,
                                         const std::vector<SamplingState>& states) {
    const int n_rows = int(params.size());
    cuda::SamplePack pack;
    cuda::pack_sample_rows(params, states, vocab, pack);
    auto d_logits = to_device(logits);
    auto d_params = to_device(pack.rows);
    auto d_out = poisoned<cuda::SampleRowResult>(size_t(n_rows));
    auto d_bias_ids = to_device(pack.bias_ids);
    auto d_bias_values = to_device(pack.bias_values);
    auto d_history = to_device(pack.history);
    const size_t work = std::max<size_t>(1, size_t(pack.n_work_rows) * size_t(vocab));
    auto d_work = poisoned<float>(work);
    cuda::DeviceBuffer<uint32_t> d_counts(work);
    d_counts.fill_bytes(0);
    cuda::sample_rows({.out = d_out.get(), .logits = d_logits.get(), .n_rows = n_rows, .vocab_size = vocab,
                       .params = d_params.get(), .bias_ids = d_bias_ids.get(), .bias_values = d_bias_values.get(),
                       .history = d_history.get(), .work = d_work.get(), .counts = d_counts.get()},
                      nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto counts = d_counts.download();
    if (!std::all_of(counts.begin(), counts.end(), [](uint32_t c) { return c == 0; }))
        r.fail("the counts scratch must be left zero");
    const auto got = d_out.download(size_t(n_rows));
    std::vector<SampleResult> out(static_cast<size_t>(n_rows));
    for (int row = 0; row < n_rows; ++row) cuda::unpack_sample_result(got[size_t(row)], size_t(row), out[size_t(row)]);
    return out;
}

inline bool truncates(const SamplingParams& p, int vocab) {
    return (p.top_k > 0 && p.top_k < vocab) || p.top_p < 1.0f || p.min_p > 0.0f;
}

// True when a and b are neighbours in the row's draw order (see the rule at the top).
inline bool neighbours(std::span<const float> logits, const SamplingParams& p, const SamplingState& s, int a, int b) {
    SamplingParams all = p;
    all.top_logprobs = int(logits.size());
    SampleResult full;
    cpu::sample_row(logits, all, s, full);  // every token in sorted order, with its log-probability
    if (truncates(p, int(logits.size()))) {
        int ia = -1, ib = -1;
        for (size_t i = 0; i < full.top.size(); ++i) {
            if (full.top[i].first == a) ia = int(i);
            if (full.top[i].first == b) ib = int(i);
        }
        return ia >= 0 && ib >= 0 && std::abs(ia - ib) == 1;
    }
    std::vector<float> lp(logits.size(), -kInf);
    for (const auto& [t, l] : full.top) lp[size_t(t)] = l;
    const int lo = std::min(a, b), hi = std::max(a, b);
    for (int t = lo + 1; t < hi; ++t)
        if (std::exp(double(lp[size_t(t)])) > 0.0) return false;
    return true;
}

struct Tally {
    int draws = 0, flips = 0;
};

// The GPU against the CPU sampler on every row (the rule at the top).
inline void compare(Result& r, const std::vector<float>& logits, int vocab, const std::vector<SamplingParams>& params,
                    const std::vector<SamplingState>& states, Tally& tally) {
    const std::vector<SampleResult> got = run_gpu(r, logits, vocab, params, states);
    std::vector<SampleResult> want(params.size());
    cpu::sample_rows(logits, vocab, params, states, want);
    for (size_t row = 0; row < params.size(); ++row) {
        const SamplingParams& p = params[row];
        const auto logits_row = std::span(logits).subspan(row * size_t(vocab), size_t(vocab));
        const std::string what = str("row ", row, " vocab ", vocab, " T ", p.temperature, " top_k ", p.top_k, " top_p ",
                                     p.top_p, " min_p ", p.min_p, " rep ", p.repetition_penalty, " freq ",
                                     p.frequency_penalty, " seed ", p.seed, " step ", states[row].step);
        ++tally.draws;
        if (got[row].token != want[row].token) {
            const bool adjacent =
                !p.is_greedy() && neighbours(logits_row, p, states[row], got[row].token, want[row].token);
            if (!adjacent) {
                r.fail(what, ": GPU token ", got[row].token, ", CPU token ", want[row].token);
                continue;
            }
            ++tally.flips;
            char u[64];
            std::snprintf(u, sizeof u, "%.17g", cpu::sample_uniform(p.seed, states[row].step));
            r.note("rounding flip: ", what, ": GPU ", got[row].token, " CPU ", want[row].token, " (u = ", u, ")");
            continue;
        }
        // Log-probabilities: both from double sums, rounded to float; 1e-4 is the contract.
        auto close = [](float g, float w) { return (std::isinf(w) && g == w) || std::abs(double(g) - w) <= 1e-4; };
        if (!close(got[row].logprob, want[row].logprob))
            r.fail(what, ": logprob ", got[row].logprob, " vs ", want[row].logprob);
        if (got[row].top.size() != want[row].top.size()) {
            r.fail(what, ": ", got[row].top.size(), " top logprobs, CPU ", want[row].top.size());
            continue;
        }
        for (size_t i = 0; i < want[row].top.size(); ++i) {
            if (got[row].top[i].first != want[row].top[i].first)
                r.fail(what, " top ", i, ": token ", got[row].top[i].first, " vs ", want[row].top[i].first);
            if (!close(got[row].top[i].second, want[row].top[i].second))
                r.fail(what, " top ", i, ": ", got[row].top[i].second, " vs ", want[row].top[i].second);
        }
    }
}

inline void expect_few_flips(Result& r, const Tally& t) {
    r.note(t.draws, " draws, ", t.flips, " rounding flips");
    if (t.flips * 2000 > std::max(t.draws, 2000))
        r.fail(t.flips, " rounding flips in ", t.draws, " draws: more than the rule allows");
}

// Random parameters from the combinations the engine accepts.
inline SamplingParams random_params(std::mt19937& rng, int vocab, Histories& h, SamplingState& s) {
    auto pick = [&](auto... v) {
        const std::vector<std::common_type_t<decltype(v)...>> xs{v...};
        return xs[rng() % xs.size()];
    };
    SamplingParams p;
    p.temperature = pick(0.0f, 0.6f, 1.0f, 1.0f, 1.3f);
    p.top_k = pick(0, 0, 1, 5, 50, 2047, 2048, 3000);
    p.top_p = pick(1.0f, 1.0f, 0.95f, 0.7f, 0.3f);
    p.min_p = pick(0.0f, 0.0f, 0.05f, 0.3f);
    p.repetition_penalty = pick(1.0f, 1.0f, 1.2f, 0.8f);
    p.frequency_penalty = pick(0.0f, 0.0f, 0.5f, -0.3f);
    p.presence_penalty = pick(0.0f, 0.0f, 0.7f);
    p.top_logprobs = pick(0, 0, 1, 5, 20);
    p.logprobs = true;
    p.seed = (uint64_t(rng()) << 32) | rng();
    const int n_bias = pick(0, 0, 1, 4);
    for (int i = 0; i < n_bias; ++i) p.logit_bias.emplace_back(int(rng() % vocab), pick(-100.0f, -2.0f, 1.5f, 5.0f));
    if (n_bias > 1) p.logit_bias.push_back(p.logit_bias[0]);  // a repeated entry adds twice
    h.prompt.emplace_back();
    h.output.emplace_back();
    const int n_prompt = pick(0, 3, 40), n_output = pick(0, 1, 30);
    for (int i = 0; i < n_prompt; ++i) h.prompt.back().push_back(int(rng() % std::min(vocab, 64)));
    for (int i = 0; i < n_output; ++i) h.output.back().push_back(int(rng() % std::min(vocab, 64)));
    s.prompt_tokens = h.prompt.back().data();
    s.n_prompt_tokens = n_prompt;
    s.output_tokens = h.output.back().data();
    s.n_output_tokens = n_output;
    s.step = rng() % 1000;
    return p;
}

// Logits of a few realistic shapes: peaked (a next-token distribution), broad, quantized (many ties),
// with NaN and -inf entries.
inline std::vector<float> random_logits(std::mt19937& rng, int n_rows, int vocab) {
    std::vector<float> x(size_t(n_rows) * vocab);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int row = 0; row < n_rows; ++row) {
        float* v = x.data() + size_t(row) * vocab;
        const int kind = int(rng() % 4);
        const float scale = kind == 0 ? 3.0f : 1.0f;
        for (int t = 0; t < vocab; ++t) v[t] = scale * normal(rng);
        if (kind == 0)
            for (int i = 0; i < 8; ++i) v[rng() % vocab] += 12.0f + float(i);  // a few likely tokens
        if (kind == 2)
            for (int t = 0; t < vocab; ++t) v[t] = std::round(v[t] * 2.0f) / 2.0f;  // ties
        if (kind == 3) {
            v[rng() % vocab] = NAN;
            v[rng() % vocab] = -kInf;
            v[rng() % vocab] = -0.0f;
        }
    }
    return x;
}

// Peaked rows (a next-token distribution: a few tokens 16-21 above a N(0, 2) background) or broad rows
// (N(0, 1): the worst case for top-p, whose nucleus then spans most of the vocabulary).
inline std::vector<float> bench_logits(std::mt19937& rng, int n_rows, int vocab, bool peaked) {
    std::normal_distribution<float> normal(0.0f, peaked ? 2.0f : 1.0f);
    std::vector<float> x(size_t(n_rows) * vocab);
    for (auto& v : x) v = normal(rng);
    if (peaked)
        for (int row = 0; row < n_rows; ++row)
            for (int i = 0; i < 6; ++i) x[size_t(row) * vocab + rng() % vocab] += 16.0f + float(i);
    return x;
}

// One parameter set for every row of a batch (bench_sampling's configurations before the tables).
struct Config {
    const char* name = "";
    bool peaked = true;
    SamplingParams params;
    bool history = false;  // 2000 prompt + 200 output ids per row
};

inline std::vector<Config> configs() {
    std::vector<Config> c;
    SamplingParams p;
    p.temperature = 0.0f;
    c.push_back({"greedy", true, p, false});
    p = {}, p.temperature = 0.8f;
    c.push_back({"temperature 0.8", true, p, false});
    p = {}, p.temperature = 0.8f, p.top_k = 50;
    c.push_back({"top_k 50", true, p, false});
    p = {}, p.top_p = 0.9f;
    c.push_back({"top_p 0.9 (peaked)", true, p, false});
    p = {}, p.top_p = 0.9f, p.top_logprobs = 20, p.logprobs = true;
    c.push_back({"top_p 0.9 + top_logprobs 20", true, p, false});
    p = {}, p.top_p = 0.9f, p.repetition_penalty = 1.1f, p.frequency_penalty = 0.3f, p.presence_penalty = 0.3f;
    c.push_back({"top_p 0.9 + penalties (2200 ids)", true, p, true});
    p = {}, p.top_p = 0.9f;
    c.push_back({"top_p 0.9 (broad N(0,1), worst case)", false, p, false});
    return c;
}

struct Case {
    std::string name;   // gtest name; empty: identifier(label)
    std::string label;  // bench label
    Use use = Use::both;
    int vocab = kVocab;
    int n_rows = 1;
    int repeats = 1;     // random cases: batches checked in turn (perf: the first)
    bool random = true;  // random parameters and logits per row (the tests' mix); else `config`
    Config config;
};

// One batch of a case: logits, parameters and states (pointing into `h`).
struct Batch {
    Histories h;
    std::vector<float> logits;
    std::vector<SamplingParams> params;
    std::vector<SamplingState> states;
};
inline void make_batch(const Case& c, std::mt19937& rng, Batch& b) {
    b.params.assign(size_t(c.n_rows), {});
    b.states.assign(size_t(c.n_rows), {});
    if (c.random) {
        b.h.prompt.reserve(size_t(c.n_rows)), b.h.output.reserve(size_t(c.n_rows));  // states point into them
        for (int row = 0; row < c.n_rows; ++row)
            b.params[size_t(row)] = random_params(rng, c.vocab, b.h, b.states[size_t(row)]);
        b.logits = random_logits(rng, c.n_rows, c.vocab);
        return;
    }
    b.h.prompt.assign(1, std::vector<int32_t>(2000));
    b.h.output.assign(1, std::vector<int32_t>(200));
    for (auto& t : b.h.prompt[0]) t = int(rng() % c.vocab);
    for (auto& t : b.h.output[0]) t = int(rng() % std::min(c.vocab, 5000));
    for (int row = 0; row < c.n_rows; ++row) {
        b.params[size_t(row)] = c.config.params;
        b.params[size_t(row)].seed = uint64_t(row);
        if (c.config.history) b.states[size_t(row)] = {b.h.prompt[0].data(), 2000, b.h.output[0].data(), 200, 0};
    }
    b.logits = bench_logits(rng, c.n_rows, c.vocab, c.config.peaked);
}

inline Result run(const Case& c, Mode mode) {
    Result r;
    r.seed = case_seed(mode);
    std::mt19937 rng(r.seed);
    if (mode == Mode::check) {
        Tally tally;
        for (int rep = 0; rep < c.repeats; ++rep) {
            Batch b;
            make_batch(c, rng, b);
            compare(r, b.logits, c.vocab, b.params, b.states, tally);
        }
        expect_few_flips(r, tally);
        return r;
    }

    Batch b;
    make_batch(c, rng, b);
    const int iters = iters_or(30);
    const size_t row_bytes = size_t(c.vocab) * sizeof(float);
    const int n_sets = std::max(2, copies_beyond_l2(double(c.n_rows) * double(row_bytes)));
    std::vector<cuda::DeviceBuffer<float>> sets;
    for (int s = 0; s < n_sets; ++s) sets.push_back(to_device(b.logits));  // the same values: the point is L2 eviction

    // Whole call, wall clock (includes packing, uploads, the copy back and the sync).
    std::vector<SampleResult> out(size_t(c.n_rows));
    cuda::Sampler sampler;
    std::vector<double> wall;
    for (int i = 0; i < iters + 3; ++i) {
        for (auto& s : b.states) s.step = uint64_t(i);
        const auto t0 = std::chrono::steady_clock::now();
        sampler.sample(sets[size_t(i % n_sets)].get(), c.vocab, 0, b.params, b.states, out, nullptr);
        const auto t1 = std::chrono::steady_clock::now();
        if (i >= 3) wall.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    std::sort(wall.begin(), wall.end());

    // Kernel alone on the packed parameters.
    cuda::SamplePack pack;
    cuda::pack_sample_rows(b.params, b.states, c.vocab, pack);
    auto d_params = to_device(pack.rows);
    cuda::DeviceBuffer<cuda::SampleRowResult> d_out(size_t(c.n_rows));
    auto d_bias_ids = to_device(pack.bias_ids);
    auto d_bias_values = to_device(pack.bias_values);
    auto d_history = to_device(pack.history);
    const size_t work = std::max<size_t>(1, size_t(pack.n_work_rows) * size_t(c.vocab));
    cuda::DeviceBuffer<float> d_work(work);
    cuda::DeviceBuffer<uint32_t> d_counts(work);
    d_counts.fill_bytes(0);
    const double us = time_us(
        [&](int i) {
            cuda::sample_rows({.out = d_out.get(), .logits = sets[size_t(i % n_sets)].get(), .n_rows = c.n_rows,
                               .vocab_size = c.vocab, .params = d_params.get(), .bias_ids = d_bias_ids.get(),
                               .bias_values = d_bias_values.get(), .history = d_history.get(),
                               .work = d_work.get(), .counts = d_counts.get()},
                              nullptr);
        },
        iters);
    r.timings.push_back({c.label, us, double(c.n_rows) * double(row_bytes), 0.0});
    r.timings.push_back({.label = "whole Sampler::sample call (wall)", .us = wall[wall.size() / 2], .wall = true});
    return r;
}

inline std::vector<Case> cases() {
    std::vector<Case> t;
    auto random = [&](const char* name, int vocab, int n_rows, int repeats, Use use = Use::check_only) {
        t.push_back({.name = name, .label = str("batch ", n_rows, " random parameters, vocab ", vocab), .use = use,
                     .vocab = vocab, .n_rows = n_rows, .repeats = repeats});
    };
    // Below one CTA's worth of ids, exactly one, one more; a chunk's worth and around it; the real vocab.
    random("tiny_vocab", 5, 16, 4);
    random("vocab_cta_size_minus_1", cuda::kSampleThreads - 1, 16, 2);
    random("vocab_cta_size", cuda::kSampleThreads, 16, 2);
    random("vocab_cta_size_plus_1", cuda::kSampleThreads + 1, 16, 2);
    random("vocab_chunk_size_minus_1", cuda::kSampleChunk - 1, 16, 2);
    random("vocab_chunk_size", cuda::kSampleChunk, 16, 2);
    random("vocab_chunk_size_plus_1", cuda::kSampleChunk + 1, 16, 2);
    random("vocab_5000", 5000, 24, 2);
    random("real_vocab_batch_128", kVocab, 128, 1, Use::both);
    // bench_sampling's lines before the tables (same labels): batches 1..128 x parameter sets.
    for (const int batch : {1, 8, 32, 64, 128})
        for (const Config& cfg : configs())
            t.push_back({.label = str("batch ", batch, " ", cfg.name), .use = batch <= 32 ? Use::both : Use::perf_only,
                         .vocab = kVocab, .n_rows = batch, .random = false, .config = cfg});
    return t;
}

}  // namespace osprey::cases::sampling
