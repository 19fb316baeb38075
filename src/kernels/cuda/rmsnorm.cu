#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/launch.cuh"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVecPerThread = kRmsNormMaxChannels / (4 * kThreads);  // float4 loads kept in registers

__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(const RmsNormArgs a) {
    // A handful of blocks: let the next kernel (a GEMV that prefetches its weights before waiting)
    // launch now; it cannot crowd this one out.
    pdl_trigger();
    pdl_enter();  // launch.cuh: before any early return or global access
    const int t = blockIdx.x;
    const int r = a.rows ? a.rows[t] : t;
    float4* x = reinterpret_cast<float4*>(a.x + size_t(r) * a.d);
    const float4* delta = a.delta ? reinterpret_cast<const float4*>(a.delta + size_t(r) * a.d) : nullptr;
    const float4* moe_y = a.moe_y ? reinterpret_cast<const float4*>(a.moe_y + size_t(r) * 4 * a.d) : nullptr;
    float moe_w[4] = {0.f, 0.f, 0.f, 0.f};
    if (moe_y)
#pragma unroll
        for (int k = 0; k < 4; ++k) moe_w[k] = a.moe_w[size_t(r) * 4 + k];
    const int n_vec = a.d / 4;

    float4 v[kVecPerThread];
    float sum_sq = 0.0f;
#pragma unroll
    for (int i = 0; i < kVecPerThread; ++i) {
        const int c = threadIdx.x + i * kThreads;
        v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (c < n_vec) {
            v[i] = x[c];
            if (delta) {
                const float4 dv = delta[c];
                v[i].x += dv.x, v[i].y += dv.y, v[i].z += dv.z, v[i].w += dv.w;
                x[c] = v[i];
            } else if (moe_y) {
                float4 dv = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int k = 0; k < 4; ++k) {  // slot order: moe_combine's sum
                    const float4 y = moe_y[k * n_vec + c];
                    dv.x += moe_w[k] * y.x, dv.y += moe_w[k] * y.y, dv.z += moe_w[k] * y.z, dv.w += moe_w[k] * y.w;
                }
                v[i].x += dv.x, v[i].y += dv.y, v[i].z += dv.z, v[i].w += dv.w;
                x[c] = v[i];
            }
            sum_sq += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
        }
    }
    const float scale = rsqrtf(block_reduce_sum<kThreads>(sum_sq) / float(a.d) + a.eps);
    __nv_bfloat162* y = reinterpret_cast<__nv_bfloat162*>(a.y + size_t(t) * a.d);
    const float4* g = reinterpret_cast<const float4*>(a.gain);
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

}  // namespace

void rmsnorm(const RmsNormArgs& a, cudaStream_t stream) {
    OSPREY_CHECK(a.n_tokens > 0 && a.d > 0 && a.d % 4 == 0 && a.d <= kRmsNormMaxChannels, "rmsnorm: d = ", a.d,
                 " must be a positive multiple of 4 up to ", kRmsNormMaxChannels, " (n_tokens ", a.n_tokens, ")");
    OSPREY_CHECK(a.y && a.x && a.gain, "rmsnorm: null pointer");
    OSPREY_CHECK(!a.moe_y || (a.moe_w && !a.delta), "rmsnorm: moe_y needs moe_w and excludes delta");
    cuda::launch(rmsnorm_kernel, a.n_tokens, kThreads, 0, stream, a);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::cuda
