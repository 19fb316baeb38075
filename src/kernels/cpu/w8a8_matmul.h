// W8A8: FP8 block-scaled weights (core/fp8.h: E4M3 codes, one multiplier per 128 x 128 block) times
// activations quantised to E4M3 per (row, 128-k block), the arithmetic of the Hopper matrix-expert GEMM
// (kernels/cuda/moe_mlp_matrix.cu, FP8 form) done exactly on the CPU (docs/fp8.md, "GPU: matrix experts").
//
//   activations: per (row, k-block) xs = amax / 448 (1 for an all-zero block), xq = e4m3_rn(x / xs)
//                (w4a8::quantize_rows: the GPU's quantisation kernel is shared with W4A8)
//   y[r, o] = bias[o] + Σ_kb P(r, o, kb) · ws(o, kb) · xs(r, kb),  P = Σ_{k in kb} e4m3(W[o, k]) · e4m3(xq[r, k])
//             (P exact, then rounded to FP32; promotion acc = fma(P · ws, xs, acc) in FP32, k-blocks in
//             order, acc starting from the bias)
// where ws(o, kb) is the weight's block multiplier. The k-blocks of the activations must be those of the
// weight: a window starts at a column that is a multiple of 128 (checked). Against cpu::fp8_matmul
// (FP32 activations, W8A16) the only approximation is the activations' E4M3 rounding: half a step,
// 2^-4 relative at most, about 2^-4 / sqrt(3) RMS.
#pragma once

#include <cstdint>
#include <span>

#include "core/thread_pool.h"
#include "kernels/cpu/fp8_matmul.h"

namespace osprey::cpu::w8a8 {

// y: [n_rows, n_out]; xq/xs from w4a8::quantize_rows ([n_rows, n_in] codes, [n_rows, ceil(n_in / 128)]);
// w: an [n_out, n_in] window whose col0 is a multiple of 128; bias: [n_out] or empty. Parallel over
// output features.
void matmul(std::span<float> y, std::span<const uint8_t> xq, std::span<const float> xs, const Fp8Matrix& w,
            std::span<const float> bias, int n_rows, int n_in, int n_out, ThreadPool& pool = ThreadPool::global());

// quantize_rows then matmul: the W8A8 projection of FP32 activations.
void fp8_matmul(std::span<float> y, std::span<const float> x, const Fp8Matrix& w, std::span<const float> bias,
                int n_rows, int n_in, int n_out, ThreadPool& pool = ThreadPool::global());

}  // namespace osprey::cpu::w8a8
