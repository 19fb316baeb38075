// Greedy sampling on the GPU: out[r] = argmax_c logits[r, c], the lowest index on ties; NaN never
// wins (a row of only NaN gives -1, which the caller reports). The logits stay on the device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace osprey::cuda {

inline constexpr int kArgmaxChunks = 32;  // CTAs per row in the first pass

struct ArgmaxArgs {
    int32_t* out = nullptr;          // [n_rows] device
    const float* logits = nullptr;   // [n_rows, ld] f32
    int n_rows = 0;
    int n_cols = 0;
    int ld = 0;                      // 0: n_cols
    float* scratch_val = nullptr;    // [n_rows, kArgmaxChunks]
    int32_t* scratch_idx = nullptr;  // [n_rows, kArgmaxChunks]
    float* out_val = nullptr;        // [n_rows] optional: the winning logit (-inf for a row of NaN), for
                                     // the distributed argmax over vocabulary shards
};

void argmax(const ArgmaxArgs& a, cudaStream_t stream);

}  // namespace osprey::cuda
