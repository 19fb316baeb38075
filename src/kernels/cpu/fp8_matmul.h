// Linear layer with FP8 E4M3 weights scaled per 128 x 128 block (core/fp8.h, docs/fp8.md):
// y = x · Wᵀ + b with W[r, c] = e4m3(Q[r, c]) · scale_inv[r / 128, c / 128]. The reference of the
// GPU's block-scaled FP8 GEMM: each output is accumulated block by block along the input, the
// block's FP32 partial sum Σ_c e4m3(Q[r, c]) · x[c] multiplied by its scale (applied per k-block,
// as a block-scaled tensor-core GEMM does). FP32 activations (weight-only FP8, W8A16).
#pragma once

#include <cstdint>
#include <span>

#include "core/thread_pool.h"

namespace osprey::cpu {

// A window of a block-scaled FP8 matrix: rows [row0, row0 + n_out) and columns [col0, col0 + n_in)
// of the [n_rows_total, ld] matrix `data`, whose scales are [ceil(n_rows_total / 128), ceil(ld / 128)].
// The window lets a tensor-parallel rank read its heads or columns in place: block indices are those
// of the whole matrix.
struct Fp8Matrix {
    const uint8_t* data = nullptr;     // [n_rows_total, ld] e4m3 codes
    const float* scale_inv = nullptr;  // [ceil(n_rows_total/128), ceil(ld/128)] dequantisation multipliers
    int64_t ld = 0;                    // columns of the whole matrix
    int64_t row0 = 0, col0 = 0;        // the window's first row and column
    bool empty() const { return data == nullptr; }
};

// out[n_in] = row `row` of the window dequantised (code · its block's multiplier, FP32 rounding).
void fp8_dequantize_row(std::span<float> out, const Fp8Matrix& w, int64_t row);

// y: [n_rows, n_out]; x: [n_rows, n_in]; w: an [n_out, n_in] window; bias: [n_out] or empty.
// Parallel over output features, so one call streams the weights once whatever n_rows is.
void fp8_matmul(std::span<float> y, std::span<const float> x, const Fp8Matrix& w, std::span<const float> bias,
                int n_rows, int n_in, int n_out, ThreadPool& pool = ThreadPool::global());

}  // namespace osprey::cpu
