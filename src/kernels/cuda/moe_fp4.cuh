// Device helpers shared by the weight-streaming MoE kernels (moe_decode.cu, moe_mid.cu): the PTX of
// their bulk-copy rings and programmatic dependent launch, and the MXFP4 -> BF16 decode.
// Their CPU emulations (scripts/emulate_moe_decode.sh, scripts/emulate_moe_mid.sh) paste this file's
// namespace body into the extracted device code; the parts under #ifndef OSPREY_CUDA_EMULATION are
// provided by tests/kernels/emu/moe_decode_emulation.h there.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/mxfp4_words.h"

namespace osprey::cuda {

// Decoded weights are FP4 · 2^(scale - 159): the BF16 multiplier 2^(scale - 33) has exponent field
// scale + 94 (valid for scale <= 160); the accumulators are multiplied back by 2^32.
inline constexpr uint32_t kScaleExponentBias = 127 - 33;
inline constexpr float kUnscale = 4294967296.0f;  // 2^32

#ifndef OSPREY_CUDA_EMULATION  // (the emulation provides these: tests/kernels/emu/moe_decode_emulation.h)

__device__ __forceinline__ void griddep_wait() {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void griddep_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;\n" ::);
}

// An L2 policy for data other blocks read again soon (moe_mid's activation tiles).
__device__ __forceinline__ uint64_t evict_last_policy() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}
// An L2 policy for data read once (the expert weights): evicted first, so that the 50+ MB of experts
// streamed per layer do not push out what the other kernels of the step reuse (measured: 20b batch 1
// 432 -> 453 tokens/s).
__device__ __forceinline__ uint64_t evict_first_policy() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}
// bytes (multiple of 16, both addresses 16-byte aligned) from global to shared memory, counted on bar.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, mbar_t* bar, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
        "%4;\n" ::"r"(smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
        : "memory");
}
// Starts fetching bytes (multiple of 16, 16-byte aligned) from global memory into L2 (no completion).
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ uint4 ld_shared16(const uint8_t* p) {
    return *reinterpret_cast<const uint4*>(p);
}
// Activations written by the previous kernel: through L2 only (never a stale L1 line).
__device__ __forceinline__ uint4 ld_act16(const __nv_bfloat16* p) {
    return __ldcg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
#endif  // OSPREY_CUDA_EMULATION

// The 8 nibbles of a word as 4 BF16x2 pairs (elements (0,4), (1,5), (2,6), (3,7)) times scale2, from
// either stored layout (mxfp4_words.h: the published one, or moe_decode's second copy in 9 integer
// operations instead of 13; the same registers either way).
template <Mxfp4WordLayout kWords = Mxfp4WordLayout::published>
__device__ __forceinline__ void decode_fp4x8(uint32_t w, uint32_t scale2, uint32_t (&r)[4]) {
    if constexpr (kWords == Mxfp4WordLayout::published) {
        fp4x8_pairs_published(w, r);
    } else {
        fp4x8_pairs_decode_layout(w, r);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) r[i] = bf16x2_mul(r[i], scale2);
}

__device__ __forceinline__ float swiglu(float gate, float up, float alpha, float limit) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    return gate / (1.0f + __expf(-alpha * gate)) * (up + 1.0f);
}

}  // namespace osprey::cuda
