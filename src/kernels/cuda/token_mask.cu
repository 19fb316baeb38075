// Token masks applied to logits (see token_mask.h). One thread per mask word (32 logits).
#include "kernels/cuda/token_mask.h"

#include <cmath>

#include "core/check.h"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void apply_token_mask_kernel(TokenMaskArgs a) {
    const int words = (a.vocab_size + 31) / 32;
    const int w = blockIdx.x * kThreads + threadIdx.x;
    if (w >= words) return;
    const uint32_t bits = a.masks[size_t(blockIdx.y) * words + w];
    if (bits == 0xFFFFFFFFu) return;
    float* row = a.logits + size_t(a.rows[blockIdx.y]) * size_t(a.ld);
    const int first = w * 32;
    const int n = min(32, a.vocab_size - first);
    for (int i = 0; i < n; ++i)
        if (!((bits >> i) & 1u)) row[first + i] = -INFINITY;
}

}  // namespace

void apply_token_mask(const TokenMaskArgs& a, cudaStream_t stream) {
    OSPREY_CHECK(a.n_masked >= 0 && a.vocab_size > 0 && a.ld >= a.vocab_size, "apply_token_mask: ", a.n_masked,
                 " rows, vocab ", a.vocab_size, ", stride ", a.ld);
    if (a.n_masked == 0) return;
    OSPREY_CHECK(a.logits && a.masks && a.rows, "apply_token_mask: null pointer");
    const int words = (a.vocab_size + 31) / 32;
    const dim3 grid((words + kThreads - 1) / kThreads, a.n_masked);
    apply_token_mask_kernel<<<grid, kThreads, 0, stream>>>(a);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::cuda
