// Grouping routed rows by expert on the GPU against a stable sort on the CPU: offsets and the
// permutation must match exactly, for batches inside one tile (one launch) and across many tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "kernels/cuda/moe_group.h"
#include "kernels/cuda_test_util.h"

namespace osprey::test {
namespace {

constexpr int kTile = 1024;  // routed rows per block in kernels/cuda/moe_group.cu

enum class Spread { uniform, skewed };

void check_group(int n_tokens, int n_experts, Spread spread) {
    SCOPED_TRACE("tokens=" + std::to_string(n_tokens) + " experts=" + std::to_string(n_experts) +
                 (spread == Spread::skewed ? " skewed" : ""));
    const int top_k = 4, n_rows = n_tokens * top_k;
    std::mt19937 rng(fresh_seed());
    std::vector<int32_t> ids(n_rows);
    for (int t = 0; t < n_tokens; ++t) {  // 4 distinct experts per token, as routing produces
        std::vector<int32_t> perm(n_experts);
        std::iota(perm.begin(), perm.end(), 0);
        const int pool = spread == Spread::skewed ? std::min(n_experts, 5) : n_experts;
        std::shuffle(perm.begin(), perm.begin() + pool, rng);
        for (int k = 0; k < top_k; ++k) ids[t * top_k + k] = perm[k];
    }
    std::vector<int32_t> want_sorted(n_rows);
    std::iota(want_sorted.begin(), want_sorted.end(), 0);
    std::stable_sort(want_sorted.begin(), want_sorted.end(), [&](int a, int b) { return ids[a] < ids[b]; });
    std::vector<int32_t> want_offsets(n_experts + 1, 0);
    for (int id : ids) ++want_offsets[id + 1];
    std::partial_sum(want_offsets.begin(), want_offsets.end(), want_offsets.begin());

    auto d_ids = to_device(ids);
    auto d_offsets = poisoned<int32_t>(n_experts + 1);
    auto d_sorted = poisoned<int32_t>(std::max(1, n_rows));
    cuda::DeviceBuffer<int32_t> d_scratch(std::max<size_t>(1, cuda::moe_group_scratch_elems(n_tokens, top_k, n_experts)));
    cuda::moe_group_by_expert({.expert_offsets = d_offsets.get(), .sorted_rows = d_sorted.get(),
                               .scratch = d_scratch.get(), .expert_ids = d_ids.get(), .n_tokens = n_tokens,
                               .n_experts = n_experts, .top_k = top_k}, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(d_offsets.download(), want_offsets);
    if (n_rows > 0) EXPECT_EQ(d_sorted.download(n_rows), want_sorted);
}

TEST(MoeGroup, batch_sizes) {
    for (int n_experts : {8, 32, 128})
        for (int n_tokens : {1, 3, 8, 64, 333, 2048}) check_group(n_tokens, n_experts, Spread::uniform);
}
TEST(MoeGroup, tile_edges) {
    for (int n_tokens : {kTile / 4 - 1, kTile / 4, kTile / 4 + 1, 3 * kTile / 4 + 1}) check_group(n_tokens, 32, Spread::uniform);
}
TEST(MoeGroup, skewed_and_large) {
    check_group(20000, 128, Spread::skewed);
    check_group(20000, 32, Spread::uniform);
    check_group(777, 256, Spread::uniform);
}
TEST(MoeGroup, empty_batch) { check_group(0, 32, Spread::uniform); }

TEST(MoeGroup, rejects_bad_arguments) {
    cuda::DeviceBuffer<int32_t> buf(64);
    cuda::MoeGroupArgs a{.expert_offsets = buf.get(), .sorted_rows = buf.get(), .scratch = nullptr,
                         .expert_ids = buf.get(), .n_tokens = 1000, .n_experts = 32, .top_k = 4};
    EXPECT_THROW(cuda::moe_group_by_expert(a, nullptr), Error);  // multi-tile batch without scratch
    a.n_tokens = 1;
    a.n_experts = 1000;
    EXPECT_THROW(cuda::moe_group_by_expert(a, nullptr), Error);
}

}  // namespace
}  // namespace osprey::test
