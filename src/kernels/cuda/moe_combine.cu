// Weighted combine of the top-4 expert outputs: one thread per 4 channels of one token.
#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/launch.cuh"

#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 256;

template <int kTopK, bool kAccumulate>
__global__ void __launch_bounds__(kThreads) moe_combine_kernel(const MoeCombineArgs a) {
    pdl_enter();  // launch.cuh: before any early return or global access
    const int n_vec = a.d_model / 4;
    const int t = blockIdx.x;
    const int c = blockIdx.y * kThreads + threadIdx.x;
    if (c >= n_vec) return;
    float w[kTopK];
#pragma unroll
    for (int k = 0; k < kTopK; ++k) w[k] = a.expert_weights[size_t(t) * kTopK + k];
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < kTopK; ++k) {  // slot order: the same sum as the CPU reference
        const float4 y = reinterpret_cast<const float4*>(a.y + (size_t(t) * kTopK + k) * a.d_model)[c];
        acc.x += w[k] * y.x, acc.y += w[k] * y.y, acc.z += w[k] * y.z, acc.w += w[k] * y.w;
    }
    float4* out = reinterpret_cast<float4*>(a.out + size_t(t) * a.d_model) + c;
    if constexpr (kAccumulate) {
        const float4 o = *out;
        acc.x += o.x, acc.y += o.y, acc.z += o.z, acc.w += o.w;
    }
    *out = acc;
}

}  // namespace

void moe_combine(const MoeCombineArgs& a, cudaStream_t stream) {
    OSPREY_CHECK(a.n_tokens >= 0, "moe_combine: n_tokens = ", a.n_tokens);
    OSPREY_CHECK(a.d_model > 0 && a.d_model % 4 == 0, "moe_combine: d_model = ", a.d_model,
                 " must be a positive multiple of 4");
    if (a.n_tokens == 0) return;
    OSPREY_CHECK(a.out && a.y && a.expert_weights, "moe_combine: null pointer");
    const dim3 grid(a.n_tokens, (a.d_model / 4 + kThreads - 1) / kThreads);
    dispatch_int<4>("moe_combine top_k", a.top_k, [&]<int kTopK>() {
        dispatch_bool(a.mode == MoeCombineMode::accumulate, [&]<bool kAccumulate>() {
            cuda::launch(moe_combine_kernel<kTopK, kAccumulate>, grid, kThreads, 0, stream, a);
        });
    });
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::cuda
