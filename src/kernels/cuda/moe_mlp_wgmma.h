// The Hopper (sm_90a) path of the MXFP4 expert GEMMs for prefill-sized batches: MoeKernel::wgmma of
// moe_mlp1 / moe_mlp2 (moe_mlp_mxfp4.h; same arguments, same outputs, same numerics). Internal to
// those two entry points; the design is described in moe_mlp_wgmma.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/bf16.h"

namespace osprey::cuda {

// One projection of the routed rows of all experts (see MoeMlp1Args / MoeMlp2Args).
struct MoeWgmmaProblem {
    bool mlp1 = true;                        // mlp1: SwiGLU epilogue into u; mlp2: y per routed row
    const uint8_t* blocks = nullptr;         // [n_experts, n_out, n_in / 32, 16]
    const uint8_t* scales = nullptr;         // [n_experts, n_out, n_in / 32]
    const bf16* bias = nullptr;              // [n_experts, n_out]
    const bf16* x = nullptr;                 // mlp1: [n_tokens, n_in] (gathered); mlp2: u [n_rows, n_in] (sorted)
    void* out = nullptr;                     // mlp1: u [n_rows, n_out / 2] bf16; mlp2: y [n_rows, n_out] f32
    const int32_t* expert_offsets = nullptr; // [n_experts + 1]
    const int32_t* sorted_rows = nullptr;    // [n_rows]
    int n_rows = 0;                          // n_tokens * top_k
    int n_experts = 0;
    int top_k = 4;
    int n_in = 0;                            // multiple of 64
    int n_out = 0;                           // multiple of 64
    float swiglu_alpha = 0.0f;               // mlp1 only
    float swiglu_limit = 0.0f;
    int variant = -1;                        // kernel configuration; -1: moe_wgmma_default_variant()
};

// The kernel's compile-time configurations ("variants", moe_mlp_wgmma.cu: register-A or SS form, tile
// shape, stages), numbered 0 .. moe_wgmma_variants() - 1. 0 is the default; the others are candidates timed
// against it (bench_moe "mlp1 wgmma vN") and checked by test_moe_mlp under the same cases.
int moe_wgmma_variants();
// $OSPREY_MOE_WGMMA_VARIANT (read once; 0 when unset; anything else than 0 .. variants - 1 throws).
int moe_wgmma_default_variant();
// Whether $OSPREY_MOE_WGMMA_VARIANT is set (then it overrides the automatic per-shape choice).
bool moe_wgmma_variant_from_env();

// Whether the wgmma kernel (`variant`, -1: the default) takes this projection shape (n_in, n_out
// multiples of 64; the per-tile scale buffers fit in shared memory). The caller falls back to the
// mma.sync kernel otherwise.
bool moe_wgmma_supports(int n_in, int n_out, int variant = -1);

// MoeKernel::automatic may take wgmma unless $OSPREY_MOE_WGMMA=0 (read once).
bool moe_wgmma_enabled();

void moe_wgmma_launch(const MoeWgmmaProblem& p, cudaStream_t stream);

}  // namespace osprey::cuda
