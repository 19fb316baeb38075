// The expert projections of the MoE block with MXFP4 weights read straight from the checkpoint
// layout (spec §3.6 step 4, §6.4): the FP4 nibbles are decoded to BF16 in registers inside the
// kernels, never materialised in memory.
//
//   moe_mlp1:  a = x[t] · W1[e]ᵀ + b1[e]            [2 d_ff], gate/up rows interleaved
//              u = min(a[0::2], L) · σ(α · min(a[0::2], L)) · (clamp(a[1::2], -L, L) + 1)   [d_ff] bf16
//   moe_mlp2:  y = u · W2[e]ᵀ + b2[e]               [d_model] f32
// for every routed row (token t, slot) grouped by moe_group_by_expert; moe_combine then adds
// Σ w · y into the residual stream. Reference: kernels/cpu/mxfp4_matmul.h + swiglu.h;
// test: tests/kernels/test_moe_mlp.cu; benchmark: bench/bench_moe.cu.
//
// The forward's MoE step:
//   router logits (cuBLASLt, f32) -> moe_route_topk -> moe_group_by_expert -> moe_mlp1 -> moe_mlp2
//   -> moe_combine (into the residual).
//
// Both projections run on tensor cores (mma.sync m16n8k16, BF16 in, FP32 accumulate) with the
// weight rows as the M dimension and the routed rows of one expert as N, in three configurations:
//   gemv:   8 routed rows per tile, 32 weight rows per block, K split over 4 warps. For decode and
//           small batches, where the step is bound by streaming each active expert's weights
//           (4.25 bits/weight) once.
//   narrow: 32 routed rows x 128 weight rows per block, K split over 2. Batched decode and short
//           prefills (5-128 rows per expert).
//   gemm:   128 routed rows x 128 weight rows per block. For prefill-sized batches, where the tensor
//           cores are the limit.
// moe_choose_kernel() picks one from the batch shape (documented there); tests force each.
// A fourth, wgmma (moe_mlp_wgmma.h/.cu), is the prefill GEMM on Hopper warpgroup MMA: persistent,
// warp-specialised (a cp.async producer warpgroup, two consumer warpgroups), 256 weight rows x 128
// routed rows per tile, the bias loaded into the accumulators. Same outputs and numerics as gemm.
// MoeKernel::automatic uses it in place of gemm, and of narrow from kMoeWgmmaMinRowsPerExpert routed rows
// per expert, when the projection's widths are multiples of 64 ($OSPREY_MOE_WGMMA=0: never). Measured
// on the H200 (bench_moe, mlp1 + mlp2, 2026-12-01): 20b 8192 tokens gemm 7144 us (27-33% of 790
// TFLOP/s) -> wgmma 4296 us (46-53%); 20b 1024 tokens (128 rows/expert) narrow ~1299 (earlier table),
// gemm 1278 -> wgmma 781 us; 120b 1024 tokens (32 rows/expert) narrow 1654 against wgmma 1806, so
// narrow stays there.
//
// W4A8 (moe_mlp_w4a8.h, opt-in: $OSPREY_MOE_W4A8=1) runs mlp1 + mlp2 of prefill-sized batches on FP8
// wgmma instead, with E4M3 activations (docs/fp8.md).
//
// Numerics: weights are decoded exactly (FP4 · 2^(scale-127) is a BF16 value) for scale bytes in
// [34, 160], i.e. block maxima from 2^-93 to 6·2^33 (trained checkpoints use ~110..127); outside it
// weights flush to zero or overflow. Activations are BF16, accumulation FP32, u is rounded to BF16.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/bf16.h"

namespace osprey::cuda {

// One projection of all experts of a layer, as stored in the checkpoint.
struct Mxfp4Experts {
    const uint8_t* blocks = nullptr;  // [n_experts, n_out, n_in / 32, 16] FP4 pairs, 16-byte aligned
    const uint8_t* scales = nullptr;  // [n_experts, n_out, n_in / 32] E8M0, 16-byte aligned
    const bf16* bias = nullptr;       // [n_experts, n_out]
};

enum class MoeKernel { automatic, gemv, narrow, gemm, wgmma };
const char* moe_kernel_name(MoeKernel k);  // "auto", "gemv", "narrow", "gemm", "wgmma"

// Three tilings of one kernel, chosen by the average routed rows per expert (n_tokens * top_k /
// n_experts): gemv (8 routed rows per token tile) up to kMoeGemvMaxRowsPerExpert, narrow (32 routed
// rows per tile) up to kMoeNarrowMaxRowsPerExpert, gemm (128) above. Measured on the H200
// (bench/bench_moe.cu, mlp1 + mlp2 summed, commit 8642e48; "-": not measured):
//   rows/expert   20b: gemv / narrow / gemm (us)       120b: gemv / narrow / gemm (us)
//   0.25-1        152 / 204 / 551 (8 tokens)            205 / 269 / 721 (8 tokens)
//   4             -                                     856 / 1053 / 2889 (128 tokens)
//   8             317 / 289 / 774 (64 tokens)           1234 / 1109 / 2961 (256 tokens)
//   16            511 / 297 / 783 (128 tokens)          -
//   32            910 / 432 / 805 (256 tokens)          3705 / 1654 / 3087 (1024 tokens)
//   128           3282 / 1299 / 1279 (1024 tokens)      -
//   256-1024      - / 9303 / 7319 (8192 tokens)         - / 9681 / 8283 (8192 tokens)
inline constexpr int kMoeGemvMaxRowsPerExpert = 4;
inline constexpr int kMoeNarrowMaxRowsPerExpert = 128;
inline constexpr int kMoeWgmmaMinRowsPerExpert = 64;  // automatic: wgmma instead of narrow from here
// ... and from 32 with 128 or more experts (120b at 1024 tokens: wgmma v4 987 + 438 us, narrow ~1654).
// At 8-16 rows per expert (decode batches 64-128) narrow stays: 20b 64 tokens 191 + 96 us against
// wgmma 329 + 139; 120b 64 tokens 622 + 295 against 1073 + 477 (bench_moe, 2026-12-01).
inline constexpr int kMoeWgmmaManyExperts = 128;
inline constexpr int kMoeWgmmaMinRowsPerExpertMany = 32;
MoeKernel moe_choose_kernel(int n_tokens, int top_k, int n_experts);

// Column of intermediate unit j (0 <= j < d_ff) in u. moe_mlp1 stores each group of 8 units
// permuted as [0 4 1 5 2 6 3 7] (the order moe_mlp2 feeds to the tensor cores); only tests that
// read u directly need this.
__host__ __device__ inline int moe_u_column(int j) {
    const int i = j & 7;
    return (j & ~7) | (i < 4 ? 2 * i : 2 * (i - 4) + 1);
}

struct MoeMlp1Args {
    bf16* u = nullptr;                       // [n_tokens * top_k, d_ff] in sorted-row order, columns moe_u_column
    const bf16* x = nullptr;                 // [n_tokens, d_model] normed hidden state
    Mxfp4Experts w;                          // n_out = 2 * d_ff (gate, up interleaved), n_in = d_model
    const int32_t* expert_offsets = nullptr; // [n_experts + 1] from moe_group_by_expert
    const int32_t* sorted_rows = nullptr;    // [n_tokens * top_k] from moe_group_by_expert
    int n_tokens = 0;
    int n_experts = 0;
    int top_k = 4;
    int d_model = 0;                         // multiple of 64
    int d_ff = 0;                            // multiple of 8
    float swiglu_alpha = 1.702f;
    float swiglu_limit = 7.0f;
    MoeKernel kernel = MoeKernel::automatic;
    int wgmma_variant = -1;                  // configuration of the wgmma kernel; -1: by shape (or the env)
};

struct MoeMlp2Args {
    float* y = nullptr;                      // [n_tokens * top_k, d_model] row t * top_k + slot, bias included
    const bf16* u = nullptr;                 // [n_tokens * top_k, d_ff] from moe_mlp1
    Mxfp4Experts w;                          // n_out = d_model, n_in = d_ff
    const int32_t* expert_offsets = nullptr; // [n_experts + 1]
    const int32_t* sorted_rows = nullptr;    // [n_tokens * top_k]
    int n_tokens = 0;
    int n_experts = 0;
    int top_k = 4;
    int d_model = 0;                         // multiple of 16
    int d_ff = 0;                            // multiple of 64
    MoeKernel kernel = MoeKernel::automatic;
    int wgmma_variant = -1;                  // configuration of the wgmma kernel; -1: by shape (or the env)
};

void moe_mlp1(const MoeMlp1Args& a, cudaStream_t stream);
void moe_mlp2(const MoeMlp2Args& a, cudaStream_t stream);

}  // namespace osprey::cuda
