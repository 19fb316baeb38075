// The expert projections of a MoE block for mid-sized decode batches (9..128 tokens: 20b batch 16-128
// has 2-16 routed rows per expert on average, 120b 1-4), bound by streaming every active expert's
// MXFP4 weights from HBM exactly once with all SMs busy (issue 12 / 13; the path before this one,
// moe_mlp_mxfp4's "narrow" tiling, reached ~32% of 4.64 TB/s at 20b batch 16-128).
// History: the first version (measured on the H200, 2026-12-02, docs/performance.md "Fourth session")
// staged 128 weight rows per item in k-blocks with one cp.async.bulk per 128-byte row segment and was
// bound by issuing them (9% of 4.64 TB/s, 3.5x slower than narrow). This version copies whole
// contiguous chunks of rows, as moe_decode does: measured on the H200 (2026-12-02, docs/performance.md
// "Fifth session"), 2.6-3.9x faster than the first version (20b 128 tokens 353 us, 26% of 4.64 TB/s) and
// level with narrow up to 32 tokens, but slower from 64 and never faster than MoeStep's automatic
// choice, so MoeStep still uses it only with $OSPREY_MOE_MID=1.
//
//   moe_group_by_expert's output (routed rows grouped by expert) ->
//   mlp1:    u = clamped SwiGLU(h · W1_eᵀ + b1_e), h rows read through sorted_rows, u written in
//            the tile layout of moe_mid_act_index                                          (1 launch)
//   mlp2:    y[t * 4 + slot] = u · W2_eᵀ + b2_e  per routed row (f32, bias included)     (1 launch)
// The weighted sum over the 4 slots is left to the consumer (MoeOutputs: rmsnorm's moe_y / moe_w or
// moe_combine), as for moe_decode.
//
// Same contract and numerics as MoeStep::run / moe_mlp_mxfp4.h: weights decoded exactly for scale
// bytes 34..160, BF16 activations, FP32 accumulation, u rounded to BF16, biases included; every
// output element is the sum of 8 per-warp partial sums (each over fixed k-steps) added in warp order
// by one warp: bit-identical from run to run.
// Test: tests/kernels/test_moe_mid.cu; emulation: scripts/emulate_moe_mid.sh; benchmark:
// bench/bench_moe_decode.cu ("mid" rows).
//
// Design (details, and the instruction / byte budget, in moe_mid.cu):
// - Chunk = 32 (variant 0) consecutive weight rows of one expert over the whole K: one contiguous run
//   of MXFP4 blocks (46 KB at d = 2880), one of scales, one of biases, so a producer warp streams each
//   chunk with three cp.async.bulk into a shared-memory ring (3 stages of 48 KB at d = 2880).
// - Work item = (active expert e, token block of up to 24 of e's routed rows (variant 0), chunk).
//   Items are ordered expert-major, then token block, then chunk, and every CTA (one per SM) takes an
//   equal contiguous range: every SM streams the same weight bytes for any routing. An expert with
//   more than 24 routed rows has several balanced token blocks and is streamed once per block.
// - 8 consumer warps split each chunk's K (warp w: k-steps w, w + 8, w + 16 of 128 inputs) and keep
//   their k-steps' activation fragments for the whole token block in registers (loaded from L2 when
//   the token block changes); per k-step a lane decodes its MXFP4 groups of rows g and g + 8 of each
//   16-row m-tile once and multiplies them with every 8-token n-tile (mma.sync m16n8k16, weights as
//   A, tokens as B). The 8 partial sums of a chunk meet in shared memory; one warp (rotating) adds
//   them in warp order and runs the epilogue.
//
// Workspace: moe_mid_workspace_bytes(max_tokens, d_model, d_ff) bytes, 256-byte aligned, one per
// stream; it holds u (from its start, moe_mid_act_index layout). No state is kept between calls.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/bf16.h"
#include "kernels/cuda/moe_mlp_mxfp4.h"

namespace osprey::cuda {

// Variants of the kernels (MoeMidArgs::variant; -1: $OSPREY_MOE_MID_VARIANT, default 0), for A/B on
// the GPU: weight rows per chunk (per bulk copy of blocks) x routed rows per token block (the
// activation fragments each consumer lane keeps in registers: 48 per 8 rows), and the ring depth
// that leaves at d_model = d_ff = 2880:
//   0: 32 rows, 24 tokens, 3 stages of 48 KB     1: 16 rows, 24 tokens, 7 stages of 24 KB
//   2: 32 rows, 16 tokens, 3 stages of 48 KB
inline constexpr int kMoeMidVariants = 3;
int moe_mid_default_variant();  // $OSPREY_MOE_MID_VARIANT (read once), else 0
// The token range MoeStep sends here with $OSPREY_MOE_MID=1 ($OSPREY_MOE_MID_MIN / _MAX change it): below it
// moe_decode (up to 8 tokens), above it the grouped GEMMs (narrow / wgmma).
inline constexpr int kMoeMidMinTokens = 9;
inline constexpr int kMoeMidMaxTokens = 128;

struct MoeMidArgs {
    float* y = nullptr;                       // [n_tokens * 4, d_model] f32: routed row t * 4 + slot, bias included
    const bf16* h = nullptr;                  // [n_tokens, d_model] normed hidden state, 16-byte aligned
    Mxfp4Experts mlp1;                        // n_out = 2 * d_ff (gate, up interleaved), n_in = d_model
    Mxfp4Experts mlp2;                        // n_out = d_model, n_in = d_ff
    const int32_t* expert_offsets = nullptr;  // [n_experts + 1] from moe_group_by_expert
    const int32_t* sorted_rows = nullptr;     // [n_tokens * 4] from moe_group_by_expert
    void* workspace = nullptr;                // moe_mid_workspace_bytes(max_tokens, d_model, d_ff)
    int max_tokens = 0;                       // what the workspace was sized for (n_tokens <= max_tokens)
    int n_tokens = 0;                         // 0 (no-op) .. max_tokens
    int n_experts = 0;                        // 4..kMoeMaxExperts
    int top_k = 4;                            // specialised: only 4
    int d_model = 0;                          // positive multiple of 32, at most 3072
    int d_ff = 0;                             // positive multiple of 32, at most 3072
    float swiglu_alpha = 1.702f;
    float swiglu_limit = 7.0f;
    bool pdl = true;   // mlp1 and mlp2 with programmatic dependent launch
    int variant = -1;  // 0..kMoeMidVariants - 1; -1: moe_mid_default_variant()
};

// Whether moe_mid takes this shape (what check_args requires of it, besides the pointers).
bool moe_mid_supports(int n_experts, int d_model, int d_ff, int top_k);

size_t moe_mid_workspace_bytes(int max_tokens, int d_model, int d_ff);

// Two launches on `stream`; graph-capturable (no host synchronisation, no allocation).
void moe_mid(const MoeMidArgs& a, cudaStream_t stream);

// The tile layout of u (as mlp1 writes it at the start of the workspace, mlp2 reads it and tests read it back):
// element j of sorted row p (n_rows = n_tokens * 4 rows in all) is at index moe_mid_act_index(p, j,
// n_rows) of a bf16 array: k-blocks of 256 inputs, each [n_rows][256]; inside a row, 16-byte units
// (k-step s, quad i, group c) = inputs 128 s + 32 c + 8 i .. + 7 ordered (s, i, c), the unit index
// XOR 4 on odd rows, and the 8 inputs of a unit paired (0,4)(1,5)(2,6)(3,7): each 16-byte unit is one
// B fragment of the decode's pair order (mlp2 loads it with one 16-byte load).
__host__ __device__ inline size_t moe_mid_act_index(int p, int j, int n_rows) {
    const int b = j / 256, jj = j % 256;
    const int unit = (jj / 128) * 16 + ((jj % 32) / 8) * 4 + (jj % 128) / 32;
    const int phys = unit ^ ((p & 1) << 2);
    const int e8 = jj & 7;
    return (size_t(b) * n_rows + p) * 256 + phys * 8 + (e8 < 4 ? 2 * e8 : 2 * (e8 - 4) + 1);
}

}  // namespace osprey::cuda
