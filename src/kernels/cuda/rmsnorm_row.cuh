// One row of RMSNorm (rmsnorm.h) for a whole block of kThreads threads: the rmsnorm kernel runs it
// once per block, the GEMV's norm prologue (linear.h, GemvNorm) once per token in every block, so
// both produce bit-identical activations (same loads, same sums in the same order, same rounding).
//   v = x + delta, or x + Σ_k moe_w[k] · moe_y[k] (slot order, summed from zero first);
//   if x_out: x_out = v;  y = bf16(v · rsqrt(mean(v²) + eps) · gain)
// y may point to global or shared memory (bf16 pairs). Ends with the block in step (callers that
// run it again in the same block must __syncthreads() first: block_reduce_sum's scratch is reused).
#pragma once

#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rmsnorm.h"

namespace osprey::cuda {

template <int kThreads>
__device__ __forceinline__ void rmsnorm_row(const float* x, const float* delta, const float* moe_y, const float* moe_w,
                                            float* x_out, const float* gain, int d, float eps, __nv_bfloat162* y) {
    constexpr int kVecPerThread = kRmsNormMaxChannels / (4 * kThreads);  // float4 loads kept in registers
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* delta4 = reinterpret_cast<const float4*>(delta);
    const float4* moe_y4 = reinterpret_cast<const float4*>(moe_y);
    float4* out4 = reinterpret_cast<float4*>(x_out);
    float w[4] = {0.f, 0.f, 0.f, 0.f};
    if (moe_y)
#pragma unroll
        for (int k = 0; k < 4; ++k) w[k] = __ldcg(moe_w + k);
    const int n_vec = d / 4;

    float4 v[kVecPerThread];
    float sum_sq = 0.0f;
#pragma unroll
    for (int i = 0; i < kVecPerThread; ++i) {
        const int c = threadIdx.x + i * kThreads;
        v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (c < n_vec) {
            v[i] = __ldcg(x4 + c);  // through L2: written by an earlier kernel
            if (delta4) {
                const float4 dv = __ldcg(delta4 + c);
                v[i].x += dv.x, v[i].y += dv.y, v[i].z += dv.z, v[i].w += dv.w;
            } else if (moe_y4) {
                float4 dv = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int k = 0; k < 4; ++k) {  // slot order: moe_combine's sum
                    const float4 yk = __ldcg(moe_y4 + k * n_vec + c);
                    dv.x += w[k] * yk.x, dv.y += w[k] * yk.y, dv.z += w[k] * yk.z, dv.w += w[k] * yk.w;
                }
                v[i].x += dv.x, v[i].y += dv.y, v[i].z += dv.z, v[i].w += dv.w;
            }
            if (out4) out4[c] = v[i];
            sum_sq += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
        }
    }
    const float scale = rsqrtf(block_reduce_sum<kThreads>(sum_sq) / float(d) + eps);
    const float4* g = reinterpret_cast<const float4*>(gain);
#pragma unroll
    for (int i = 0; i < kVecPerThread; ++i) {
        const int c = threadIdx.x + i * kThreads;
        if (c < n_vec) {
            const float4 gv = g[c];
            y[2 * c] = __floats2bfloat162_rn(v[i].x * scale * gv.x, v[i].y * scale * gv.y);
            y[2 * c + 1] = __floats2bfloat162_rn(v[i].z * scale * gv.z, v[i].w * scale * gv.w);
        }
    }
}

}  // namespace osprey::cuda
