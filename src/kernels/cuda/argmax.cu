#include "kernels/cuda/argmax.h"
#include "kernels/cuda/launch.cuh"

#include <climits>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 256;

__device__ inline void better(float& best, int& best_i, float v, int i) {
    if (v > best || (v == best && i < best_i)) best = v, best_i = i;  // NaN compares false
}

__device__ inline void block_argmax(float& best, int& best_i) {
    __shared__ float sv[kThreads / kWarpSize];
    __shared__ int si[kThreads / kWarpSize];
#pragma unroll
    for (int o = kWarpSize / 2; o > 0; o /= 2) {
        const float v = __shfl_xor_sync(0xffffffffu, best, o);
        const int i = __shfl_xor_sync(0xffffffffu, best_i, o);
        better(best, best_i, v, i);
    }
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    if (lane == 0) sv[warp] = best, si[warp] = best_i;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < kThreads / kWarpSize; ++w) better(best, best_i, sv[w], si[w]);
    }
}

__global__ void __launch_bounds__(kThreads) argmax_chunks_kernel(const ArgmaxArgs a, int ld, int chunk) {
    pdl_enter();  // launch.cuh: before any early return or global access
    const int r = blockIdx.y;
    const int begin = blockIdx.x * chunk, end = min(a.n_cols, begin + chunk);
    const float* row = a.logits + size_t(r) * ld;
    float best = -INFINITY;
    int best_i = INT_MAX;
    for (int c = begin + threadIdx.x; c < end; c += kThreads) better(best, best_i, row[c], c);
    block_argmax(best, best_i);
    if (threadIdx.x == 0) {
        a.scratch_val[r * kArgmaxChunks + blockIdx.x] = best;
        a.scratch_idx[r * kArgmaxChunks + blockIdx.x] = best_i;
    }
}

__global__ void argmax_final_kernel(const ArgmaxArgs a) {
    pdl_enter();  // launch.cuh: before any early return or global access
    const int r = blockIdx.x;
    if (threadIdx.x != 0) return;
    float best = -INFINITY;
    int best_i = INT_MAX;
    for (int k = 0; k < kArgmaxChunks; ++k) {
        better(best, best_i, a.scratch_val[r * kArgmaxChunks + k], a.scratch_idx[r * kArgmaxChunks + k]);
    }
    a.out[r] = best_i == INT_MAX ? -1 : best_i;
    if (a.out_val) a.out_val[r] = best_i == INT_MAX ? -INFINITY : best;
}

}  // namespace

void argmax(const ArgmaxArgs& a, cudaStream_t stream) {
    OSPREY_CHECK(a.n_rows > 0 && a.n_cols > 0, "argmax: empty shape ", a.n_rows, "x", a.n_cols);
    OSPREY_CHECK(a.out && a.logits && a.scratch_val && a.scratch_idx, "argmax: null pointer");
    const int ld = a.ld ? a.ld : a.n_cols;
    OSPREY_CHECK(ld >= a.n_cols, "argmax: row stride ", ld, " < ", a.n_cols);
    const int chunk = (a.n_cols + kArgmaxChunks - 1) / kArgmaxChunks;
    cuda::launch(argmax_chunks_kernel, dim3(kArgmaxChunks, a.n_rows), kThreads, 0, stream, a, ld, chunk);
    CUDA_CHECK(cudaGetLastError());
    cuda::launch(argmax_final_kernel, a.n_rows, 32, 0, stream, a);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::cuda
