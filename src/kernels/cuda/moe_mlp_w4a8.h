// W4A8 expert GEMMs for prefill on Hopper FP8 warpgroup MMA (sm_90a): the MoE step's mlp1 + mlp2 with
// MXFP4 weights decoded exactly to E4M3 in registers and activations quantised to E4M3 per (row, 128-k
// block), e4m3 x e4m3 -> f32 wgmma, the partial sum of each 128-k block promoted into the FP32
// accumulators times (activation scale of the row) x (weight block multiplier), the accumulators
// started from the bias, the clamped SwiGLU in mlp1's epilogue. The arithmetic is
// kernels/cpu/w4a8_matmul.h's; the design is described in moe_mlp_w4a8.cu and docs/fp8.md ("W4A8").
//
// moe_w4a8() replaces moe_mlp1 + moe_mlp2 (moe_mlp_mxfp4.h) of a prefill-sized batch: same routing
// inputs, the same y; u (its scratch) holds mlp1's output in natural column order (not moe_u_column).
// Launches: quantise x -> mlp1 (u, bf16) -> quantise u -> mlp2 (y, f32).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/bf16.h"
#include "kernels/cuda/moe_mlp_mxfp4.h"

namespace osprey::cuda {

struct MoeW4a8Args {
    float* y = nullptr;                      // [n_tokens * top_k, d_model] f32, row t * top_k + slot, bias included
    bf16* u = nullptr;                       // [n_tokens * top_k, d_ff] scratch: mlp1's output (sorted rows, natural columns)
    const bf16* x = nullptr;                 // [n_tokens, d_model]
    Mxfp4Experts mlp1, mlp2;                 // as MoeMlp1Args::w / MoeMlp2Args::w
    const int32_t* expert_offsets = nullptr; // [n_experts + 1] from moe_group_by_expert
    const int32_t* sorted_rows = nullptr;    // [n_tokens * top_k]
    void* workspace = nullptr;               // moe_w4a8_workspace_bytes(n_tokens, top_k, d_model, d_ff), 256-aligned
    int n_tokens = 0;
    int n_experts = 0;
    int top_k = 4;
    int d_model = 0;                         // multiple of 64
    int d_ff = 0;                            // multiple of 64 (mlp1's n_out = 2 d_ff)
    float swiglu_alpha = 1.702f;
    float swiglu_limit = 7.0f;
    int variant = -1;                        // kernel configuration; -1: $OSPREY_MOE_W4A8_VARIANT, else by shape
};

// The quantised activations: x codes + scales, u codes + scales.
size_t moe_w4a8_workspace_bytes(int n_tokens, int top_k, int d_model, int d_ff);

// Whether the kernel takes these widths (multiples of 64, the per-tile scale buffers fit).
bool moe_w4a8_supports(int d_model, int d_ff, int variant = -1);

// $OSPREY_MOE_W4A8=1 (read once): the CUDA runner's MoE uses W4A8 in prefill (A/B switch; the runner
// option moe_w4a8 / the CLI's --moe-gemm w4a8 do the same per runner).
bool moe_w4a8_env();

// Whether a batch is prefill-sized for W4A8: where MoeKernel::automatic would take the BF16 wgmma GEMM
// (the gemm choice, or narrow from kMoeWgmmaMinRowsPerExpert(Many) routed rows per expert); smaller
// batches keep the W4A16 kernels (decode is bound by the weight stream, which W4A8 does not shrink).
bool moe_w4a8_wanted(int n_tokens, int top_k, int n_experts);

// Configurations (moe_mlp_w4a8.cu: tile shape, stages), 0 .. moe_w4a8_variants() - 1. Unset, a call
// takes v2 (64-row tiles) below 96 routed rows per expert and v0 above; $OSPREY_MOE_W4A8_VARIANT
// (read once) forces one; moe_w4a8_default_variant() is that value, 0 when unset.
int moe_w4a8_variants();
int moe_w4a8_default_variant();

void moe_w4a8(const MoeW4a8Args& a, cudaStream_t stream);

// The activation quantisation alone: q [n_rows, n] E4M3 codes, each 32-element group stored in the MMA
// order (element 8j + 4h + i of a group at byte 16h + 4j + i), scales [n_rows, ceil(n / 128)] =
// amax / 448 over the block (1 when all zero); q = e4m3_rn_satfinite(x / scale). n multiple of 32.
// mma_order false: the codes in natural order (the W8A8 matrix-expert GEMM, moe_mlp_matrix.h).
void moe_w4a8_quantize(uint8_t* q, float* scales, const bf16* x, int n_rows, int n, cudaStream_t stream,
                       bool mma_order = true);
// Byte position of element k (0 <= k < n) of a row in moe_w4a8_quantize's layout.
__host__ __device__ inline int moe_w4a8_position(int k) {
    const int e = k & 31;
    return (k & ~31) | (16 * ((e >> 2) & 1) + 4 * (e >> 3) + (e & 3));
}

}  // namespace osprey::cuda
