// Device helpers of the FP8 KV cache (kv_fp8.h): E4M3 encode/decode matching core/fp8.h bit for bit
// (round to nearest even, saturating to ±448: cvt.rn.satfinite), the per-row multiplier, and the decodes to BF16 /
// FP16 pairs (the cache-row index is kv_cache_row.cuh's).
// Host builds (the CPU emulation harnesses, scripts/emulate_attention_*.sh) take the software path.
#pragma once

#if !defined(OSPREY_CUDA_EMULATION)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif
#if !defined(__CUDA_ARCH__)
#include <cstring>

#include "core/fp8.h"
#endif

#include <cstdint>

namespace osprey::cuda {

// Two E4M3 codes (lo = first element) of v0 / s and v1 / s. The division is IEEE (as the CPU
// reference's fp8::quantize), then one rounding to E4M3.
__host__ __device__ inline uint16_t kv_fp8_encode2(float v0, float v1, float s) {
#if defined(__CUDA_ARCH__)
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(__fdiv_rn(v1, s)), "f"(__fdiv_rn(v0, s)));
    return r;
#else
    return uint16_t(fp8::float_to_e4m3(v0 / s) | (fp8::float_to_e4m3(v1 / s) << 8));
#endif
}

// The multiplier of a row whose largest magnitude is amax (fp8::block_scale_inv).
__host__ __device__ inline float kv_fp8_scale(float amax) {
    return amax > 0.0f ? amax / 448.0f : 1.0f;
}

// Two E4M3 codes (lo byte first) as a bf16x2 register (lo in the low half): exact, every E4M3 value
// is a BF16 value.
__host__ __device__ inline uint32_t kv_fp8_to_bf16x2(uint32_t pair) {
#if defined(__CUDA_ARCH__)
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(uint16_t(pair)));
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    return *reinterpret_cast<const uint32_t*>(&b);
#else
    auto bits = [](float f) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        return u >> 16;  // exact: the value has at most 4 significant bits
    };
    return bits(fp8::e4m3_to_float(uint8_t(pair))) | (bits(fp8::e4m3_to_float(uint8_t(pair >> 8))) << 16);
#endif
}

// Two E4M3 codes (lo byte first) as an f16x2 register (lo in the low half): exact, one instruction.
__host__ __device__ inline uint32_t kv_fp8_to_f16x2(uint32_t pair) {
#if defined(__CUDA_ARCH__)
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(uint16_t(pair)));
    return h;
#else
    auto half_bits = [](uint8_t code) -> uint32_t {  // every E4M3 value is a normal f16 (or zero)
        const float f = fp8::e4m3_to_float(code);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        const uint32_t sign = (u >> 16) & 0x8000u;
        if ((u & 0x7FFFFFFFu) == 0) return sign;
        const int e = int((u >> 23) & 0xFF) - 127 + 15;
        return sign | uint32_t(e << 10) | ((u >> 13) & 0x3FFu);
    };
    return half_bits(uint8_t(pair)) | (half_bits(uint8_t(pair >> 8)) << 16);
#endif
}

// Two E4M3 codes times a multiplier, as a bf16x2 register (each rounded to nearest even once).
__host__ __device__ inline uint32_t kv_fp8_to_bf16x2_scaled(uint32_t pair, float s) {
#if defined(__CUDA_ARCH__)
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(uint16_t(pair)));
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * s, f.y * s);
    return *reinterpret_cast<const uint32_t*>(&b);
#else
    auto bf = [](float f) {  // round to nearest even (finite values)
        uint32_t u;
        std::memcpy(&u, &f, 4);
        return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    };
    return bf(fp8::e4m3_to_float(uint8_t(pair)) * s) | (bf(fp8::e4m3_to_float(uint8_t(pair >> 8)) * s) << 16);
#endif
}

// Eight codes (8 bytes) times a multiplier as eight bf16 (16 bytes): a 16-byte shared-memory chunk
// of a BF16 K/V tile (the prefill kernels dequantise while staging).
__host__ __device__ inline uint4 kv_fp8x8_to_bf16x8(uint2 codes, float s) {
    uint4 r;
    r.x = kv_fp8_to_bf16x2_scaled(codes.x & 0xFFFFu, s);
    r.y = kv_fp8_to_bf16x2_scaled(codes.x >> 16, s);
    r.z = kv_fp8_to_bf16x2_scaled(codes.y & 0xFFFFu, s);
    r.w = kv_fp8_to_bf16x2_scaled(codes.y >> 16, s);
    return r;
}

}  // namespace osprey::cuda
