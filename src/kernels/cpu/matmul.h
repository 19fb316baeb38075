// Dense linear layer with BF16 weights: y = x · Wᵀ + b (spec §3: every linear stores W as [out, in]).
// FP32 activations; weights are widened to FP32 exactly; FP32 accumulation in 16 independent lanes
// (a fixed order, so a row's result does not depend on the batch it is in).
#pragma once

#include <cstdint>
#include <span>

#include "core/bf16.h"
#include "core/thread_pool.h"

namespace osprey::cpu {

// Dot product of a BF16 weight row with an FP32 vector. w, x: [n].
float dot_bf16(const bf16* w, const float* x, int n);
// Σ a[i]·b[i] in the same fixed order (16 lanes, then a pairwise fold): FP32 rows against FP32
// activations (the MXFP4 and FP8 references decode a weight row to FP32 first).
float dot_f32(const float* a, const float* b, int64_t n);

// y: [n_rows, n_out]; x: [n_rows, n_in]; w: [n_out, n_in]; bias: [n_out] or empty for none.
// Parallel over output features, so one call streams the weights once whatever n_rows is.
void matmul_bf16w(std::span<float> y, std::span<const float> x, std::span<const bf16> w,
                  std::span<const float> bias, int n_rows, int n_in, int n_out,
                  ThreadPool& pool = ThreadPool::global());

}  // namespace osprey::cpu
