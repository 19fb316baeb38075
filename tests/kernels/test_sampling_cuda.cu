// CUDA sampler (kernels/cuda/sampling.h) against the CPU sampler (kernels/cpu/sampling.h): the same
// token and log-probabilities within 1e-4 for many rows and parameter combinations, at vocabulary sizes
// around the kernel's tile constants (kSampleThreads, kSampleChunk) and the real 201088.
//
// Exactness rule: weights, sums and log-probabilities are double on both sides; only the summation
// order differs (relative ~1e-16), so a draw can differ only when u lands that close to a cumulative
// boundary: with a few thousand draws per run that has probability ~1e-12. A mismatch is therefore
// counted as a rounding flip only when the two tokens are neighbours in the draw order (sorted order
// for truncated rows, id order for the others); every flip is printed, at most one per 2000 draws is
// tolerated, and any other mismatch fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "kernels/cpu/sampling.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda_test_util.h"

namespace osprey {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

__global__ void uniform_kernel(const uint64_t* seeds, const uint64_t* steps, double* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = cuda::sample_uniform_hd(seeds[i], steps[i]);
}

// History storage for the states (kept alive by the case).
struct Histories {
    std::vector<std::vector<int32_t>> prompt, output;
};

// Runs the kernel directly on a poisoned result buffer; checks the counts scratch is zero afterwards.
std::vector<SampleResult> run_gpu(const std::vector<float>& logits, int vocab, const std::vector<SamplingParams>& params,
                                  const std::vector<SamplingState>& states) {
    const int n_rows = int(params.size());
    cuda::SamplePack pack;
    cuda::pack_sample_rows(params, states, vocab, pack);
    auto d_logits = test::to_device(logits);
    auto d_params = test::to_device(pack.rows);
    auto d_out = test::poisoned<cuda::SampleRowResult>(size_t(n_rows));
    auto d_bias_ids = test::to_device(pack.bias_ids.empty() ? std::vector<int32_t>{0} : pack.bias_ids);
    auto d_bias_values = test::to_device(pack.bias_values.empty() ? std::vector<float>{0} : pack.bias_values);
    auto d_history = test::to_device(pack.history.empty() ? std::vector<int32_t>{0} : pack.history);
    const size_t work = std::max<size_t>(1, size_t(pack.n_work_rows) * size_t(vocab));
    auto d_work = test::poisoned<float>(work);
    cuda::DeviceBuffer<uint32_t> d_counts(work);
    d_counts.fill_bytes(0);
    cuda::sample_rows({.out = d_out.get(), .logits = d_logits.get(), .n_rows = n_rows, .vocab_size = vocab,
                       .params = d_params.get(), .bias_ids = d_bias_ids.get(), .bias_values = d_bias_values.get(),
                       .history = d_history.get(), .work = d_work.get(), .counts = d_counts.get()},
                      nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto counts = d_counts.download();
    EXPECT_TRUE(std::all_of(counts.begin(), counts.end(), [](uint32_t c) { return c == 0; }))
        << "the counts scratch must be left zero";
    const auto got = d_out.download();
    std::vector<SampleResult> out(static_cast<size_t>(n_rows));
    for (int r = 0; r < n_rows; ++r) cuda::unpack_sample_result(got[size_t(r)], size_t(r), out[size_t(r)]);
    return out;
}

bool truncates(const SamplingParams& p, int vocab) {
    return (p.top_k > 0 && p.top_k < vocab) || p.top_p < 1.0f || p.min_p > 0.0f;
}

// True when a and b are neighbours in the row's draw order (see the rule at the top).
bool neighbours(std::span<const float> logits, const SamplingParams& p, const SamplingState& s, int a, int b) {
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

void compare(const std::vector<float>& logits, int vocab, const std::vector<SamplingParams>& params,
             const std::vector<SamplingState>& states, Tally& tally) {
    const std::vector<SampleResult> got = run_gpu(logits, vocab, params, states);
    std::vector<SampleResult> want(params.size());
    cpu::sample_rows(logits, vocab, params, states, want);
    for (size_t r = 0; r < params.size(); ++r) {
        const SamplingParams& p = params[r];
        const auto row = std::span(logits).subspan(r * size_t(vocab), size_t(vocab));
        const std::string what = "row " + std::to_string(r) + " vocab " + std::to_string(vocab) + " T " +
                                 std::to_string(p.temperature) + " top_k " + std::to_string(p.top_k) + " top_p " +
                                 std::to_string(p.top_p) + " min_p " + std::to_string(p.min_p) + " rep " +
                                 std::to_string(p.repetition_penalty) + " freq " +
                                 std::to_string(p.frequency_penalty) + " seed " + std::to_string(p.seed) + " step " +
                                 std::to_string(states[r].step);
        ++tally.draws;
        if (got[r].token != want[r].token) {
            const bool adjacent = !p.is_greedy() && neighbours(row, p, states[r], got[r].token, want[r].token);
            if (!adjacent) {
                ADD_FAILURE() << what << ": GPU token " << got[r].token << ", CPU token " << want[r].token;
                continue;
            }
            ++tally.flips;
            std::printf("rounding flip: %s: GPU %d CPU %d (u = %.17g)\n", what.c_str(), got[r].token,
                        want[r].token, cpu::sample_uniform(p.seed, states[r].step));
            continue;
        }
        // Log-probabilities: both from double sums, rounded to float; 1e-4 is the contract.
        auto close = [](float g, float w) { return (std::isinf(w) && g == w) || std::abs(double(g) - w) <= 1e-4; };
        EXPECT_TRUE(close(got[r].logprob, want[r].logprob))
            << what << ": logprob " << got[r].logprob << " vs " << want[r].logprob;
        ASSERT_EQ(got[r].top.size(), want[r].top.size()) << what;
        for (size_t i = 0; i < want[r].top.size(); ++i) {
            EXPECT_EQ(got[r].top[i].first, want[r].top[i].first) << what << " top " << i;
            EXPECT_TRUE(close(got[r].top[i].second, want[r].top[i].second))
                << what << " top " << i << ": " << got[r].top[i].second << " vs " << want[r].top[i].second;
        }
    }
}

void expect_few_flips(const Tally& t) {
    std::printf("%d draws, %d rounding flips\n", t.draws, t.flips);
    EXPECT_LE(t.flips * 2000, std::max(t.draws, 2000)) << "more rounding flips than the rule allows";
}

// Random parameters from the combinations the engine accepts.
SamplingParams random_params(std::mt19937& rng, int vocab, Histories& h, SamplingState& s) {
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
std::vector<float> random_logits(std::mt19937& rng, int n_rows, int vocab) {
    std::vector<float> x(size_t(n_rows) * vocab);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int r = 0; r < n_rows; ++r) {
        float* row = x.data() + size_t(r) * vocab;
        const int kind = int(rng() % 4);
        const float scale = kind == 0 ? 3.0f : 1.0f;
        for (int t = 0; t < vocab; ++t) row[t] = scale * normal(rng);
        if (kind == 0)
            for (int i = 0; i < 8; ++i) row[rng() % vocab] += 12.0f + float(i);  // a few likely tokens
        if (kind == 2)
            for (int t = 0; t < vocab; ++t) row[t] = std::round(row[t] * 2.0f) / 2.0f;  // ties
        if (kind == 3) {
            row[rng() % vocab] = NAN;
            row[rng() % vocab] = -kInf;
            row[rng() % vocab] = -0.0f;
        }
    }
    return x;
}

void random_case(int vocab, int n_rows, int repeats) {
    const uint32_t seed = test::fresh_seed();
    std::mt19937 rng(seed);
    Tally tally;
    for (int rep = 0; rep < repeats; ++rep) {
        Histories h;
        h.prompt.reserve(size_t(n_rows)), h.output.reserve(size_t(n_rows));
        std::vector<SamplingParams> params(static_cast<size_t>(n_rows));
        std::vector<SamplingState> states(static_cast<size_t>(n_rows));
        for (int r = 0; r < n_rows; ++r) params[size_t(r)] = random_params(rng, vocab, h, states[size_t(r)]);
        compare(random_logits(rng, n_rows, vocab), vocab, params, states, tally);
    }
    expect_few_flips(tally);
}

TEST(cuda_sampling, uniform_matches_cpu_bit_for_bit) {
    std::mt19937_64 rng(test::fresh_seed());
    const int n = 4096;
    std::vector<uint64_t> seeds(n), steps(n);
    for (int i = 0; i < n; ++i) seeds[size_t(i)] = i < 16 ? uint64_t(i) : rng(), steps[size_t(i)] = i % 3 ? rng() % 100000 : rng();
    auto d_seeds = test::to_device(seeds), d_steps = test::to_device(steps);
    auto d_out = test::poisoned<double>(n);
    uniform_kernel<<<(n + 255) / 256, 256>>>(d_seeds.get(), d_steps.get(), d_out.get(), n);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = d_out.download();
    for (int i = 0; i < n; ++i)
        ASSERT_EQ(got[size_t(i)], cpu::sample_uniform(seeds[size_t(i)], steps[size_t(i)])) << "pair " << i;
}

// Below one CTA's worth of ids, exactly one, one more; a chunk's worth and around it; the real vocab.
TEST(cuda_sampling, tiny_vocab) { random_case(5, 16, 4); }
TEST(cuda_sampling, vocab_around_cta_size) {
    random_case(cuda::kSampleThreads - 1, 16, 2);
    random_case(cuda::kSampleThreads, 16, 2);
    random_case(cuda::kSampleThreads + 1, 16, 2);
}
TEST(cuda_sampling, vocab_around_chunk_size) {
    random_case(cuda::kSampleChunk - 1, 16, 2);
    random_case(cuda::kSampleChunk, 16, 2);
    random_case(cuda::kSampleChunk + 1, 16, 2);
    random_case(5000, 24, 2);
}
TEST(cuda_sampling, real_vocab_batch_128) { random_case(201088, 128, 1); }

// Uniform logits: top-p and a large top-k walk many chunks of the sorted order (ties by id throughout).
TEST(cuda_sampling, flat_rows_walk_many_chunks) {
    const int vocab = 201088;
    std::vector<SamplingParams> params(6);
    std::vector<SamplingState> states(6);
    params[0].top_p = 0.5f;
    params[1].top_k = 5000;
    params[2].top_k = 70000, params[2].top_p = 0.3f;
    params[3].min_p = 0.5f, params[3].top_logprobs = 20;  // every token is a candidate
    params[4].top_p = 0.999f, params[4].temperature = 0.5f;
    params[5].top_k = 3, params[5].top_logprobs = 20;
    for (size_t r = 0; r < params.size(); ++r) params[r].seed = 1000 + r, states[r].step = r;
    std::vector<float> logits(params.size() * vocab, 0.25f);
    for (int t = 0; t < vocab; t += 7) logits[size_t(4) * vocab + size_t(t)] = 0.0f;  // two levels in row 4
    Tally tally;
    compare(logits, vocab, params, states, tally);
    expect_few_flips(tally);
}

// NaN-only rows, rows masked to -inf by bias, +inf logits: the CPU's degenerate rules.
TEST(cuda_sampling, degenerate_rows) {
    const int vocab = 3000;
    std::vector<float> logits(4 * size_t(vocab), 0.0f);
    std::fill(logits.begin(), logits.begin() + vocab, NAN);
    for (int t = 0; t < vocab; ++t) logits[size_t(vocab) + t] = -kInf;
    logits[size_t(vocab) + 17] = 1.0f;  // biased away below
    logits[2 * size_t(vocab) + 5] = kInf, logits[2 * size_t(vocab) + 9] = kInf;
    std::vector<SamplingParams> params(4);
    std::vector<SamplingState> states(4);
    for (auto& p : params) p.top_logprobs = 3, p.top_p = 0.9f;
    params[1].logit_bias = {{17, -kInf}};
    params[3].logit_bias = {{2999, kInf}};
    params[3].temperature = 0.0f;
    Tally tally;
    compare(logits, vocab, params, states, tally);
    EXPECT_EQ(tally.flips, 0);
}

// A long history (more ids than threads) with repeats, all penalties at once, through the Sampler class
// twice (the second call checks the counts scratch was left zero by the first).
TEST(cuda_sampling, sampler_class_with_long_histories) {
    const uint32_t seed = test::fresh_seed();
    std::mt19937 rng(seed);
    const int vocab = 201088, n_rows = 4;
    std::vector<std::vector<int32_t>> prompt(n_rows), output(n_rows);
    std::vector<SamplingParams> params(n_rows);
    std::vector<SamplingState> states(n_rows);
    for (int r = 0; r < n_rows; ++r) {
        for (int i = 0; i < 3000; ++i) prompt[size_t(r)].push_back(int(rng() % 2000));
        for (int i = 0; i < 1500; ++i) output[size_t(r)].push_back(int(rng() % 500));
        SamplingParams& p = params[size_t(r)];
        p.temperature = 0.8f, p.repetition_penalty = 1.3f, p.frequency_penalty = 0.2f, p.presence_penalty = 0.5f;
        p.top_logprobs = 20, p.seed = rng();
        if (r == 1) p.top_p = 0.9f;
        if (r == 2) p.top_k = 40;
        if (r == 3) p.temperature = 0.0f;
        states[size_t(r)] = {prompt[size_t(r)].data(), 3000, output[size_t(r)].data(), 1500, uint64_t(r)};
    }
    const std::vector<float> logits = random_logits(rng, n_rows, vocab);
    auto d_logits = test::to_device(logits);
    cuda::Sampler sampler;
    std::vector<SampleResult> want(n_rows);
    cpu::sample_rows(logits, vocab, params, states, want);
    for (int call = 0; call < 2; ++call) {
        std::vector<SampleResult> got(n_rows);
        sampler.sample(d_logits.get(), vocab, 0, params, states, got, nullptr);
        for (int r = 0; r < n_rows; ++r) {
            EXPECT_EQ(got[size_t(r)].token, want[size_t(r)].token) << "call " << call << " row " << r;
            EXPECT_NEAR(got[size_t(r)].logprob, want[size_t(r)].logprob, 1e-4) << "call " << call << " row " << r;
            ASSERT_EQ(got[size_t(r)].top.size(), 20u);
            for (int i = 0; i < 20; ++i) EXPECT_EQ(got[size_t(r)].top[size_t(i)].first, want[size_t(r)].top[size_t(i)].first);
        }
    }
    // The logits on the device are not modified by sampling (bit for bit: some rows hold a NaN, which
    // would never compare equal as a float).
    const std::vector<float> after = d_logits.download();
    ASSERT_EQ(after.size(), logits.size());
    EXPECT_EQ(std::memcmp(after.data(), logits.data(), logits.size() * sizeof(float)), 0);
}

TEST(cuda_sampling, bad_input_is_an_error) {
    const int vocab = 100;
    auto d_logits = test::to_device(std::vector<float>(vocab, 0.0f));
    cuda::Sampler sampler;
    std::vector<SampleResult> out(1);
    std::vector<SamplingParams> params(1);
    std::vector<SamplingState> states(1);
    params[0].logit_bias = {{vocab, 1.0f}};
    EXPECT_THROW(sampler.sample(d_logits.get(), vocab, 0, params, states, out, nullptr), Error);
    params[0].logit_bias.clear();
    params[0].top_logprobs = 21;
    EXPECT_THROW(sampler.sample(d_logits.get(), vocab, 0, params, states, out, nullptr), Error);
}

}  // namespace
}  // namespace osprey
