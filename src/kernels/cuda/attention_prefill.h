// The prefill variant of sink attention (attention.h): items of up to kPrefillTokens query tokens x
// kGroup heads = 64 query rows per CTA, on tensor cores (mma.sync m16n8k16, BF16 operands, FP32
// accumulation and FP32 online softmax, FA2-style: S and P stay in registers). Called by
// attention(); declared here so that tests and benchmarks can run it alone.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/attention.h"

namespace osprey::cuda {

void attention_prefill(const AttnArgs& a, const AttnItem* items, int n_items, cudaStream_t stream);

}  // namespace osprey::cuda
