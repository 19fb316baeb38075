// RMSNorm of the FP32 residual stream to a BF16 activation (spec §3.2), optionally fused with the
// residual add that precedes it and with a row gather (the final norm of the logit rows only):
//   if delta:  x[r, :] = x[r, :] + delta[r, :]      (written back, r = rows ? rows[t] : t)
//   y[t, :] = bf16( x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * gain[:] )
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/bf16.h"

namespace osprey::cuda {

struct RmsNormArgs {
    bf16* y = nullptr;               // [n_tokens, d] bf16
    float* x = nullptr;              // [*, d] f32 residual stream (written only when delta is set)
    const float* gain = nullptr;     // [d] f32
    const float* delta = nullptr;    // [*, d] f32 (rows like x) added into x first, or null
    // Or the MoE output as its per-slot parts (moe_combine fused): row r of delta is
    // Σ_{k<4} moe_w[4r + k] · moe_y[4r + k, :], summed in slot order exactly as moe_combine does.
    const float* moe_y = nullptr;    // [*, 4, d] f32, or null
    const float* moe_w = nullptr;    // [*, 4] f32
    const int32_t* rows = nullptr;   // [n_tokens] rows of x to normalise (device), or null for 0..n-1
    int n_tokens = 0;
    int d = 0;                       // multiple of 4, at most kMaxChannels
    float eps = 1e-5f;
};

inline constexpr int kRmsNormMaxChannels = 4096;

void rmsnorm(const RmsNormArgs& a, cudaStream_t stream);

}  // namespace osprey::cuda
