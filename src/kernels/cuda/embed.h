// Embedding gather: x[t, :] = float(table[tokens[t], :]) (spec §3.1), the residual stream in FP32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/bf16.h"

namespace osprey::cuda {

struct EmbedArgs {
    float* x = nullptr;               // [n_tokens, d_model] f32
    const bf16* table = nullptr;      // [vocab, d_model] bf16
    const int32_t* tokens = nullptr;  // [n_tokens] device; each in [0, vocab) (checked by the caller)
    int n_tokens = 0;
    int d_model = 0;                  // multiple of 8
};

void embed(const EmbedArgs& a, cudaStream_t stream);

}  // namespace osprey::cuda
