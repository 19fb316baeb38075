// MXFP4 expert matrices requantised on the GPU to FP8 E4M3 with one multiplier per 128 x 128 block:
// the load-time conversion of `--weights fp8` on one GPU (model/cuda/device_weights.cpp), so that the
// host never holds the FP8 experts (120b: 114.8 GB, more than the host memory beside the mapped
// checkpoint) and the conversion takes seconds instead of minutes.
//
// Bit for bit what the host conversion gives (model/weight_convert.cpp: core/fp8.h quantize_band over
// mxfp4_source; tests/model/test_cuda_fp8_weights.cu compares the two):
//   value     = kFp4Values[nibble] · 2^(scale - 127), exact in FP32 (scale 0: 2^-127, a subnormal; scale
//               255: 2^128 = inf, as core/mxfp4.h decodes it);
//   amax      = max |value| over the elements of the block that exist (a partial last block of 2880 =
//               22.5 x 128 columns, or of rows, covers only those);
//   scale_inv = amax / 448 (IEEE division), 1 for an all-zero block;
//   code      = e4m3(value / scale_inv), round to nearest even, magnitudes from 448 up saturate to 448
//               (cvt.rn.satfinite, as fp8::float_to_e4m3).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace osprey::cuda {

struct Mxfp4ToFp8Args {
    const uint8_t* blocks = nullptr;  // [n_mats, rows, cols / 32, 16] MXFP4 elements (low nibble first)
    const uint8_t* scales = nullptr;  // [n_mats, rows, cols / 32] E8M0
    int n_mats = 0, rows = 0, cols = 0;  // cols a multiple of 32
    uint8_t* codes = nullptr;         // [n_mats, rows, cols] E4M3
    float* scale_inv = nullptr;       // [n_mats, ceil(rows / 128), ceil(cols / 128)] multipliers
};

// Enqueues the conversion on `stream` (the inputs must be on the device by then, in stream order).
void mxfp4_to_fp8_blocks(const Mxfp4ToFp8Args& a, cudaStream_t stream);

}  // namespace osprey::cuda
