// CUDA sampler against the CPU sampler: every checked case of the sampling table
// (tests/kernels/cases/sampling_cases.h, shared with bench/bench_sampling.cu: vocabularies around the
// kernel's tile constants with random parameters, the real 201088 with bench_sampling's parameter sets),
// plus the cases that need hand-made logits or parameters: the draw's uniform bit for bit, flat rows that
// walk many chunks, degenerate rows, the Sampler class with long histories, bad input.
// The exactness rule (at most one rounding flip per 2000 draws, between neighbours) is in the table's header.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kernels/cases/gtest_cases.h"
#include "kernels/cases/sampling_cases.h"

namespace osprey {
namespace {

using namespace cases::sampling;

class cuda_sampling_table : public cases::CaseTest {};
TEST_P(cuda_sampling_table, matches_cpu) { cases::check_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(cases, cuda_sampling_table, cases::checked(cases::sampling::cases(), cases::sampling::run),
                         cases::case_name);

__global__ void uniform_kernel(const uint64_t* seeds, const uint64_t* steps, double* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = cuda::sample_uniform_hd(seeds[i], steps[i]);
}

TEST(cuda_sampling, uniform_matches_cpu_bit_for_bit) {
    std::mt19937_64 rng(cases::case_seed(cases::Mode::check));
    const int n = 4096;
    std::vector<uint64_t> seeds(n), steps(n);
    for (int i = 0; i < n; ++i)
        seeds[size_t(i)] = i < 16 ? uint64_t(i) : rng(), steps[size_t(i)] = i % 3 ? rng() % 100000 : rng();
    auto d_seeds = cases::to_device(seeds), d_steps = cases::to_device(steps);
    auto d_out = cases::poisoned<double>(n);
    uniform_kernel<<<(n + 255) / 256, 256>>>(d_seeds.get(), d_steps.get(), d_out.get(), n);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = d_out.download();
    for (int i = 0; i < n; ++i)
        ASSERT_EQ(got[size_t(i)], cpu::sample_uniform(seeds[size_t(i)], steps[size_t(i)])) << "pair " << i;
}

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
    cases::Result r;
    Tally tally;
    compare(r, logits, vocab, params, states, tally);
    expect_few_flips(r, tally);
    cases::expect_passed(r);
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
    cases::Result r;
    Tally tally;
    compare(r, logits, vocab, params, states, tally);
    cases::expect_passed(r);
    EXPECT_EQ(tally.flips, 0);
}

// A long history (more ids than threads) with repeats, all penalties at once, through the Sampler class
// twice (the second call checks the counts scratch was left zero by the first).
TEST(cuda_sampling, sampler_class_with_long_histories) {
    std::mt19937 rng(cases::case_seed(cases::Mode::check));
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
    auto d_logits = cases::to_device(logits);
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
            for (int i = 0; i < 20; ++i)
                EXPECT_EQ(got[size_t(r)].top[size_t(i)].first, want[size_t(r)].top[size_t(i)].first);
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
    auto d_logits = cases::to_device(std::vector<float>(vocab, 0.0f));
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
