// The end-to-end checks of the CUDA runner against the CPU reference that do not depend on the KV
// cache's element type, written once and run by test_cuda_forward (BF16 KV cache, the reference in
// FP32) and test_cuda_fp8_kv (FP8 KV cache, the reference with its own FP8 cache): a prompt longer than
// the window in chunks then 32 greedy steps, a mixed ragged batch with a prefix-cache replay, CUDA-graph
// decode against eager, a copied cache continuing like its source, and every intermediate layer by
// layer. Each test file keeps its own bounds (KvCase) and its reasons for them.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "model/cuda_test_util.h"

namespace osprey::model::test {

// The KV cache a test file runs the checks with, and its bounds on the relative L2 error of every logit
// row and of every intermediate against the reference.
struct KvCase {
    KvDtype kv_dtype;  // the CUDA runner's: bf16 or fp8_e4m3
    double logit_bound;
    double step_bound;
};

// The reference's KV cache for a CUDA runner's: FP8 with FP8, else exact (FP32).
inline CpuReferenceOptions reference_options_for(KvDtype gpu_kv) {
    CpuReferenceOptions o;
    if (gpu_kv == KvDtype::fp8_e4m3) o.kv_dtype = KvDtype::fp8_e4m3;
    return o;
}

struct KvPair : CudaCpuPair {
    KvPair(KvDtype kv, bool graphs)
        : CudaCpuPair(tiny_weights(), reference_options_for(kv), tiny_cuda_options(graphs, kv)) {}
};

// A 320-token prompt in two chunks (200 + 120), then 32 greedy steps (cuda_test_util.h).
inline void long_prompt_in_chunks_then_32_greedy_steps(const KvCase& c) {
    KvPair p(c.kv_dtype, /*graphs=*/false);
    prompt_in_chunks_then_32_greedy_steps(p, random_prompt(320, 11), {200, 120}, c.logit_bound);
}

// A step mixing a prefill chunk, decode tokens and a prefix-cache replay (n_full_kv_cached), in one
// batch, against the reference running the very same batches.
inline void mixed_ragged_batch(const KvCase& c) {
    KvPair p(c.kv_dtype, /*graphs=*/false);
    std::vector<Seq> seqs(3);
    for (int i = 0; i < 3; ++i) {
        seqs[i].tokens = random_prompt(400, 100 + i);
        seqs[i].pages = pages_from(i * 40, 40);
        seqs[i].window_slot = 2 * i + 1;
    }
    // Step 1: A prefills 150, B prefills 5.
    // Step 2: A decodes 1, B prefills 140 (crossing the window), C prefills 30.
    // Step 3: A decodes, B decodes, C decodes.
    // Step 4: C replays its last 20 tokens (full-layer K/V cached) plus 10 new ones, A and B decode.
    const std::vector<std::vector<std::pair<int, int>>> plan = {
        {{0, 150}, {1, 5}}, {{0, 1}, {1, 140}, {2, 30}}, {{2, 1}, {0, 1}, {1, 1}}, {{0, 1}, {2, 30}, {1, 1}}};
    for (size_t k = 0; k < plan.size(); ++k) {
        ForwardBatch b;
        for (auto [i, n] : plan[k]) {
            Seq& s = seqs[i];
            int replay = 0;
            if (k == 3 && i == 2) {  // prefix-cache style replay: recompute 20 cached positions
                replay = 20;
                s.n_computed -= replay;
                s.window_first = s.n_computed;  // into a ring that restarts there, as after a prefix hit
            }
            SequenceSlice sl = slice_for(s, b.n_tokens(), n, replay);
            b.tokens.insert(b.tokens.end(), s.tokens.begin() + s.n_computed, s.tokens.begin() + s.n_computed + n);
            b.slices.push_back(sl);
            s.n_computed += n;
        }
        const double err = p.forward(b);
        std::printf("  step %zu (%d tokens, %zu slices): logits rel err %.2e\n", k, b.n_tokens(), b.slices.size(), err);
        EXPECT_LT(err, c.logit_bound) << "step " << k;
    }
}

// Decode steps replayed from CUDA graphs (with the FP8 cache, the RoPE kernel's fused store inside)
// give the same logits as eager launches.
inline void graph_decode_matches_eager(KvDtype kv) {
    CudaRunner eager(tiny_weights(), tiny_cuda_options(false, kv)), graphed(tiny_weights(), tiny_cuda_options(true, kv));
    for (CudaRunner* r : {&eager, &graphed}) r->allocate_kv(kv_layout_for(*r, 16, 256, 8));
    std::vector<Seq> seqs(2);
    for (int i = 0; i < 2; ++i) {
        seqs[i].tokens = random_prompt(200, 300 + i);
        seqs[i].pages = pages_from(i * 40, 40);
        seqs[i].window_slot = i;
    }
    auto run = [&](const ForwardBatch& b) {
        eager.forward(b);
        graphed.forward(b);
        std::vector<float> a, g;
        eager.logits_to_host(a);
        graphed.logits_to_host(g);
        return rel_l2(g, a);
    };
    ForwardBatch pre;
    for (int i = 0; i < 2; ++i) {
        pre.slices.push_back(slice_for(seqs[i], pre.n_tokens(), 150));
        pre.tokens.insert(pre.tokens.end(), seqs[i].tokens.begin(), seqs[i].tokens.begin() + 150);
        seqs[i].n_computed = 150;
    }
    EXPECT_EQ(run(pre), 0.0);
    for (int step = 0; step < 20; ++step) {
        ForwardBatch b;
        for (int i = 0; i < 2; ++i) {
            b.slices.push_back(slice_for(seqs[i], i, 1));
            b.tokens.push_back(seqs[i].tokens[seqs[i].n_computed]);
            seqs[i].n_computed += 1;
        }
        // Same kernels; only the KV split boundaries differ (graphs use a fixed split count), which
        // reorders FP32 sums and can move a BF16 rounding by one ulp here and there.
        EXPECT_LT(run(b), 1e-3) << "decode step " << step;
    }
    EXPECT_EQ(graphed.graphs_captured(), 1);
}

// copy_kv forks a sequence on the GPU (with the FP8 cache: codes and multipliers): B gets A's pages
// (partial last page, longer than the window) and ring, then A and B decode the same tokens in one
// batch: bit-identical rows, equal to the reference decoding A; a bad copy is refused.
inline void copied_kv_continues_exactly_like_its_source(const KvCase& c) {
    KvPair p(c.kv_dtype, /*graphs=*/true);
    Seq a;
    a.tokens = random_prompt(220, 21);
    a.pages = pages_from(0, 16);
    a.window_slot = 1;
    ForwardBatch pre;
    pre.tokens.assign(a.tokens.begin(), a.tokens.begin() + 200);
    pre.slices.push_back(slice_for(a, 0, 200));
    p.forward(pre);
    a.n_computed = 200;
    Seq b = a;
    b.pages = {100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 60, 61, 62};
    b.window_slot = 6;
    KvCopy copy{.src_slot = 1, .dst_slot = 6};
    copy.src_pages = pages_from(0, 13);  // 200 positions: 12 whole pages of 16 and a partial one
    copy.dst_pages.assign(b.pages.begin(), b.pages.begin() + 13);
    p.gpu.copy_kv(plan_kv_copy(copy, p.gpu_layout));
    double worst = 0;
    for (int step = 0; step < 20; ++step) {
        const int32_t t = a.tokens[size_t(a.n_computed)];
        ForwardBatch both;
        both.tokens = {t, t};
        both.slices = {slice_for(a, 0, 1), slice_for(b, 1, 1)};
        p.gpu.forward(both);
        std::vector<float> g;
        p.gpu.logits_to_host(g);
        const size_t V = size_t(p.cpu.config().vocab_size);
        ASSERT_EQ(g.size(), 2 * V);
        ASSERT_TRUE(std::equal(g.begin(), g.begin() + V, g.begin() + V)) << "step " << step;
        ForwardBatch one;
        one.tokens = {t};
        one.slices = {slice_for(a, 0, 1)};
        p.cpu.forward(one);
        std::vector<float> l;
        p.cpu.logits_to_host(l);
        worst = std::max(worst, rel_l2(std::span(g).subspan(V, V), l));
        a.n_computed += 1;
        b.n_computed += 1;
    }
    std::printf("  20 forked decode steps: worst logits rel err %.2e\n", worst);
    EXPECT_LT(worst, c.logit_bound);
    EXPECT_THROW(plan_kv_copy({.src_pages = {0}, .dst_pages = {0}}, p.gpu_layout), Error);
    // A plan outside the allocated blocks is refused by the backend itself.
    EXPECT_THROW(p.gpu.copy_kv({.runs = {{KvGroupKind::paged, 0, 256 * 16, 16}}}), Error);
}

// Layer by layer on the same batch (a 180-token prefill): every intermediate the two paths share,
// within the step bound.
inline void every_step_matches_the_reference(const KvCase& c) {
    KvPair p(c.kv_dtype, /*graphs=*/false);
    expect_steps_match(p, prefill_batch(random_prompt(180, 5)), [&](const std::string&) { return c.step_bound; });
}

}  // namespace osprey::model::test
