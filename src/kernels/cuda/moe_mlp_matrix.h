// Expert GEMMs for experts stored as matrices (converted checkpoints, --weights fp8|bf16; model/weights.h
// LayerWeights::mlp1_w / mlp2_w) on Hopper warpgroup MMA (sm_90a), every batch size:
//   FP8  (W8A8): E4M3 weights with one F32 multiplier per 128 x 128 block, activations quantised to E4M3
//        per (row, 128-k block) by moe_w4a8_quantize (natural order), e4m3 x e4m3 -> f32 wgmma; each
//        128-k block's partial sum is promoted into the FP32 accumulators times (activation scale of the
//        routed row) x (weight block multiplier); the accumulators start from the bias.
//   BF16: BF16 weights and activations, FP32 accumulation, the bias in the accumulators.
// Both: mlp1 = x · W1ᵀ + b1 -> clamped SwiGLU -> u (bf16, natural columns), mlp2 = u · W2ᵀ + b2 -> y per
// routed row (f32), for the rows grouped by moe_group_by_expert, as moe_mlp1 + moe_mlp2
// (moe_mlp_mxfp4.h) and moe_w4a8 (moe_mlp_w4a8.h). The weights need no decode: the producer copies
// them straight into 128-byte-swizzled shared memory and the consumers issue wgmma with both operands
// there (the SS form). Design and measurements to make: moe_mlp_matrix.cu, docs/fp8.md ("GPU: matrix
// experts"). CPU references: kernels/cpu/w8a8_matmul.h (W8A8), cpu::matmul_bf16w + swiglu (BF16).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/bf16.h"

namespace osprey::cuda {

enum class MatrixFormat : uint8_t { fp8, bf16 };
const char* matrix_format_name(MatrixFormat f);  // "fp8" | "bf16"

// One projection [n_out, n_in] of every expert, as stored in a converted checkpoint (row-major per
// expert, experts back to back). Pointers 16-byte aligned.
struct MatrixExperts {
    const void* w = nullptr;          // [n_experts, n_out, n_in] E4M3 codes (fp8) or BF16
    const float* scale = nullptr;     // fp8: [n_experts, ceil(n_out / 128), ceil(n_in / 128)] multipliers; bf16: unused
    const bf16* bias = nullptr;       // [n_experts, n_out]
};

struct MoeMatrixArgs {
    float* y = nullptr;                      // [n_tokens * top_k, d_model] f32, row t * top_k + slot, bias included
    bf16* u = nullptr;                       // [n_tokens * top_k, d_ff] scratch: mlp1's output (sorted rows, natural columns)
    const bf16* x = nullptr;                 // [n_tokens, d_model]
    MatrixFormat format = MatrixFormat::fp8;
    MatrixExperts mlp1, mlp2;                // mlp1: n_out = 2 d_ff (gate/up rows interleaved), n_in = d_model; mlp2: d_model x d_ff
    const int32_t* expert_offsets = nullptr; // [n_experts + 1] from moe_group_by_expert
    const int32_t* sorted_rows = nullptr;    // [n_tokens * top_k]
    void* workspace = nullptr;               // moe_matrix_workspace_bytes(...), 256-aligned (none for bf16)
    int n_tokens = 0;
    int n_experts = 0;
    int top_k = 4;
    int d_model = 0;                         // multiple of 64
    int d_ff = 0;                            // multiple of 64
    float swiglu_alpha = 1.702f;
    float swiglu_limit = 7.0f;
    int variant = -1;                        // kernel configuration; -1: $OSPREY_MOE_MATRIX_VARIANT, else by shape
};

// fp8: the quantised activations (x codes + scales, u codes + scales); bf16: 0.
size_t moe_matrix_workspace_bytes(MatrixFormat format, int n_tokens, int top_k, int d_model, int d_ff);

// Whether the kernels take these widths: multiples of 64 (m64 blocks of the output rows; whole 16-byte
// chunks of every row).
bool moe_matrix_supports(int d_model, int d_ff);

// Configurations (moe_mlp_matrix.cu: tile shape, stages), 0 .. moe_matrix_variants() - 1; FP8 takes those
// whose main and partial accumulators fit (v1-v3), BF16 v0-v3. Unset, a
// call takes v2 (128 x 64 tiles) below 96 routed rows per expert, else v0 (256 x 128, BF16) or v1
// (128 x 128, FP8);
// $OSPREY_MOE_MATRIX_VARIANT (read once) forces one.
int moe_matrix_variants();
bool moe_matrix_variant_takes(MatrixFormat format, int variant);
// The variant a call with `variant` = -1 takes for this batch.
int moe_matrix_variant_for(MatrixFormat format, int n_tokens, int top_k, int n_experts);

// fp8: quantise x -> mlp1 -> quantise u -> mlp2; bf16: mlp1 -> mlp2.
void moe_matrix(const MoeMatrixArgs& a, cudaStream_t stream);

}  // namespace osprey::cuda
