// Grouping routed rows by expert (kernels/cuda/moe_group.h): one table for the test
// (tests/kernels/test_moe_group.cu, against a stable sort on the CPU: offsets and permutation exact) and
// the benchmark (bench/bench_moe.cu): gpt-oss's 32 and 128 experts at decode and prefill batch sizes,
// batches inside one tile (one launch) and across many, the tile edges, skewed routing, an empty batch.
#pragma once

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cases/harness.h"
#include "kernels/cuda/moe_group.h"

namespace osprey::cases::moe_group {

inline constexpr int kTopK = 4;
inline constexpr int kTile = 1024;  // routed rows per block in kernels/cuda/moe_group.cu

enum class Spread { uniform, skewed };

struct Case {
    std::string name;   // gtest name; empty: identifier(label)
    std::string label;  // bench label
    Use use = Use::both;
    int n_tokens = 1;
    int n_experts = 32;
    Spread spread = Spread::uniform;  // skewed: every token picks among the first 5 experts
};

inline Result run(const Case& c, Mode mode) {
    Result r;
    r.seed = case_seed(mode);
    const int n_rows = c.n_tokens * kTopK;
    std::mt19937 rng(r.seed);
    std::vector<int32_t> ids(n_rows);
    for (int t = 0; t < c.n_tokens; ++t) {  // 4 distinct experts per token, as routing produces
        std::vector<int32_t> perm(c.n_experts);
        std::iota(perm.begin(), perm.end(), 0);
        const int pool = c.spread == Spread::skewed ? std::min(c.n_experts, 5) : c.n_experts;
        std::shuffle(perm.begin(), perm.begin() + pool, rng);
        for (int k = 0; k < kTopK; ++k) ids[t * kTopK + k] = perm[k];
    }
    auto d_ids = to_device(ids);
    auto d_offsets = poisoned<int32_t>(c.n_experts + 1);
    auto d_sorted = poisoned<int32_t>(n_rows);
    cuda::DeviceBuffer<int32_t> d_scratch(
        std::max<size_t>(1, cuda::moe_group_scratch_elems(c.n_tokens, kTopK, c.n_experts)));
    const cuda::MoeGroupArgs a{.expert_offsets = d_offsets.get(), .sorted_rows = d_sorted.get(),
                               .scratch = d_scratch.get(), .expert_ids = d_ids.get(), .n_tokens = c.n_tokens,
                               .n_experts = c.n_experts, .top_k = kTopK};

    if (mode == Mode::perf) {
        const double us =
            time_us([&](int) { cuda::moe_group_by_expert(a, nullptr); }, iters_or(c.n_tokens >= 1024 ? 10 : 50));
        r.timings.push_back({c.label, us, 8.0 * n_rows, 0.0});
        return r;
    }

    cuda::moe_group_by_expert(a, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int32_t> want_sorted(n_rows);
    std::iota(want_sorted.begin(), want_sorted.end(), 0);
    std::stable_sort(want_sorted.begin(), want_sorted.end(), [&](int x, int y) { return ids[x] < ids[y]; });
    std::vector<int32_t> want_offsets(c.n_experts + 1, 0);
    for (int id : ids) ++want_offsets[id + 1];
    std::partial_sum(want_offsets.begin(), want_offsets.end(), want_offsets.begin());
    expect_equal(r, d_offsets.download(c.n_experts + 1), want_offsets, "expert offsets");
    if (n_rows > 0) expect_equal(r, d_sorted.download(n_rows), want_sorted, "sorted rows");
    return r;
}

inline std::vector<Case> cases() {
    std::vector<Case> t;
    auto add = [&](Case c, Use use) {
        c.label = str("group E=", c.n_experts, " T=", c.n_tokens, c.spread == Spread::skewed ? " skewed" : "");
        c.use = use;
        t.push_back(c);
    };
    for_moe_token_grid([&](int n, int e, Use use) { add({.n_tokens = n, .n_experts = e}, use); });
    // Tile edges in routed rows (kTile / 4 = 256 tokens exactly is the grid's "group E=32 T=256").
    for (int n : {kTile / 4 - 1, kTile / 4 + 1, 3 * kTile / 4 + 1})
        add({.n_tokens = n, .n_experts = 32}, Use::check_only);
    add({.n_tokens = 20000, .n_experts = 128, .spread = Spread::skewed}, Use::check_only);
    add({.n_tokens = 20000, .n_experts = 32}, Use::check_only);
    add({.n_tokens = 777, .n_experts = 256}, Use::check_only);
    add({.n_tokens = 0, .n_experts = 32}, Use::check_only);  // empty batch
    return t;
}

}  // namespace osprey::cases::moe_group
