// Counting sort of routed rows by expert. Rows are cut into tiles of kTile; inside a tile, a row's
// rank among the rows of the same expert comes from warp match masks plus per-warp counts, so the
// order is the row order and the result is deterministic (no atomics decide positions).
#include "kernels/cuda/moe_group.h"
#include "kernels/cuda/launch.cuh"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_route.h"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kTile = 1024;  // routed rows per block, one per thread
constexpr int kWarps = kTile / kWarpSize;
constexpr int kScanPerLane = kMoeMaxExperts / kWarpSize;

// Per-warp counts of each expert inside one tile.
struct TileCounts {
    int32_t n[kWarps][kMoeMaxExperts];
};

// Expert of routed row r, or -1 past the end / for an id out of range (such rows are dropped).
__device__ inline int expert_of(const MoeGroupArgs& a, int n_rows, int r) {
    if (r >= n_rows) return -1;
    const int e = a.expert_ids[r] - a.first_expert;
    return e >= 0 && e < a.n_experts ? e : -1;
}

// Fills tc for this block's tile and returns this thread's rank among the tile's rows of expert e
// that come before it. Ends with a barrier, so tc is complete for every thread.
__device__ int rank_in_tile(const MoeGroupArgs& a, int e, TileCounts& tc) {
    const int lane = threadIdx.x % kWarpSize;
    const int warp = threadIdx.x / kWarpSize;
    for (int i = threadIdx.x; i < kWarps * a.n_experts; i += kTile) tc.n[i / a.n_experts][i % a.n_experts] = 0;
    __syncthreads();
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const unsigned below = same & ((1u << lane) - 1u);
    if (e >= 0 && below == 0) tc.n[warp][e] = __popc(same);  // the lowest lane of each group writes
    __syncthreads();
    int rank = __popc(below);
    if (e >= 0)
        for (int w = 0; w < warp; ++w) rank += tc.n[w][e];
    return rank;
}

// Rows of expert e in the tile (valid after rank_in_tile).
__device__ inline int tile_total(const TileCounts& tc, int e) {
    int n = 0;
    for (int w = 0; w < kWarps; ++w) n += tc.n[w][e];
    return n;
}

// out[e] = Σ_{e' < e} in[e'] for e <= n_experts, by the first warp (kScanPerLane experts per lane).
__device__ void exclusive_scan_experts(const int32_t* in, int32_t* out, int n_experts) {
    if (threadIdx.x >= kWarpSize) return;
    const int lane = threadIdx.x;
    int v[kScanPerLane], sum = 0;
#pragma unroll
    for (int i = 0; i < kScanPerLane; ++i) {
        const int e = lane * kScanPerLane + i;
        v[i] = e < n_experts ? in[e] : 0;
        sum += v[i];
    }
    int incl = sum;
#pragma unroll
    for (int o = 1; o < kWarpSize; o *= 2) {
        const int n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
    }
    int run = incl - sum;
#pragma unroll
    for (int i = 0; i < kScanPerLane; ++i) {
        const int e = lane * kScanPerLane + i;
        if (e < n_experts) out[e] = run;
        run += v[i];
    }
    if (lane == kWarpSize - 1) out[n_experts] = incl;  // the total
}

// Whole batch in one tile: count, scan and scatter in one launch (decode and small batches).
__global__ void __launch_bounds__(kTile) group_one_tile_kernel(const MoeGroupArgs a) {
    pdl_enter();  // launch.cuh: before any early return or global access
    __shared__ TileCounts tc;
    __shared__ int32_t count[kMoeMaxExperts];
    __shared__ int32_t offset[kMoeMaxExperts + 1];
    const int n_rows = a.n_tokens * a.top_k;
    const int r = threadIdx.x;
    const int e = expert_of(a, n_rows, r);
    const int rank = rank_in_tile(a, e, tc);
    for (int i = threadIdx.x; i < a.n_experts; i += kTile) count[i] = tile_total(tc, i);
    __syncthreads();
    exclusive_scan_experts(count, offset, a.n_experts);
    __syncthreads();
    for (int i = threadIdx.x; i <= a.n_experts; i += kTile) a.expert_offsets[i] = offset[i];
    if (e >= 0) a.sorted_rows[offset[e] + rank] = r;
}

// Multi-tile pass 1: counts[tile, e].
__global__ void __launch_bounds__(kTile) group_count_kernel(const MoeGroupArgs a) {
    pdl_enter();  // launch.cuh: before any early return or global access
    __shared__ TileCounts tc;
    const int n_rows = a.n_tokens * a.top_k;
    const int r = blockIdx.x * kTile + threadIdx.x;
    rank_in_tile(a, expert_of(a, n_rows, r), tc);
    int32_t* counts = a.scratch + size_t(blockIdx.x) * a.n_experts;  // [n_experts] of this tile
    for (int i = threadIdx.x; i < a.n_experts; i += kTile) counts[i] = tile_total(tc, i);
}

// Multi-tile pass 2 (one block): base[tile, e] = offset[e] + rows of e in earlier tiles.
__global__ void __launch_bounds__(kTile) group_scan_kernel(const MoeGroupArgs a, int n_tiles) {
    pdl_enter();  // launch.cuh: before any early return or global access
    __shared__ int32_t total[kMoeMaxExperts];
    __shared__ int32_t offset[kMoeMaxExperts + 1];
    const int32_t* counts = a.scratch;                           // [n_tiles, n_experts]
    int32_t* base = a.scratch + size_t(n_tiles) * a.n_experts;   // [n_tiles, n_experts]
    for (int e = threadIdx.x; e < a.n_experts; e += kTile) {
        int run = 0;
        for (int t = 0; t < n_tiles; ++t) {
            base[size_t(t) * a.n_experts + e] = run;
            run += counts[size_t(t) * a.n_experts + e];
        }
        total[e] = run;
    }
    __syncthreads();
    exclusive_scan_experts(total, offset, a.n_experts);
    __syncthreads();
    for (int e = threadIdx.x; e <= a.n_experts; e += kTile) a.expert_offsets[e] = offset[e];
    for (int e = threadIdx.x; e < a.n_experts; e += kTile)
        for (int t = 0; t < n_tiles; ++t) base[size_t(t) * a.n_experts + e] += offset[e];
}

// Multi-tile pass 3: scatter each row to base[tile, e] + its rank in the tile.
__global__ void __launch_bounds__(kTile) group_scatter_kernel(const MoeGroupArgs a, int n_tiles) {
    pdl_enter();  // launch.cuh: before any early return or global access
    __shared__ TileCounts tc;
    const int n_rows = a.n_tokens * a.top_k;
    const int r = blockIdx.x * kTile + threadIdx.x;
    const int e = expert_of(a, n_rows, r);
    const int rank = rank_in_tile(a, e, tc);
    const int32_t* base = a.scratch + size_t(n_tiles) * a.n_experts + size_t(blockIdx.x) * a.n_experts;
    if (e >= 0) a.sorted_rows[base[e] + rank] = r;
}

int n_tiles_for(int n_tokens, int top_k) { return int((int64_t(n_tokens) * top_k + kTile - 1) / kTile); }

}  // namespace

size_t moe_group_scratch_elems(int n_tokens, int top_k, int n_experts) {
    const int n_tiles = n_tiles_for(n_tokens, top_k);
    return n_tiles <= 1 ? 0 : 2 * size_t(n_tiles) * n_experts;
}

void moe_group_by_expert(const MoeGroupArgs& a, cudaStream_t stream) {
    OSPREY_CHECK(a.n_tokens >= 0 && a.top_k > 0 && int64_t(a.n_tokens) * a.top_k < (int64_t(1) << 30),
                 "moe_group_by_expert: n_tokens = ", a.n_tokens, ", top_k = ", a.top_k);
    OSPREY_CHECK(a.n_experts > 0 && a.n_experts <= kMoeMaxExperts, "moe_group_by_expert: n_experts = ", a.n_experts,
                 " must be in [1, ", kMoeMaxExperts, "]");
    OSPREY_CHECK(a.expert_offsets, "moe_group_by_expert: null expert_offsets");
    if (a.n_tokens == 0) {
        CUDA_CHECK(cudaMemsetAsync(a.expert_offsets, 0, sizeof(int32_t) * (a.n_experts + 1), stream));
        return;
    }
    OSPREY_CHECK(a.sorted_rows && a.expert_ids, "moe_group_by_expert: null pointer");
    const int n_tiles = n_tiles_for(a.n_tokens, a.top_k);
    if (n_tiles == 1) {
        cuda::launch(group_one_tile_kernel, 1, kTile, 0, stream, a);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    OSPREY_CHECK(a.scratch, "moe_group_by_expert: ", a.n_tokens, " tokens need scratch of ",
                 moe_group_scratch_elems(a.n_tokens, a.top_k, a.n_experts), " int32");
    cuda::launch(group_count_kernel, n_tiles, kTile, 0, stream, a);
    CUDA_CHECK(cudaGetLastError());
    cuda::launch(group_scan_kernel, 1, kTile, 0, stream, a, n_tiles);
    CUDA_CHECK(cudaGetLastError());
    cuda::launch(group_scatter_kernel, n_tiles, kTile, 0, stream, a, n_tiles);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::cuda
