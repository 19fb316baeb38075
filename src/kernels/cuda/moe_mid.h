// The expert projections of a MoE block for mid-sized decode batches (9..128 tokens: 20b batch 16-128
// has 2-16 routed rows per expert on average, 120b 1-4), bound by streaming every active expert's
// MXFP4 weights from HBM exactly once with all SMs busy (issue 12 / 13; the path before this one,
// moe_mlp_mxfp4's "narrow" tiling, reached ~31% of 4.64 TB/s at 20b batch 128).
// Measured on the H200 (2026-12-02, docs/performance.md "Fourth session"): 9-17% of 4.64 TB/s, 3.5x
// slower than narrow, bound by issuing one cp.async.bulk per 128-byte weight row; so MoeStep uses it
// only with $OSPREY_MOE_MID=1 until its copies move whole contiguous row runs.
//
//   moe_group_by_expert's output (routed rows grouped by expert) ->
//   gather:  h rows, in expert order, into k-blocked, lane-permuted activation tiles   (1 launch)
//   mlp1:    u = clamped SwiGLU(h · W1_eᵀ + b1_e), written in the same tile layout       (1 launch)
//   mlp2:    y[t * 4 + slot] = u · W2_eᵀ + b2_e  per routed row (f32, bias included)     (1 launch)
// The weighted sum over the 4 slots is left to the consumer (MoeOutputs: rmsnorm's moe_y / moe_w or
// moe_combine), as for moe_decode.
//
// Same contract and numerics as MoeStep::run / moe_mlp_mxfp4.h: weights decoded exactly for scale
// bytes 34..160, BF16 activations, FP32 accumulation, u rounded to BF16, biases included; every
// output element is summed by one warp in a fixed order: bit-identical from run to run.
// Test: tests/kernels/test_moe_mid.cu; emulation: scripts/emulate_moe_mid.sh; benchmark:
// bench/bench_moe_decode.cu ("mid" rows).
//
// Design (details, and the instruction / byte budget, in moe_mid.cu):
// - Work item = (active expert e, 128 weight rows, a block of up to 64 routed rows of e (variant 0;
//   see kMoeMidVariants)). Items are ordered expert-major, then by row tile, then by token block (so an expert with
//   more routed rows than one block reads the same rows again right away, from L2), and every CTA (one per SM) takes an
//   equal contiguous range: every SM streams the same number of weight bytes.
// - Each item streams its rows in k-blocks of 256 inputs through a shared-memory ring filled by one
//   producer warp with cp.async.bulk: per stage 128 row segments of 128 B (weights) and one copy of
//   the item's activation tile [rows of the block][256 inputs] (contiguous in the tile layout).
//   Scales and biases of the item's 128 rows come once per item (one contiguous run each).
// - 8 consumer warps split M: warp w owns weight rows 16w..16w+15 of the item and all its tokens,
//   over the whole K: no cross-warp reduction. Per k-step (128 inputs) a lane decodes its two
//   16-byte MXFP4 groups once (rows g and g + 8, group c: moe_decode's decode) and multiplies them
//   with every 8-token n-tile of the item (mma.sync m16n8k16, weights as A, tokens as B, the B
//   fragments loaded from the stage with one conflict-free 16-byte ld.shared per n-tile and quad).
//
// Workspace: moe_mid_workspace_bytes(max_tokens, d_model, d_ff) bytes, 256-byte aligned, one per
// stream; it holds u (first, moe_mid_act_index layout) and the gathered h tiles. No state is kept
// between calls.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/bf16.h"
#include "kernels/cuda/moe_mlp_mxfp4.h"

namespace osprey::cuda {

// Variants of the kernels (MoeMidArgs::variant; -1: $OSPREY_MOE_MID_VARIANT, default 0), for A/B on
// the GPU: routed rows of one expert per work item (an expert with more is split into several items
// over the same weight rows, read again from L2) x inputs per ring stage (256: weight row copies of
// 128 B, 512: of 256 B), and the ring depth that leaves:
//   0: 64 rows, 256 inputs, 4 stages of 48 KB     1: 32 rows, 512 inputs, 3 stages of 64 KB
//   2: 16 rows, 256 inputs, 8 stages of 24 KB     3: 16 rows, 512 inputs, 4 stages of 48 KB
inline constexpr int kMoeMidVariants = 4;
int moe_mid_default_variant();  // $OSPREY_MOE_MID_VARIANT (read once), else 0
// The token range MoeStep sends here with $OSPREY_MOE_MID=1 ($OSPREY_MOE_MID_MIN / _MAX change it): below it
// moe_decode (up to 8 tokens), above it the grouped GEMMs (narrow / wgmma).
inline constexpr int kMoeMidMinTokens = 9;
inline constexpr int kMoeMidMaxTokens = 128;

bool moe_mid_l2_prefetch_default();  // false when $OSPREY_MOE_MID_PREFETCH is "0" (read once)

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
    bool pdl = true;  // mlp1 and mlp2 with programmatic dependent launch
    // Prefetch each work item's weight rows into L2 in one request before copying them row by row
    // (moe_mid.cu). Default: on unless $OSPREY_MOE_MID_PREFETCH=0 (moe_mid_l2_prefetch_default()).
    bool l2_prefetch = moe_mid_l2_prefetch_default();
    int variant = -1;  // 0..kMoeMidVariants - 1; -1: moe_mid_default_variant()
};

// Whether moe_mid takes this shape (what check_args requires of it, besides the pointers).
bool moe_mid_supports(int n_experts, int d_model, int d_ff, int top_k);

size_t moe_mid_workspace_bytes(int max_tokens, int d_model, int d_ff);

// Three launches on `stream`; graph-capturable (no host synchronisation, no allocation).
void moe_mid(const MoeMidArgs& a, cudaStream_t stream);

// The activation tile layout (gathered h, and u as mlp1 writes it at the start of the workspace):
// element j of sorted row p (n_rows = n_tokens * 4 rows in all) is at index moe_mid_act_index(p, j,
// n_rows) of a bf16 array: k-blocks of 256 inputs, each [n_rows][256]; inside a row, 16-byte units
// (k-step s, quad i, group c) = inputs 128 s + 32 c + 8 i .. + 7 ordered (s, i, c), the unit index
// XOR 4 on odd rows (conflict-free B loads), and the 8 inputs of a unit paired (0,4)(1,5)(2,6)(3,7).
__host__ __device__ inline size_t moe_mid_act_index(int p, int j, int n_rows) {
    const int b = j / 256, jj = j % 256;
    const int unit = (jj / 128) * 16 + ((jj % 32) / 8) * 4 + (jj % 128) / 32;
    const int phys = unit ^ ((p & 1) << 2);
    const int e8 = jj & 7;
    return (size_t(b) * n_rows + p) * 256 + phys * 8 + (e8 < 4 ? 2 * e8 : 2 * (e8 - 4) + 1);
}

}  // namespace osprey::cuda
