// One half-split RoPE rotation (rope.h, spec §3.4): the pair (x[d], x[d + head_dim / 2]) of a head
// turned by cos/sin of its position, in FP32, each result rounded to BF16 once. The one expression
// both rope.cu and the decode attention's fused rotation (attention.h, AttnArgs::rope_cos) compile, so
// that the two paths give the same bits.
#pragma once

#include <cuda_bf16.h>

namespace osprey::cuda {

__device__ __forceinline__ void rope_pair(float x0, float x1, float c, float s, __nv_bfloat16& y0, __nv_bfloat16& y1) {
    y0 = __float2bfloat16_rn(x0 * c - x1 * s);
    y1 = __float2bfloat16_rn(x1 * c + x0 * s);
}

}  // namespace osprey::cuda
