// The CUDA runner with the FP8 KV cache (CudaRunnerOptions::kv_dtype = fp8_e4m3, kernels/cuda/kv_fp8.h)
// against the CPU reference with its FP8 KV cache (docs/fp8.md), on the synthetic tiny checkpoint
// (4 layers, 8 query / 1 KV heads, sliding window 128): a prompt longer than the window in chunks then
// 32 greedy steps, prefill in one chunk vs several vs token by token, a mixed ragged batch with a
// prefix-cache replay, graph decode vs eager, a copied cache continuing like its source, speculative
// verify steps with rollbacks, and every intermediate layer by layer. The checks test_cuda_forward
// also runs with the BF16 cache are written once, in tests/model/cuda_kv_checks.h.
//
// Bounds, as tests/model/test_cuda_forward.cu (architecture.md, "Comparing implementations on random
// weights"): the same BF16 roundings of the GPU path, plus the quantisation's inputs: the GPU quantises
// the BF16 roped K (the reference its FP32 K), so a few percent of the codes land one E4M3 step apart.
// FP8 KV against exact KV moves the tiny model's logits by ~1.5e-3 (docs/fp8.md), so those flips stay
// far below the BF16 path's own error: the same 2e-2 on logits, 3e-2 per step, identical greedy tokens.
#include <gtest/gtest.h>

#include <cstdio>

#include "model/cuda_kv_checks.h"

namespace osprey::model {
namespace {

constexpr double kLogitBound = 2e-2;
constexpr double kStepBound = 3e-2;
constexpr test::KvCase kFp8{KvDtype::fp8_e4m3, kLogitBound, kStepBound};

using test::random_prompt;
using test::rel_l2;
using test::tiny_weights;

CudaRunnerOptions fp8_options(bool graphs) { return test::tiny_cuda_options(graphs, KvDtype::fp8_e4m3); }

TEST(cuda_fp8_kv, runner_reports_fp8_and_sizes_its_cache_by_the_spec) {
    CudaRunner gpu(tiny_weights(), fp8_options(false));
    EXPECT_EQ(gpu.kv_dtype(), KvDtype::fp8_e4m3);
    const KvSpec spec = gpu.kv_spec(16);
    EXPECT_EQ(spec.dtype(), KvDtype::fp8_e4m3);
    // One K (or V) row: kv_dim codes and a 4-byte multiplier per KV head.
    EXPECT_EQ(spec.tensor_row_bytes(), size_t(spec.kv_dim() + 4 * spec.n_kv_heads()));
    CudaRunner bf(tiny_weights(), CudaRunnerOptions{.max_tokens = 64, .max_logit_rows = 4, .max_slices = 4,
                                                    .progress = false});
    EXPECT_EQ(bf.kv_dtype(), KvDtype::bf16);
    const double ratio = double(bf.kv_spec(16).bytes_per_page()) / double(spec.bytes_per_page());
    std::printf("  tokens per byte, fp8 / bf16: %.3f\n", ratio);
    EXPECT_GT(ratio, 1.75);  // 2 · 64 / (64 + 4) = 1.88 for head_dim 64
    // Allocation takes exactly the spec's bytes out of the budget.
    const size_t before = gpu.kv_budget_bytes();
    const KvLayout layout = kv_layout_for(gpu, 16, 64, 4);
    gpu.allocate_kv(layout);
    const size_t after = gpu.kv_budget_bytes();
    EXPECT_NEAR(double(before), double(after), 64.0 * (1 << 20));  // the budget counts what the cache holds (allocation granularity aside)
}

TEST(cuda_fp8_kv, long_prompt_in_chunks_then_32_greedy_steps) {
    test::long_prompt_in_chunks_then_32_greedy_steps(kFp8);
}

// The same 300-token prompt in one chunk, in chunks of 100/77/123, and token by token (decode steps
// through the FP8 decode kernel): every mode stores the same codes (rope() quantises each row once
// whatever the chunking), so the last position's logits agree to the kernels' BF16 roundings (the
// prefill kernels stage BF16(code · s), decode scales S in FP32), and the next 8 greedy tokens agree.
TEST(cuda_fp8_kv, prefill_in_one_chunk_several_or_token_by_token_agree) {
    const std::vector<int32_t> prompt = random_prompt(300, 77);
    const std::vector<std::vector<int>> modes = {{300}, {100, 77, 123}, std::vector<int>(300, 1)};
    std::vector<std::vector<float>> last;
    std::vector<std::vector<int32_t>> continuations;
    for (const auto& chunks : modes) {
        CudaRunner gpu(tiny_weights(), fp8_options(false));
        gpu.allocate_kv(kv_layout_for(gpu, 16, 64, 4));
        test::Seq s;
        s.tokens = prompt;
        s.pages = test::pages_from(0, 40);
        s.window_slot = 2;
        for (int n : chunks) {
            ForwardBatch b;
            b.tokens.assign(s.tokens.begin() + s.n_computed, s.tokens.begin() + s.n_computed + n);
            b.slices.push_back(test::slice_for(s, 0, n));
            gpu.forward(b);
            s.n_computed += n;
        }
        std::vector<float> l;
        gpu.logits_to_host(l);
        last.push_back(l);
        std::vector<int32_t> cont;
        for (int i = 0; i < 8; ++i) {
            std::vector<int32_t> g;
            gpu.greedy(g);
            cont.push_back(g.at(0));
            s.tokens.push_back(g[0]);
            ForwardBatch b;
            b.tokens = {g[0]};
            b.slices.push_back(test::slice_for(s, 0, 1));
            gpu.forward(b);
            s.n_computed += 1;
        }
        continuations.push_back(cont);
    }
    for (size_t m = 1; m < modes.size(); ++m) {
        const double err = rel_l2(last[m], last[0]);
        std::printf("  mode %zu vs one chunk: last logits rel err %.2e\n", m, err);
        EXPECT_LT(err, 1e-2) << "mode " << m;
        EXPECT_EQ(continuations[m], continuations[0]) << "mode " << m;
    }
}

TEST(cuda_fp8_kv, mixed_ragged_batch) { test::mixed_ragged_batch(kFp8); }

TEST(cuda_fp8_kv, graph_decode_matches_eager) { test::graph_decode_matches_eager(KvDtype::fp8_e4m3); }

TEST(cuda_fp8_kv, copied_kv_continues_exactly_like_its_source) {
    test::copied_kv_continues_exactly_like_its_source(kFp8);
}

TEST(cuda_fp8_kv, every_step_matches_the_reference) { test::every_step_matches_the_reference(kFp8); }

// Speculative verify steps (5 tokens, every one with a logit row: the prefill kernels, replayed from a
// CUDA graph once the shape recurs) and rollbacks (2 of 5 kept: the rejected rows stay written in the
// pages and in the ring's slack rows, and are overwritten later), on rings with 4 spare rows as the
// engine allocates them (kv_spec.h), against the CPU reference doing the same.
TEST(cuda_fp8_kv, verify_steps_and_rollbacks_match_the_reference) {
    CpuReference cpu(tiny_weights(), CpuReferenceOptions{.kv_dtype = KvDtype::fp8_e4m3});
    CudaRunner gpu(tiny_weights(), fp8_options(/*graphs=*/true));
    for (ModelRunner* m : std::initializer_list<ModelRunner*>{&cpu, &gpu}) {
        KvLayout layout = kv_layout_for(*m, 16, 64, 4);
        layout.spec = layout.spec.with_ring_slack(4);
        m->allocate_kv(layout);
    }
    test::Seq s;
    s.tokens = random_prompt(400, 55);
    s.pages = test::pages_from(0, 30);
    s.window_slot = 2;
    auto step = [&](int n, int n_logits) {
        ForwardBatch b;
        b.tokens.assign(s.tokens.begin() + s.n_computed, s.tokens.begin() + s.n_computed + n);
        SequenceSlice sl = test::slice_for(s, 0, n);
        sl.n_logits = n_logits;
        b.slices.push_back(sl);
        cpu.forward(b);
        gpu.forward(b);
        std::vector<float> lc, lg;
        cpu.logits_to_host(lc);
        gpu.logits_to_host(lg);
        EXPECT_EQ(lc.size(), lg.size());
        const size_t V = size_t(cpu.config().vocab_size);
        double worst = 0;
        for (size_t r = 0; r < lc.size() / V; ++r)
            worst = std::max(worst, rel_l2(std::span(lg).subspan(r * V, V), std::span(lc).subspan(r * V, V)));
        return worst;
    };
    EXPECT_LT(step(150, 1), kLogitBound);
    s.n_computed = 150;
    double worst = 0;
    for (int i = 0; i < 40; ++i) {
        worst = std::max(worst, step(5, 5));
        s.n_computed += 2;  // 2 of the 5 accepted; the rest rolled back
    }
    std::printf("  40 verify steps with rollbacks: worst logits rel err %.2e, %d graphs\n", worst,
                gpu.graphs_captured());
    EXPECT_LT(worst, kLogitBound);
    EXPECT_GE(gpu.graphs_captured(), 1);
}

TEST(cuda_fp8_kv, rejects_other_dtypes) {
    EXPECT_THROW(CudaRunner(tiny_weights(), CudaRunnerOptions{.max_tokens = 64, .progress = false,
                                                              .kv_dtype = KvDtype::f32}),
                 Error);
    CudaRunner gpu(tiny_weights(), fp8_options(false));
    CudaRunner bf(tiny_weights(), CudaRunnerOptions{.max_tokens = 64, .max_logit_rows = 4, .max_slices = 4,
                                                    .progress = false});
    EXPECT_THROW(gpu.allocate_kv(kv_layout_for(bf, 16, 8, 2)), Error);  // a BF16 layout for an FP8 runner
}

}  // namespace
}  // namespace osprey::model
