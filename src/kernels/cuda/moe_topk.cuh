// One token's MoE routing by one warp (spec §3.6 step 3): top-k on the raw logits (ties to the lower
// expert id, NaN ranks below every number), then a softmax over those k. Shared by moe_route_topk
// (moe_route.cu) and the decode MoE kernels (moe_decode.cu), so both route bit-identically.
#pragma once

#include <cuda_bf16.h>

#include <cmath>

namespace osprey::cuda {

// True when (v, e) ranks before (best_v, best_e): larger logit, then lower id. Empty and taken
// slots carry id -1 and rank after everything. Bitwise, not short-circuit: the compiler predicates it
// instead of branching around each comparison (the branchy form was ~25 instructions per slot).
__device__ __forceinline__ bool topk_ranks_before(float v, int e, float best_v, int best_e) {
    return (e >= 0) & ((best_e < 0) | (v > best_v) | ((v == best_v) & (e < best_e)));
}

// Called by all 32 lanes of a warp; lane l holds experts l + 32 i (i < kPerLane, kPerLane * 32 >=
// n_experts >= kTopK). logits: [n_experts] f32; bias: [n_experts] bf16 added to them, or null.
// Lane 0 writes ids[0..kTopK) (largest logit first) and their softmax weights w[0..kTopK).
template <int kTopK, int kPerLane>
__device__ __forceinline__ void warp_route_topk(const float* logits, const __nv_bfloat16* bias, int n_experts,
                                                int* ids, float* w) {
    const int lane = threadIdx.x % 32;
    float v[kPerLane];
    int id[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
        const int e = lane + i * 32;
        id[i] = e < n_experts ? e : -1;
        v[i] = -INFINITY;
        if (e < n_experts) {
            float x = logits[e];
            if (bias) x += __bfloat162float(bias[e]);
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
            if (topk_ranks_before(v[i], id[i], best_v, best_e)) best_v = v[i], best_e = id[i];
#pragma unroll
        for (int o = 16; o > 0; o /= 2) {
            const float ov = __shfl_xor_sync(0xffffffffu, best_v, o);
            const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
            if (topk_ranks_before(ov, oe, best_v, best_e)) best_v = ov, best_e = oe;
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
        for (int k = 0; k < kTopK; ++k) ids[k] = top_e[k], w[k] = p[k] / sum;
    }
}

// warp_route_topk with the fewest slots per lane that hold n_experts (uniform branch): the loops over
// slots are unrolled, so kMaxPerLane = 8 slots for 32 experts cost 8x the instructions of one (~1000
// per top-4 on one warp, ~2 us of every decode MoE CTA's routing on the H200).
template <int kTopK, int kMaxPerLane>
__device__ __forceinline__ void warp_route_topk_fit(const float* logits, const __nv_bfloat16* bias, int n_experts,
                                                    int* ids, float* w) {
    if (n_experts <= 32) {
        warp_route_topk<kTopK, 1>(logits, bias, n_experts, ids, w);
    } else if (kMaxPerLane >= 4 && n_experts <= 128) {
        warp_route_topk<kTopK, (kMaxPerLane >= 4 ? 4 : kMaxPerLane)>(logits, bias, n_experts, ids, w);
    } else {
        warp_route_topk<kTopK, kMaxPerLane>(logits, bias, n_experts, ids, w);
    }
}

}  // namespace osprey::cuda
