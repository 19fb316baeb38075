// Top-4 routing: one warp per token, each lane holding n_experts / 32 logits in registers.
#include "kernels/cuda/moe_route.h"
#include "kernels/cuda/launch.cuh"

#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kPerLane = kMoeMaxExperts / kWarpSize;  // logits held by each lane

// True when (v, e) ranks before (best_v, best_e): larger logit, then lower id. Empty and taken
// slots carry id -1 and rank after everything.
__device__ inline bool ranks_before(float v, int e, float best_v, int best_e) {
    if (e < 0) return false;
    if (best_e < 0) return true;
    return v > best_v || (v == best_v && e < best_e);
}

template <int kTopK>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarpSize) moe_route_topk_kernel(const MoeRouteArgs a) {
    pdl_enter();  // launch.cuh: before any early return or global access
    const int lane = threadIdx.x % kWarpSize;
    const int t = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
    if (t >= a.n_tokens) return;
    const float* logits = a.logits + size_t(t) * a.n_experts;  // [n_experts]

    // Slot i holds expert lane + 32 i. A NaN logit becomes -inf (ranks below every number).
    float v[kPerLane];
    int id[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
        const int e = lane + i * kWarpSize;
        id[i] = e < a.n_experts ? e : -1;
        v[i] = -INFINITY;
        if (e < a.n_experts) {
            float x = logits[e];
            if (a.bias) x += __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(a.bias)[e]);
            v[i] = x != x ? -INFINITY : x;
        }
    }

    float top_v[kTopK];
    int top_e[kTopK];
#pragma unroll
    for (int k = 0; k < kTopK; ++k) {
        float best_v = -INFINITY;
        int best_e = -1;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i)
            if (ranks_before(v[i], id[i], best_v, best_e)) best_v = v[i], best_e = id[i];
#pragma unroll
        for (int o = kWarpSize / 2; o > 0; o /= 2) {
            const float ov = __shfl_xor_sync(0xffffffffu, best_v, o);
            const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
            if (ranks_before(ov, oe, best_v, best_e)) best_v = ov, best_e = oe;
        }
        top_v[k] = best_v, top_e[k] = best_e;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i)
            if (id[i] == best_e) id[i] = -1;  // taken
    }

    if (lane == 0) {
        float sum = 0.0f, p[kTopK];
#pragma unroll
        for (int k = 0; k < kTopK; ++k) {
            // top_v[0] is the largest; all -inf (n_experts >= top_k guarantees ids) gives exp(nan):
            // guard so that a row of -inf logits routes uniformly instead of producing NaN.
            const float d = top_v[k] - top_v[0];
            p[k] = expf(d != d ? 0.0f : d);
            sum += p[k];
        }
#pragma unroll
        for (int k = 0; k < kTopK; ++k) {
            a.expert_ids[size_t(t) * kTopK + k] = top_e[k];
            a.expert_weights[size_t(t) * kTopK + k] = p[k] / sum;
        }
    }
}

}  // namespace

void moe_route_topk(const MoeRouteArgs& a, cudaStream_t stream) {
    OSPREY_CHECK(a.n_tokens >= 0, "moe_route_topk: n_tokens = ", a.n_tokens);
    OSPREY_CHECK(a.n_experts >= a.top_k && a.n_experts <= kMoeMaxExperts, "moe_route_topk: n_experts = ",
                 a.n_experts, " must be in [top_k, ", kMoeMaxExperts, "]");
    if (a.n_tokens == 0) return;
    OSPREY_CHECK(a.expert_ids && a.expert_weights && a.logits, "moe_route_topk: null pointer");
    const int blocks = (a.n_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
    dispatch_int<4>("moe_route_topk top_k", a.top_k, [&]<int kTopK>() {
        cuda::launch(moe_route_topk_kernel<kTopK>, blocks, kWarpsPerBlock * kWarpSize, 0, stream, a);
    });
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::cuda
