// The weighted sum of each token's top_k expert outputs into the FP32 residual stream
// (spec §3.6 step 5): out[t, :] (+)= Σ_slot w[t, slot] · y[t * top_k + slot, :].
// Deterministic (fixed summation order). Test: tests/kernels/test_moe_mlp.cu (whole MoE).
#pragma once

#include <cuda_runtime.h>

namespace osprey::cuda {

enum class MoeCombineMode {
    accumulate,  // out += Σ w·y  (residual add fused)
    overwrite,   // out  = Σ w·y  (a delta for a later fused add, e.g. rmsnorm's `delta`)
};

struct MoeCombineArgs {
    float* out = nullptr;                   // [n_tokens, d_model] f32
    const float* y = nullptr;               // [n_tokens * top_k, d_model] f32 expert outputs (moe_mlp2)
    const float* expert_weights = nullptr;  // [n_tokens, top_k] from moe_route_topk
    int n_tokens = 0;
    int d_model = 0;                        // multiple of 4
    int top_k = 4;                          // specialised: only 4
    MoeCombineMode mode = MoeCombineMode::accumulate;
};

void moe_combine(const MoeCombineArgs& a, cudaStream_t stream);

}  // namespace osprey::cuda
