// Constrained decoding on the GPU: sets the logits of the tokens a row's mask refuses to -inf, in
// place, before the sampler (greedy or not) reads them. The masks come from the CPU
// (engine/token_constraint.h), one bitmask per constrained row. Test: tests/kernels/test_token_mask.cu.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace osprey::cuda {

struct TokenMaskArgs {
    float* logits = nullptr;           // [n_rows, ld] f32
    int ld = 0;                        // row stride of logits (>= vocab_size)
    const uint32_t* masks = nullptr;   // [n_masked, words]: bit t % 32 of word t / 32 allows token t
    const int32_t* rows = nullptr;     // [n_masked] the logit row each mask applies to
    int n_masked = 0;
    int vocab_size = 0;                // words = ceil(vocab_size / 32)
};

void apply_token_mask(const TokenMaskArgs& a, cudaStream_t stream);

}  // namespace osprey::cuda
