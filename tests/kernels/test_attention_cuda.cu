// CUDA sink attention over the paged KV cache (kernels/cuda/attention.h) and the K/V store
// (kernels/cuda/kv_store.h) against the CPU reference (kernels/cpu/attention.h), for ragged batches:
// decode tokens with short and long contexts (one split, several splits), prefill chunks from an
// empty cache and continuing a cached prefix, all together in one call; full layers with shuffled
// pages and sliding layers with a 128-row ring, including the window boundary (positions 127, 128,
// 129) and chunks longer than the window.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_store.h"
#include "kernels/cuda_test_util.h"

namespace osprey {
namespace {

constexpr int kD = 64;

struct Seq {
    int start_pos;
    int n_tokens;
    int first_key = 0;  // ring layers: first position present (a prefix-cache replay's start)
};

struct AttentionTester {
    int n_kv = 8;
    int page_size = 16;
    int window = 0;  // 0: full layer with pages; else ring of `window` rows
    float q_scale = 1.0f;
    std::vector<Seq> seqs;

    void run() const {
        const uint32_t seed = test::fresh_seed();
        std::mt19937 rng(seed);
        const int n_q = n_kv * cuda::kAttnGroup;
        const int ld = (n_q + 2 * n_kv) * kD;
        const bool ring = window > 0;
        const int rows = ring ? window : page_size;
        int n_tokens = 0;
        for (const Seq& s : seqs) n_tokens += s.n_tokens;

        // Pages: every sequence gets pages for [0, start_pos + n_tokens), ids shuffled globally.
        std::vector<std::vector<int32_t>> pages(seqs.size());
        int n_pages = 0;
        for (size_t i = 0; i < seqs.size(); ++i) {
            const int need = (seqs[i].start_pos + seqs[i].n_tokens + rows - 1) / rows;
            for (int p = 0; p < need; ++p) pages[i].push_back(n_pages++);
        }
        std::vector<int32_t> perm(std::max(1, n_pages));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (auto& pt : pages)
            for (int32_t& p : pt) p = perm[p];
        const int n_blocks = ring ? int(seqs.size()) + 1 : std::max(1, n_pages);

        // Cache (random everywhere: rows never written by a position are garbage, never read),
        // queries/keys/values of this step, sinks.
        const size_t cache_elems = size_t(n_blocks) * n_kv * rows * kD;
        const std::vector<bf16> k_cache = test::random_bf16(cache_elems, seed + 1);
        const std::vector<bf16> v_cache = test::random_bf16(cache_elems, seed + 2);
        std::vector<bf16> qkv = test::random_bf16(size_t(n_tokens) * ld, seed + 3);
        for (int t = 0; t < n_tokens; ++t)
            for (int i = 0; i < n_q * kD; ++i)
                qkv[size_t(t) * ld + i] = float_to_bf16(bf16_to_float(qkv[size_t(t) * ld + i]) * q_scale);
        const std::vector<bf16> sinks = test::random_bf16(n_q, seed + 4, -2.f, 2.f);

        // Ring slots: sequence i uses slot n_blocks - 1 - i (not its index, to catch mix-ups).
        std::vector<cuda::AttnSlice> slices;
        std::vector<int32_t> page_table;
        int first = 0;
        for (size_t i = 0; i < seqs.size(); ++i) {
            slices.push_back({first, seqs[i].n_tokens, seqs[i].start_pos, int32_t(n_blocks - 1 - i),
                              int32_t(page_table.size()), ring ? seqs[i].first_key : 0});
            page_table.insert(page_table.end(), pages[i].begin(), pages[i].end());
            first += seqs[i].n_tokens;
        }
        if (page_table.empty()) page_table.push_back(0);

        // CPU reference: cache in its layout [blocks, rows, n_kv * kD] f32.
        std::vector<float> ck(cache_elems), cv(cache_elems);
        for (int b = 0; b < n_blocks; ++b)
            for (int g = 0; g < n_kv; ++g)
                for (int r = 0; r < rows; ++r)
                    for (int d = 0; d < kD; ++d) {
                        const size_t mine = ((size_t(b) * n_kv + g) * rows + r) * kD + d;
                        const size_t theirs = (size_t(b) * rows + r) * n_kv * kD + g * kD + d;
                        ck[theirs] = bf16_to_float(k_cache[mine]);
                        cv[theirs] = bf16_to_float(v_cache[mine]);
                    }
        const std::vector<float> qkv_f = test::to_float(qkv);
        const std::vector<float> sinks_f = test::to_float(sinks);
        std::vector<double> want(size_t(n_tokens) * n_q * kD);
        for (size_t i = 0; i < seqs.size(); ++i) {
            const cuda::AttnSlice& s = slices[i];
            std::vector<float> q(size_t(s.n_tokens) * n_q * kD), out(q.size());
            std::vector<int32_t> pos(s.n_tokens);
            for (int t = 0; t < s.n_tokens; ++t) {
                pos[t] = s.start_pos + t;
                for (int j = 0; j < n_q * kD; ++j) q[size_t(t) * n_q * kD + j] = qkv_f[size_t(s.first_token + t) * ld + j];
            }
            const int32_t slot = s.window_slot;
            cpu::AttentionArgs a;
            a.out = out;
            a.q = q;
            a.positions = pos;
            a.sinks = sinks_f;
            a.kv.cache_k = ck.data();
            a.kv.cache_v = cv.data();
            a.kv.blocks = ring ? std::span<const int32_t>(&slot, 1) : std::span<const int32_t>(pages[i]);
            a.kv.block_rows = rows;
            a.kv.ring = ring;
            a.kv.n_cached = s.start_pos;
            a.kv.first_cached = s.first_key;
            a.kv.fresh_k = qkv_f.data() + size_t(s.first_token) * ld + n_q * kD;
            a.kv.fresh_v = qkv_f.data() + size_t(s.first_token) * ld + (n_q + n_kv) * kD;
            a.kv.fresh_stride = ld;
            a.kv.n_fresh = s.n_tokens;
            a.n_heads = n_q;
            a.n_kv_heads = n_kv;
            a.head_dim = kD;
            a.window = window;
            a.scale = 0.125f;
            cpu::attention_sinks(a);
            for (size_t j = 0; j < out.size(); ++j) want[size_t(s.first_token) * n_q * kD + j] = out[j];
        }

        // GPU.
        const cuda::AttnPlan plan = cuda::plan_attention(slices, window, n_kv, 2 * cuda::sm_count());
        auto d_k = test::to_device(k_cache);
        auto d_v = test::to_device(v_cache);
        auto d_qkv = test::to_device(qkv);
        auto d_sinks = test::to_device(sinks);
        auto d_pt = test::to_device(page_table);
        auto d_out = test::poisoned<bf16>(size_t(n_tokens) * n_q * kD);
        std::vector<cuda::AttnItem> dec = plan.decode, pre = plan.prefill;
        std::vector<cuda::AttnMerge> mg = plan.merges;
        if (dec.empty()) dec.push_back({});
        if (pre.empty()) pre.push_back({});
        if (mg.empty()) mg.push_back({});
        auto d_dec = test::to_device(dec);
        auto d_pre = test::to_device(pre);
        auto d_mg = test::to_device(mg);
        const size_t n_part = std::max(1, plan.n_partials);
        auto d_pacc = test::poisoned<float>(n_part * n_kv * cuda::kAttnGroup * kD);
        auto d_pml = test::poisoned<float2>(n_part * n_kv * cuda::kAttnGroup);
        cuda::AttnArgs a{.out = d_out.get(), .ld_out = n_q * kD, .qkv = d_qkv.get(), .ld_qkv = ld,
                         .k_cache = d_k.get(), .v_cache = d_v.get(), .rows = rows, .ring = ring, .window = window,
                         .page_table = d_pt.get(), .sinks = d_sinks.get(), .n_q_heads = n_q, .n_kv_heads = n_kv,
                         .head_dim = kD, .partial_acc = d_pacc.get(), .partial_ml = d_pml.get()};
        cuda::AttnDevicePlan dp{.decode = d_dec.get(), .n_decode = int(plan.decode.size()),
                                .prefill = d_pre.get(), .n_prefill = int(plan.prefill.size()),
                                .merges = d_mg.get(), .n_merges = int(plan.merges.size())};
        cuda::attention(a, dp, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        // Outputs are combinations Σ w_j v_j of values |v| <= 1 with weights summing to < 1. Prefill
        // and decode rows both run on tensor cores with the weights rounded to bf16 before P·V (2^-9
        // relative each), so |error| <= 2^-9 · Σ w_j |v_j| < 2^-9 absolute; then the output is
        // rounded to bf16 (2^-9 relative): 2^-9 + 1e-4 absolute, 1/256 relative.
        test::expect_close(test::to_float(d_out.download()), want, 1.0 / 512 + 1e-4, 1.0 / 256, "attention");
        if (!plan.merges.empty()) std::printf("  (%zu decode tokens split into %d partials)\n", plan.merges.size(), plan.n_partials);

        // Store this step's K/V and check every written row (and that skipped rows kept their data).
        std::vector<cuda::KvStoreSlice> st;
        for (size_t i = 0; i < seqs.size(); ++i)
            st.push_back({slices[i].first_token, slices[i].n_tokens, slices[i].start_pos, /*n_skip=*/1,
                          slices[i].window_slot, pages[i]});
        const std::vector<cuda::KvStoreRow> dst = cuda::plan_kv_store(st, ring, rows);
        auto d_dst = test::to_device(dst.empty() ? std::vector<cuda::KvStoreRow>{{}} : dst);
        cuda::kv_store({.qkv = d_qkv.get(), .ld_qkv = ld, .n_q_heads = n_q, .n_kv_heads = n_kv, .head_dim = kD,
                        .k_cache = d_k.get(), .v_cache = d_v.get(), .rows = rows, .dst = d_dst.get(),
                        .n = int(dst.size())},
                       nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<bf16> want_k = k_cache, want_v = v_cache;
        for (size_t i = 0; i < seqs.size(); ++i) {
            const cuda::AttnSlice& s = slices[i];
            const int from = ring ? std::max(0, s.n_tokens - rows) : 1;
            for (int t = from; t < s.n_tokens; ++t) {
                const int p = s.start_pos + t;
                const int b = ring ? s.window_slot : pages[i][p / rows];
                for (int g = 0; g < n_kv; ++g)
                    for (int d = 0; d < kD; ++d) {
                        const size_t off = ((size_t(b) * n_kv + g) * rows + p % rows) * kD + d;
                        want_k[off] = qkv[size_t(s.first_token + t) * ld + (n_q + g) * kD + d];
                        want_v[off] = qkv[size_t(s.first_token + t) * ld + (n_q + n_kv + g) * kD + d];
                    }
            }
        }
        const std::vector<bf16> got_k = d_k.download(), got_v = d_v.download();
        size_t bad = 0;
        for (size_t i = 0; i < cache_elems; ++i) bad += got_k[i].bits != want_k[i].bits || got_v[i].bits != want_v[i].bits;
        EXPECT_EQ(bad, 0u) << "kv_store: elements that differ from the expected cache";
    }
};

TEST(cuda_attention, decode_first_token) { AttentionTester{.seqs = {{0, 1}}}.run(); }
TEST(cuda_attention, decode_one_tile) { AttentionTester{.seqs = {{63, 1}}}.run(); }
TEST(cuda_attention, decode_long_context_split) { AttentionTester{.seqs = {{5000, 1}}}.run(); }
TEST(cuda_attention, decode_batch_mixed_lengths) {
    AttentionTester{.seqs = {{0, 1}, {100, 1}, {1000, 1}, {4097, 1}, {31, 1}}}.run();
}
TEST(cuda_attention, prefill_from_empty_less_than_one_item) { AttentionTester{.seqs = {{0, 5}}}.run(); }
TEST(cuda_attention, prefill_from_empty_remainder) { AttentionTester{.seqs = {{0, 300}}}.run(); }
TEST(cuda_attention, prefill_continues_cached_prefix) { AttentionTester{.seqs = {{200, 77}}}.run(); }
TEST(cuda_attention, sharp_softmax) { AttentionTester{.q_scale = 8.0f, .seqs = {{300, 1}, {50, 20}}}.run(); }
TEST(cuda_attention, ragged_prefill_and_decode) {
    AttentionTester{.seqs = {{0, 9}, {700, 1}, {37, 64}, {2, 1}, {129, 3}}}.run();
}
TEST(cuda_attention, page_size_32) { AttentionTester{.page_size = 32, .seqs = {{95, 1}, {10, 40}}}.run(); }
TEST(cuda_attention, window_decode_boundaries) {
    AttentionTester{.window = 128, .seqs = {{126, 1}, {127, 1}, {128, 1}, {129, 1}, {1000, 1}}}.run();
}
TEST(cuda_attention, window_prefill_longer_than_window) { AttentionTester{.window = 128, .seqs = {{0, 300}}}.run(); }
TEST(cuda_attention, window_chunk_over_ring) {
    AttentionTester{.window = 128, .seqs = {{200, 150}, {130, 1}, {5, 7}}}.run();
}
TEST(cuda_attention, window_refilled_by_replay) {
    AttentionTester{.window = 128, .seqs = {{300, 1, 250}, {500, 100, 420}, {64, 1, 64}}}.run();
}
TEST(cuda_attention, gpt_oss_decode_batch_64) {
    std::vector<Seq> s;
    for (int i = 0; i < 64; ++i) s.push_back({37 * i + 1, 1});
    AttentionTester{.seqs = s}.run();
}
TEST(cuda_attention, rejects_wrong_group) {
    cuda::AttnArgs a{.n_q_heads = 16, .n_kv_heads = 8, .head_dim = 64};
    EXPECT_THROW(cuda::attention(a, {}, nullptr), Error);
}

}  // namespace
}  // namespace osprey
