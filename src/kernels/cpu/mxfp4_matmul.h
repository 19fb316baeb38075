// Linear layer with MXFP4 weights (the expert projections, spec §6.4): y = x · Wᵀ + b, where each
// weight row is stored as blocks of 32 FP4 (E2M1) values with one E8M0 scale per block, blocked along
// the input dimension. Weights are decoded exactly to FP32; FP32 activations and accumulation.
#pragma once

#include <cstdint>
#include <span>

#include "core/mxfp4.h"
#include "core/thread_pool.h"

namespace osprey::cpu {

constexpr int kMxfp4BlockElems = mxfp4::kBlockElements;  // weights per block (one scale byte)
constexpr int kMxfp4BlockBytes = mxfp4::kBlockBytes;     // two FP4 values per byte, low nibble = even element

// Decodes one row: out[32g + 2j] = FP4[low nibble of blocks[g][j]] * 2^(scales[g] - 127), odd elements
// from the high nibble. out: [n_in]; blocks: [n_in / 32, 16]; scales: [n_in / 32].
void mxfp4_dequantize_row(std::span<float> out, const uint8_t* blocks, const uint8_t* scales);

// y: [n_rows, n_out]; x: [n_rows, n_in]; blocks: [n_out, n_in / 32, 16]; scales: [n_out, n_in / 32];
// bias: [n_out] or empty. Each weight row is decoded once per call; parallel over output features.
void mxfp4_matmul(std::span<float> y, std::span<const float> x, std::span<const uint8_t> blocks,
                  std::span<const uint8_t> scales, std::span<const float> bias, int n_rows, int n_in, int n_out,
                  ThreadPool& pool = ThreadPool::global());

}  // namespace osprey::cpu
