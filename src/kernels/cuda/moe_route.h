// MoE routing on the GPU (spec §3.6 step 3): the top-k experts of each token by raw router logit,
// then a softmax over only those k logits. Reference: kernels/cpu/routing.h; test:
// tests/kernels/test_moe_route.cu.
//
// The router GEMM itself (logits = h · W_routerᵀ, FP32 accumulation) is a cuBLASLt call in the
// forward (kernels/cuda/linear.h with y_f32); its bias may be fused there or added here.
//
// Ties: the lower expert id wins (as the CPU reference, Metal and HF's stable sort). A NaN logit
// ranks below every number (it is chosen only when fewer than top_k logits are numbers).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/bf16.h"

namespace osprey::cuda {

inline constexpr int kMoeMaxExperts = 256;  // 8 logits per lane of one warp per token

struct MoeRouteArgs {
    int32_t* expert_ids = nullptr;    // [n_tokens, top_k] chosen experts, largest logit first
    float* expert_weights = nullptr;  // [n_tokens, top_k] softmax over the chosen logits (sums to 1)
    const float* logits = nullptr;    // [n_tokens, n_experts] f32 router logits
    const bf16* bias = nullptr;       // [n_experts] router bias added here, or null when the logits include it
    int n_tokens = 0;                 // 0 is a no-op
    int n_experts = 0;                // top_k..kMoeMaxExperts (gpt-oss: 32 or 128)
    int top_k = 4;                    // specialised: only 4
};

void moe_route_topk(const MoeRouteArgs& a, cudaStream_t stream);

}  // namespace osprey::cuda
