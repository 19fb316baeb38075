// Host half of the CUDA sampler (kernels/cuda/sampling_pack.h): parameter validation, row flags,
// bias/history packing and scratch-row assignment, the shared seeded draw, result unpacking. CPU only.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "core/check.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cuda/sampling_pack.h"

namespace osprey {
namespace {

using cuda::pack_sample_rows;
using cuda::SamplePack;

TEST(sampling_pack, uniform_is_the_cpu_samplers_bit_for_bit) {
    std::mt19937_64 rng(12345);
    for (int i = 0; i < 10000; ++i) {
        const uint64_t seed = i < 100 ? uint64_t(i) : rng(), step = i % 2 ? uint64_t(i) : rng();
        ASSERT_EQ(cuda::sample_uniform_hd(seed, step), cpu::sample_uniform(seed, step)) << seed << " " << step;
    }
}

TEST(sampling_pack, flags_and_factors) {
    std::vector<SamplingParams> p(4);
    std::vector<SamplingState> s(4);
    p[0].temperature = 0.0f;
    p[1].temperature = 0.7f, p[1].top_k = 50, p[1].top_p = 0.9f, p[1].min_p = 0.05f;
    p[2].top_k = 1000;  // not below the vocabulary: no truncation
    p[3].top_logprobs = 20;
    s[1].step = 77, p[1].seed = 99;
    SamplePack pack;
    pack_sample_rows(p, s, 1000, pack);
    ASSERT_EQ(pack.rows.size(), 4u);
    EXPECT_EQ(pack.rows[0].flags, cuda::kSampleGreedy);
    EXPECT_EQ(pack.rows[0].inv_temperature, 1.0f);
    EXPECT_EQ(pack.rows[1].flags, cuda::kSampleTruncate | cuda::kSampleTopK | cuda::kSampleTopP | cuda::kSampleMinP);
    EXPECT_EQ(pack.rows[1].inv_temperature, 1.0f / 0.7f);
    EXPECT_EQ(pack.rows[1].log_min_p, std::log(0.05f));
    EXPECT_EQ(pack.rows[1].seed, 99u);
    EXPECT_EQ(pack.rows[1].step, 77u);
    EXPECT_EQ(pack.rows[2].flags, 0);
    EXPECT_EQ(pack.rows[3].top_logprobs, 20);
    EXPECT_EQ(pack.n_work_rows, 0);
    for (const auto& q : pack.rows) EXPECT_EQ(q.work_row, -1);
}

TEST(sampling_pack, bias_and_histories_are_packed_per_row) {
    const std::vector<int32_t> prompt0{1, 2, 3}, output0{4, 4}, prompt1{7}, output1{8, 9, 10};
    std::vector<SamplingParams> p(3);
    std::vector<SamplingState> s(3);
    p[0].repetition_penalty = 1.2f;                       // prompt and output
    p[0].logit_bias = {{5, 1.0f}, {5, 2.0f}};             // repeated entries are kept in order
    p[1].frequency_penalty = 0.5f;                        // output only
    p[2].logit_bias = {{0, -3.0f}};                       // bias only
    s[0] = {prompt0.data(), 3, output0.data(), 2, 0};
    s[1] = {prompt1.data(), 1, output1.data(), 3, 0};
    s[2] = {prompt1.data(), 1, output1.data(), 3, 0};     // no penalties: history not copied
    SamplePack pack;
    pack_sample_rows(p, s, 16, pack);
    EXPECT_EQ(pack.bias_ids, (std::vector<int32_t>{5, 5, 0}));
    EXPECT_EQ(pack.bias_values, (std::vector<float>{1.0f, 2.0f, -3.0f}));
    EXPECT_EQ(pack.history, (std::vector<int32_t>{1, 2, 3, 4, 4, 8, 9, 10}));
    EXPECT_EQ(pack.rows[0].flags & cuda::kSampleRepetition, cuda::kSampleRepetition);
    EXPECT_EQ(pack.rows[0].prompt_begin, 0);
    EXPECT_EQ(pack.rows[0].n_prompt, 3);
    EXPECT_EQ(pack.rows[0].output_begin, 3);
    EXPECT_EQ(pack.rows[0].n_output, 2);
    EXPECT_EQ(pack.rows[1].flags, cuda::kSampleCounted);
    EXPECT_EQ(pack.rows[1].n_prompt, 0);
    EXPECT_EQ(pack.rows[1].output_begin, 5);
    EXPECT_EQ(pack.rows[1].n_output, 3);
    EXPECT_EQ(pack.rows[2].bias_begin, 2);
    EXPECT_EQ(pack.rows[2].n_bias, 1);
    EXPECT_EQ(pack.rows[2].n_output, 0);
    EXPECT_EQ(pack.rows[0].work_row, 0);
    EXPECT_EQ(pack.rows[1].work_row, 1);
    EXPECT_EQ(pack.rows[2].work_row, 2);
    EXPECT_EQ(pack.n_work_rows, 3);
}

void expect_rejected(SamplingParams p, const char* what, int vocab = 100, SamplingState s = {}) {
    SamplePack pack;
    const std::vector<SamplingParams> ps{p};
    const std::vector<SamplingState> ss{s};
    try {
        pack_sample_rows(ps, ss, vocab, pack);
        ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
}

TEST(sampling_pack, bad_parameters_are_errors_naming_the_value) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    SamplingParams p;
    p.top_logprobs = 21;
    expect_rejected(p, "top_logprobs 21");
    p = {}, p.min_p = 1.5f;
    expect_rejected(p, "min_p 1.5");
    p = {}, p.repetition_penalty = 0.0f;
    expect_rejected(p, "repetition_penalty 0");
    p = {}, p.frequency_penalty = nan;
    expect_rejected(p, "frequency_penalty");
    p = {}, p.temperature = nan;
    expect_rejected(p, "temperature is NaN");
    p = {}, p.temperature = 1e-45f;
    expect_rejected(p, "too small");
    p = {}, p.top_p = nan;
    expect_rejected(p, "top_p is NaN");
    p = {}, p.logit_bias = {{100, 1.0f}};
    expect_rejected(p, "logit_bias token 100");
    p = {}, p.logit_bias = {{3, nan}};
    expect_rejected(p, "logit_bias for token 3 is NaN");
    const std::vector<int32_t> bad{1, -4};
    p = {}, p.presence_penalty = 0.5f;
    expect_rejected(p, "output token -4", 100, {nullptr, 0, bad.data(), 2, 0});
    p = {}, p.repetition_penalty = 1.1f;
    expect_rejected(p, "prompt token -4", 100, {bad.data(), 2, nullptr, 0, 0});
    expect_rejected(p, "no pointer", 100, {nullptr, 3, nullptr, 0, 0});
    SamplePack pack;
    EXPECT_THROW(pack_sample_rows(std::vector<SamplingParams>(1), std::vector<SamplingState>(1), 1 << 19, pack),
                 Error);
    EXPECT_THROW(pack_sample_rows(std::vector<SamplingParams>(2), std::vector<SamplingState>(1), 100, pack), Error);
}

TEST(sampling_pack, top_logprobs_are_clamped_to_the_vocabulary) {
    SamplingParams p;
    p.top_logprobs = 20;
    SamplePack pack;
    pack_sample_rows(std::vector<SamplingParams>{p}, std::vector<SamplingState>(1), 7, pack);
    EXPECT_EQ(pack.rows[0].top_logprobs, 7);
}

TEST(sampling_pack, unpack_checks_the_device_result) {
    cuda::SampleRowResult g;
    g.token = 42, g.logprob = -0.5f, g.n_top = 2;
    g.top_ids[0] = 42, g.top_ids[1] = 7;
    g.top_logprobs[0] = -0.5f, g.top_logprobs[1] = -1.5f;
    SampleResult r;
    cuda::unpack_sample_result(g, 0, r);
    EXPECT_EQ(r.token, 42);
    EXPECT_EQ(r.logprob, -0.5f);
    ASSERT_EQ(r.top.size(), 2u);
    EXPECT_EQ(r.top[1], (std::pair<int32_t, float>{7, -1.5f}));
    g.error = 1;
    EXPECT_THROW(cuda::unpack_sample_result(g, 0, r), Error);
    g.error = 0, g.n_top = 21;
    EXPECT_THROW(cuda::unpack_sample_result(g, 0, r), Error);
    g.n_top = 0, g.token = -1;
    EXPECT_THROW(cuda::unpack_sample_result(g, 0, r), Error);
}

}  // namespace
}  // namespace osprey
