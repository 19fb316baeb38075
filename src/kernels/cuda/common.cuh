// Device primitives shared by several kernels (warp/block reductions, bf16 vector conversion).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace osprey::cuda {

inline constexpr int kWarpSize = 32;

__device__ inline float warp_reduce_sum(float v) {
#pragma unroll
    for (int o = kWarpSize / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ inline float warp_reduce_max(float v) {
#pragma unroll
    for (int o = kWarpSize / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the kThreads threads of a block; every thread receives the total. Uses its own static
// shared array, so call it at most once per kernel.
template <int kThreads>
__device__ inline float block_reduce_sum(float v) {
    static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024);
    constexpr int kWarps = kThreads / kWarpSize;
    __shared__ float partial[kWarps];
    const int lane = threadIdx.x % kWarpSize;
    const int warp = threadIdx.x / kWarpSize;
    v = warp_reduce_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < kWarps ? partial[lane] : 0.0f;
    return warp_reduce_sum(v);
}

// 8 bf16 (one 16-byte load) to 8 floats and back.
__device__ inline void bf16x8_to_float(const uint4& u, float (&f)[8]) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x, f[2 * i + 1] = t.y;
    }
}

__device__ inline uint4 float_to_bf16x8(const float (&f)[8]) {
    uint4 u;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return u;
}

}  // namespace osprey::cuda
