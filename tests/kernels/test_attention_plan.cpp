// Host-side planning of the CUDA attention and K/V store (kernels/cuda/attention.h, kv_store.h):
// runs without a GPU (label cpu). Checks that decode splits cover each token's key range exactly
// once in whole key tiles, that partials and merges line up, the fixed (graph) split counts, the
// window and replay boundaries of prefill items, and the rows a K/V store writes.
#include <gtest/gtest.h>

#include <random>

#include "core/check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_store.h"

namespace osprey::cuda {
namespace {

int first_key_of(const AttnSlice& s, int pos, int window) {
    return std::max(s.first_key, window ? pos - window + 1 : 0);
}

void check_plan(const std::vector<AttnSlice>& slices, int window, int target, bool fixed,
                AttnPrefillKernel prefill = AttnPrefillKernel::mma_sync, int variant = 0,
                int min_keys = kMinKeysPerSplit) {
    const AttnPlan plan = plan_attention(slices, window, 8, target, fixed, prefill, variant, min_keys);
    EXPECT_EQ(plan.prefill_kernel, prefill);
    EXPECT_EQ(plan.wgmma_variant, variant);
    const int item_tokens = prefill == AttnPrefillKernel::wgmma ? wgmma_prefill_tokens(variant) : kPrefillTokens;
    size_t di = 0, pi = 0, mi = 0;
    int partials = 0, splits_seen = -1;
    for (const AttnSlice& s : slices) {
        if (s.n_tokens == 1) {
            const int p = s.start_pos, lo = first_key_of(s, p, window);
            // consecutive items of this token
            int n = 0;
            while (di + n < plan.decode.size() && plan.decode[di + n].q_token == s.first_token) ++n;
            ASSERT_GT(n, 0);
            int next = lo;
            for (int i = 0; i < n; ++i) {
                const AttnItem& it = plan.decode[di + i];
                EXPECT_EQ(it.n_q, 1);
                EXPECT_EQ(it.pos0, p);
                EXPECT_EQ(it.key_begin, next) << "splits must be contiguous";
                EXPECT_LE(it.key_begin, it.key_end);
                if (it.key_end < p + 1) {
                    EXPECT_EQ((it.key_end - it.key_begin) % kAttnKeyTile, 0) << "whole tiles";
                }
                next = it.key_end;
                EXPECT_EQ(it.partial, n > 1 ? partials + i : -1);
            }
            EXPECT_EQ(next, p + 1) << "splits cover up to the token itself";
            if (n > 1) {
                ASSERT_LT(mi, plan.merges.size());
                EXPECT_EQ(plan.merges[mi].token, s.first_token);
                EXPECT_EQ(plan.merges[mi].first_partial, partials);
                EXPECT_EQ(plan.merges[mi].n_partials, n);
                ++mi;
                partials += n;
            }
            if (fixed) {
                if (splits_seen >= 0) {
                    EXPECT_EQ(n, splits_seen) << "every decode token gets the same count";
                }
                splits_seen = n;
            }
            di += n;
        } else {
            for (int t = 0; t < s.n_tokens; t += item_tokens) {
                ASSERT_LT(pi, plan.prefill.size());
                const AttnItem& it = plan.prefill[pi++];
                EXPECT_EQ(it.q_token, s.first_token + t);
                EXPECT_EQ(it.n_q, std::min(item_tokens, s.n_tokens - t));
                EXPECT_EQ(it.pos0, s.start_pos + t);
                EXPECT_EQ(it.key_begin, first_key_of(s, it.pos0, window));
                EXPECT_EQ(it.key_end, it.pos0 + it.n_q);
                EXPECT_EQ(it.partial, -1);
            }
        }
    }
    EXPECT_EQ(di, plan.decode.size());
    EXPECT_EQ(pi, plan.prefill.size());
    EXPECT_EQ(mi, plan.merges.size());
    EXPECT_EQ(partials, plan.n_partials);
}

std::vector<AttnSlice> random_batch(std::mt19937& rng, bool ring) {
    std::vector<AttnSlice> out;
    int first = 0;
    const int n = 1 + int(rng() % 12);
    for (int i = 0; i < n; ++i) {
        AttnSlice s;
        s.first_token = first;
        s.n_tokens = rng() % 3 ? 1 : 1 + int(rng() % 300);
        s.start_pos = int(rng() % 9000);
        s.window_slot = i;
        s.first_key = ring && rng() % 4 == 0 ? int(rng() % (s.start_pos + 1)) : 0;
        first += s.n_tokens;
        out.push_back(s);
    }
    return out;
}

TEST(attention_plan, random_batches_full_and_window) {
    std::mt19937 rng(std::random_device{}());
    for (int iter = 0; iter < 300; ++iter) {
        const bool ring = iter % 2;
        const auto slices = random_batch(rng, ring);
        check_plan(slices, ring ? 128 : 0, 264, false);
        check_plan(slices, ring ? 128 : 0, 264, true);
        check_plan(slices, ring ? 128 : 0, 1, false);  // no room to split
        for (int v = 0; v < kAttnWgmmaVariantCount; ++v)  // items of 16 tokens (24 in variant 4)
            check_plan(slices, ring ? 128 : 0, 264, false, AttnPrefillKernel::wgmma, v);
    }
}

TEST(attention_plan, wgmma_variants) {
    EXPECT_EQ(wgmma_prefill_tokens(0), kWgmmaPrefillTokens) << "variant 0 is the kernel as first measured";
    for (int v = 0; v < kAttnWgmmaVariantCount; ++v) {
        const AttnPlan plan =
            plan_attention(std::vector<AttnSlice>{{0, 100, 0, 0, 0, 0}}, 0, 8, 264, false, AttnPrefillKernel::wgmma, v);
        const int tokens = wgmma_prefill_tokens(v);
        EXPECT_EQ(plan.prefill.size(), size_t((100 + tokens - 1) / tokens));
        EXPECT_EQ(plan.wgmma_variant, v);
    }
    EXPECT_THROW(plan_attention(std::vector<AttnSlice>{{0, 100, 0, 0, 0, 0}}, 0, 8, 264, false,
                                AttnPrefillKernel::wgmma, kAttnWgmmaVariantCount),
                 Error);
    EXPECT_THROW(
        plan_attention(std::vector<AttnSlice>{{0, 100, 0, 0, 0, 0}}, 0, 8, 264, false, AttnPrefillKernel::wgmma, -1),
        Error);
}

TEST(attention_plan, window_boundaries) {
    for (int p : {0, 1, 126, 127, 128, 129, 1000}) check_plan({{0, 1, p, 0, 0, 0}}, 128, 264, false);
    check_plan({{0, 300, 0, 0, 0, 0}}, 128, 264, false);
    check_plan({{0, 100, 420, 0, 0, 400}}, 128, 264, false);  // replayed ring: nothing before 400
    for (int v = 0; v < kAttnWgmmaVariantCount; ++v) {
        check_plan({{0, 300, 0, 0, 0, 0}}, 128, 264, false, AttnPrefillKernel::wgmma, v);
        check_plan({{0, 100, 420, 0, 0, 400}}, 128, 264, false, AttnPrefillKernel::wgmma, v);
    }
}

TEST(attention_plan, long_decode_splits_fill_the_target) {
    const AttnPlan plan = plan_attention(std::vector<AttnSlice>{{0, 1, 100000, 0, 0, 0}}, 0, 8, 264, false);
    EXPECT_EQ(plan.decode.size(), 33u);  // 264 CTAs / 8 KV heads
    EXPECT_EQ(plan.merges.size(), 1u);
}

TEST(attention_plan, longer_splits_with_more_keys_per_split) {
    // Without fixed splits every split but a token's last takes at least min_keys keys; with them (graphs)
    // every token gets the longest context's count, a power of two.
    for (const int min_keys : {128, 256, 512})
        for (const bool fixed : {false, true}) {
            const std::vector<AttnSlice> slices = {{0, 1, 1023, 0, 0, 0}, {1, 1, 200, 0, 1, 0}, {2, 1, 5000, 0, 2, 0}};
            check_plan(slices, 0, 264, fixed, AttnPrefillKernel::mma_sync, 0, min_keys);
            check_plan(slices, 128, 264, fixed, AttnPrefillKernel::mma_sync, 0, min_keys);
            const AttnPlan plan = plan_attention(slices, 0, 8, 264, fixed, AttnPrefillKernel::mma_sync, 0, min_keys);
            int pow2 = 1;
            while (pow2 < (5001 + min_keys - 1) / min_keys) pow2 *= 2;
            for (const AttnSlice& s : slices) {
                int n = 0, short_ones = 0;
                for (const AttnItem& it : plan.decode) {
                    if (it.q_token != s.first_token) continue;
                    ++n;
                    short_ones += it.key_end < s.start_pos + 1 && it.key_end - it.key_begin < min_keys;
                }
                const int keys = s.start_pos + 1;
                if (fixed) {
                    EXPECT_EQ(n, std::min(264 / (3 * 8), pow2)) << "min_keys " << min_keys;
                } else {
                    EXPECT_EQ(short_ones, 0) << "min_keys " << min_keys;
                    EXPECT_LE(n, std::min(264 / (3 * 8), (keys + min_keys - 1) / min_keys)) << "min_keys " << min_keys;
                }
            }
        }
    EXPECT_THROW(plan_attention(std::vector<AttnSlice>{{0, 1, 5, 0, 0, 0}}, 0, 8, 264, false,
                                AttnPrefillKernel::mma_sync, 0, 100),
                 Error);
}

TEST(attention_plan, rejects_bad_slices) {
    EXPECT_THROW(plan_attention(std::vector<AttnSlice>{{0, 0, 5, 0, 0, 0}}, 0, 8, 264), Error);
    EXPECT_THROW(plan_attention(std::vector<AttnSlice>{{0, 1, 5, 0, 0, 6}}, 128, 8, 264), Error);
    EXPECT_THROW(plan_attention(std::vector<AttnSlice>{{0, 1, -1, 0, 0, 0}}, 0, 8, 264), Error);
}

TEST(kv_store_plan, ring_keeps_the_last_rows_and_pages_skip_cached) {
    const std::vector<int32_t> pages = {7, 3, 9};
    const std::vector<KvStoreSlice> slices = {{0, 40, 10, 5, 2, pages}, {40, 1, 60, 0, 4, pages}};
    const auto paged = plan_kv_store(slices, false, 32);
    ASSERT_EQ(paged.size(), 35u + 1u);
    EXPECT_EQ(paged[0].token, 5);  // the first 5 tokens are cached
    EXPECT_EQ(paged[0].block, 7);
    EXPECT_EQ(paged[0].row, 15);
    EXPECT_EQ(paged[34].token, 39);  // position 49: page 1, row 17
    EXPECT_EQ(paged[34].block, 3);
    EXPECT_EQ(paged[34].row, 17);
    EXPECT_EQ(paged[35].block, 3);  // position 60
    EXPECT_EQ(paged[35].row, 28);
    const auto ring = plan_kv_store(std::vector<KvStoreSlice>{{0, 300, 0, 5, 2, {}}}, true, 128);
    ASSERT_EQ(ring.size(), 128u);  // only the last 128 positions survive the step
    EXPECT_EQ(ring[0].token, 172);
    EXPECT_EQ(ring[0].block, 2);
    EXPECT_EQ(ring[0].row, 172 % 128);
    EXPECT_THROW(plan_kv_store(std::vector<KvStoreSlice>{{0, 1, 200, 0, 0, pages}}, false, 32), Error);
}

}  // namespace
}  // namespace osprey::cuda
