// The Hopper prefill variant of sink attention (attention.h), FlashAttention-3 style: items of up to
// kWgmmaPrefillTokens query tokens x kAttnGroup heads = 128 query rows per CTA and one KV head, a
// producer warpgroup streaming 128-key K/V tiles from the paged cache (or the step's own qkv rows)
// into a 3-stage shared-memory ring with cp.async and mbarriers, and two consumer warpgroups of 64
// rows each running S = Q·Kᵀ and O += P·V on wgmma (BF16 in, FP32 accumulation, P rounded to BF16 in
// registers), with the online softmax in FP32/exp2 and the sink counted once at the end. The two
// consumers take turns issuing their MMAs so that one's softmax overlaps the other's MMAs.
// Selected by attention() when the plan was made for it (AttnPrefillKernel::wgmma).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/attention.h"

namespace osprey::cuda {

// items: the plan's prefill items, cut for `variant` (AttnPlan::wgmma_variant).
void attention_prefill_wgmma(const AttnArgs& a, const AttnItem* items, int n_items, int variant, cudaStream_t stream);

// Raises every variant's shared-memory limit (called by attention_configure()).
void attention_prefill_wgmma_configure();

}  // namespace osprey::cuda
