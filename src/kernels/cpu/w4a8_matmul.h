// W4A8: the MXFP4 expert projections computed on FP8 (E4M3) operands, the arithmetic of the Hopper
// FP8 wgmma MoE GEMM (kernels/cuda/moe_mlp_w4a8.cu) done exactly on the CPU (docs/fp8.md, "W4A8").
//
// K is cut into blocks of 128 (kBlock; the last one partial when n_in % 128 == 64, as 2880 = 22.5 x 128).
//   activations: per (row, k-block) xs = amax / 448 (1 for an all-zero block) and
//                xq[k] = e4m3_rn_satfinite(x[k] / xs)                     (quantize_rows)
//   weights:     per (weight row, k-block) S = the largest E8M0 scale byte of the block's (up to 4)
//                MXFP4 groups; group i (scale s_i) decodes as
//                wq[k] = e4m3_rn(fp4[k] · 2^(s_i - S + 6))                 (weight_code)
//                and the block's multiplier is wm = 2^(S - 133) = 2^(S - 127 - 6)   (weight_multiplier)
//   y[r, o]  = bias[o] + Σ_kb P(r, o, kb) · wm(o, kb) · xs(r, kb),  P = Σ_{k in kb} wq[o, k] · xq[r, k]
//              (P exact; the promotion fma(P · wm, xs, acc) in FP32, k-blocks in order)   (matmul)
//
// Exactness of the weight decode: fp4 · 2^(s_i - S + 6) is an E4M3 value for every FP4 code iff
// d = S - s_i <= 14 (6 · 2^6 = 384 <= 448 at d = 0; 0.5 · 2^(6 - d) and 1.5 · 2^(6 - d) need a
// subnormal step 2^-9 at most: 6 - d >= -8). So W4A8's weights are the MXFP4 weights exactly while
// the four group scales of every 128-k block span at most 14 binades (trained checkpoints: a few;
// the synthetic ones: 6). Beyond it the small group's values round to the nearest E4M3 subnormal
// (ties to even; zero below 2^-10 · 2^(S - 133)): an absolute error at most 2^-10 · 2^(S - 133),
// i.e. below 2^-10 / 384 ≈ 2.5e-6 of the block's largest possible weight.
#pragma once

#include <cstdint>
#include <span>

#include "core/thread_pool.h"

namespace osprey::cpu::w4a8 {

inline constexpr int kBlock = 128;          // k per block (one activation scale, one weight multiplier)
inline constexpr int kWeightShift = 6;      // wq = fp4 · 2^(s_i - S + 6): 6 · 2^6 = 384 <= 448
inline constexpr int kMaxExactSpread = 14;  // S - s_i <= 14: every weight decodes exactly

inline constexpr int n_blocks(int n) { return (n + kBlock - 1) / kBlock; }

// Activation quantisation. x: [n_rows, n]; q: [n_rows, n] codes (natural k order); scales: [n_rows, n_blocks(n)].
void quantize_rows(std::span<uint8_t> q, std::span<float> scales, std::span<const float> x, int n_rows, int n);

// The E4M3 code of FP4 `nibble` (sign in bit 3) of a group whose scale byte lies `spread` = S - s_i
// (>= 0) below its block's largest.
uint8_t weight_code(uint8_t nibble, int spread);
// 2^(S - 133) (exact in FP32 for every S in 0..254).
float weight_multiplier(uint8_t block_max_scale);
// One weight row: codes [n_in] (natural k order), block_max [n_blocks(n_in)] (S of each k-block).
void decode_weight_row(uint8_t* codes, uint8_t* block_max, const uint8_t* blocks, const uint8_t* scales, int n_in);

// y: [n_rows, n_out]; xq/xs from quantize_rows; blocks/scales/bias as mxfp4_matmul (bias may be empty).
// n_in % 32 == 0. Parallel over output features.
void matmul(std::span<float> y, std::span<const uint8_t> xq, std::span<const float> xs,
            std::span<const uint8_t> blocks, std::span<const uint8_t> scales, std::span<const float> bias, int n_rows,
            int n_in, int n_out, ThreadPool& pool = ThreadPool::global());

// quantize_rows then matmul: the W4A8 projection of FP32 activations.
void mxfp4_matmul(std::span<float> y, std::span<const float> x, std::span<const uint8_t> blocks,
                  std::span<const uint8_t> scales, std::span<const float> bias, int n_rows, int n_in, int n_out,
                  ThreadPool& pool = ThreadPool::global());

}  // namespace osprey::cpu::w4a8
