// The CUDA forward (model/cuda/gpt_oss_cuda.h) against the CPU reference (model/gpt_oss_ref.h) on
// the synthetic tiny checkpoint (4 layers, d_model 128, 8 query / 1 KV heads, 8 experts, real vocab
// and RoPE, sliding window 128): a prompt longer than the window in chunks, 32 greedy steps, a mixed
// ragged batch (prefill + decode + a prefix-cache replay together), CUDA-graph decode, a copied cache
// continuing like its source, and every intermediate step layer by layer (those checks are shared with
// test_cuda_fp8_kv: tests/model/cuda_kv_checks.h), prompt scoring and bad batches.
//
// Bound: the GPU path rounds the GEMM/attention inputs to BF16 (2^-9 relative each) and keeps K/V
// in BF16, where the reference keeps FP32 throughout. The synthetic model is well-conditioned
// (each layer's update ~5% of the residual), so these roundings stay at the 1e-3..1e-2 level: we
// require the relative L2 error of every logit row below 2e-2, identical greedy tokens, and every
// intermediate below 3e-2 (router logits included; routing flips on near-ties are counted, not hidden).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "model/cuda_kv_checks.h"

namespace osprey::model {
namespace {

constexpr double kLogitBound = 2e-2;
constexpr double kStepBound = 3e-2;
constexpr test::KvCase kBf16{KvDtype::bf16, kLogitBound, kStepBound};

using test::random_prompt;

struct Pair : test::KvPair {
    explicit Pair(bool graphs) : KvPair(KvDtype::bf16, graphs) {}
};

TEST(cuda_forward, long_prompt_in_chunks_then_32_greedy_steps) {
    test::long_prompt_in_chunks_then_32_greedy_steps(kBf16);
}

// Prompt scoring (issue 15): a batch of two prefill chunks (one scored over more than kScoreRows
// positions, one ending at its last prompt token so it also samples) and a decode token gives the
// reference's prompt scores (log-probabilities within 2e-2, the same top token where the reference's
// margin is clear) and leaves the sampled rows' logits as an unscored batch has them.
TEST(cuda_forward, prompt_scores_match_the_reference) {
    Pair p(/*graphs=*/false);
    std::vector<test::Seq> seqs(3);
    for (int i = 0; i < 3; ++i) {
        seqs[i].tokens = random_prompt(150, 300 + i);
        seqs[i].pages = test::pages_from(i * 40, 40);
        seqs[i].window_slot = 2 * i + 1;
    }
    // seq 2 first computes 20 tokens so that it can decode in the scored step.
    {
        ForwardBatch b;
        b.tokens.assign(seqs[2].tokens.begin(), seqs[2].tokens.begin() + 20);
        b.slices.push_back(test::slice_for(seqs[2], 0, 20));
        p.forward(b);
        seqs[2].n_computed = 20;
    }
    ForwardBatch b;
    // seq 0: 100 of its 150 tokens, all scored (its last scored position does not sample: no logits).
    // seq 1: 40 tokens as a whole prompt of 40: the first 39 scored, the last samples.
    // seq 2: one decode token.
    const std::vector<std::pair<int, int>> plan = {{0, 100}, {1, 40}, {2, 1}};
    for (auto [i, n] : plan) {
        test::Seq& s = seqs[size_t(i)];
        SequenceSlice sl = test::slice_for(s, b.n_tokens(), n);
        b.tokens.insert(b.tokens.end(), s.tokens.begin() + s.n_computed, s.tokens.begin() + s.n_computed + n);
        if (i == 0) {
            sl.want_logits = false;
            sl.score_top_k = 5;
            for (int t = 0; t < n; ++t) sl.score_targets.push_back(s.tokens[size_t(s.n_computed + t + 1)]);
        } else if (i == 1) {
            sl.score_top_k = 0;
            for (int t = 0; t < n; ++t) sl.score_targets.push_back(t + 1 < n ? s.tokens[size_t(t + 1)] : -1);
        }
        b.slices.push_back(sl);
        s.n_computed += n;
    }
    const double err = p.forward(b);
    EXPECT_LT(err, kLogitBound) << "the sampled rows' logits";
    std::vector<TokenScore> want, got;
    p.cpu.take_prompt_scores(want);
    p.gpu.take_prompt_scores(got);
    ASSERT_EQ(want.size(), size_t(100 + 39));
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    int top_checked = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::abs(double(got[i].logprob) - want[i].logprob));
        ASSERT_EQ(got[i].top.size(), want[i].top.size()) << "position " << i;
        if (want[i].top.size() >= 2 && want[i].top[0].second - want[i].top[1].second > 0.05f) {
            EXPECT_EQ(got[i].top[0].first, want[i].top[0].first) << "position " << i;
            ++top_checked;
        }
    }
    std::printf("  %zu scored positions: worst logprob difference %.2e, %d top tokens compared\n", want.size(),
                worst, top_checked);
    EXPECT_LT(worst, 2e-2);
}

TEST(cuda_forward, mixed_ragged_batch) { test::mixed_ragged_batch(kBf16); }

TEST(cuda_forward, graph_decode_matches_eager) { test::graph_decode_matches_eager(KvDtype::bf16); }

TEST(cuda_forward, copied_kv_continues_exactly_like_its_source) {
    test::copied_kv_continues_exactly_like_its_source(kBf16);
}

TEST(cuda_forward, every_step_matches_the_reference) { test::every_step_matches_the_reference(kBf16); }

// The decode MoE reading the decode-layout copy of the experts (CudaRunnerOptions::moe_decode_copy,
// kernels/cuda/mxfp4_words.h): the same 32 greedy steps as the reference, from CUDA graphs.
TEST(cuda_forward, decode_layout_copy_then_32_greedy_steps) {
    CudaRunnerOptions o = test::tiny_cuda_options(/*graphs=*/true);
    o.moe_decode_copy = true;
    test::CudaCpuPair p(test::tiny_weights(), test::reference_options_for(KvDtype::bf16), o);
    test::prompt_in_chunks_then_32_greedy_steps(p, random_prompt(320, 11), {200, 120}, kLogitBound);
}

TEST(cuda_forward, rejects_bad_batches) {
    Pair p(false);
    ForwardBatch b;
    b.tokens = {201088};  // outside the vocabulary
    SequenceSlice sl;
    sl.n_tokens = 1;
    sl.pages = {0};
    b.slices.push_back(sl);
    EXPECT_THROW(p.gpu.forward(b), Error);
    b.tokens = {5};
    b.slices[0].window_slot = 99;
    EXPECT_THROW(p.gpu.forward(b), Error);
    b.slices[0].window_slot = 0;
    b.slices[0].pages = {};
    EXPECT_THROW(p.gpu.forward(b), Error);
}

}  // namespace
}  // namespace osprey::model
