// What the attention kernels' device code needs on the CPU emulation beyond wgmma_emulation.h
// (scripts/emulate_attention_decode.sh, scripts/emulate_attention_wgmma.sh): vector types, bf16x2
// helpers, and the warp-collective ldmatrix of mma.cuh from the PTX ISA's layout, independently of the
// kernels (mma.sync m16n8k16 is moe_decode_emulation.h's).
#pragma once

#include <cmath>

#include "wgmma_emulation.h"

// (float4 and make_float4: moe_decode_emulation.h)
struct uint2 {
    uint32_t x, y;
};
struct float2 {
    float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 __ldcg(const float4* p) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return *p;
}
inline float2 __ldcg(const float2* p) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return *p;
}
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
inline float __low2float(__nv_bfloat162 v) { return __bfloat162float(v.x); }
inline float __high2float(__nv_bfloat162 v) { return __bfloat162float(v.y); }
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return {__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}

namespace osprey::cuda {

// Per-warp exchange of the row addresses of one ldmatrix.
struct EmuWarpFrag {
    const void* addr[32];
};
inline std::vector<EmuWarpFrag> g_warp_frag;  // [warps of the block], sized by the driver

// mma_bf16: moe_decode_emulation.h's (g_mma, sized per block by the driver), plus mma.cuh's overload.
inline void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    mma_bf16(c, a[0], a[1], a[2], a[3], b0, b1);
}

// mma.cuh's FP16 variants: the same fragment layouts as mma_bf16 (moe_decode_emulation.h), the halves
// read as IEEE binary16 (subnormals included), products exact in double, FP32 result.
inline float emu_f16(uint32_t r, int hi) {
    const uint16_t b = uint16_t(hi ? r >> 16 : r);
    _Float16 h;
    std::memcpy(&h, &b, 2);
    return float(h);
}
inline uint32_t pack_f16(float lo, float hi) {
    const _Float16 l = _Float16(lo), h = _Float16(hi);  // round to nearest even
    uint16_t a, b;
    std::memcpy(&a, &l, 2), std::memcpy(&b, &h, 2);
    return uint32_t(a) | (uint32_t(b) << 16);
}
inline void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    g_mma[w][lane] = {{a[0], a[1], a[2], a[3]}, {b0, b1}};
    wbar();
    auto A = [&](int row, int k) {
        return emu_f16(g_mma[w][(row % 8) * 4 + (k % 8) / 2].a[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
    };
    auto B = [&](int k, int col) { return emu_f16(g_mma[w][col * 4 + (k % 8) / 2].b[k >= 8 ? 1 : 0], k % 2); };
    float d[4];
    for (int i = 0; i < 4; ++i) {
        const int row = lane / 4 + (i >= 2 ? 8 : 0), col = 2 * (lane % 4) + i % 2;
        double sum = 0.0;
        for (int k = 0; k < 16; ++k) sum += double(A(row, k)) * double(B(k, col));
        d[i] = float(double(c[i]) + sum);
    }
    wbar();
    for (int i = 0; i < 4; ++i) c[i] = d[i];
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i. Lane l receives row l/4,
// elements 2(l%4), +1 of each matrix (trans: element (row 2(l%4) + {0,1}, column l/4)).
inline void emu_ldmatrix(uint32_t (&r)[4], const void* p, bool trans) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    EmuWarpFrag& f = g_warp_frag[w];
    const auto* b = static_cast<const uint8_t*>(p);
    if (b < g_smem_window || b + 16 > g_smem_window + g_smem_window_bytes || (b - g_smem_window) % 16)
        emu_fail("ldmatrix row address outside shared memory or misaligned");
    f.addr[lane] = p;
    wbar();
    for (int i = 0; i < 4; ++i) {
        uint16_t e[2];
        for (int j = 0; j < 2; ++j) {
            const int row = trans ? 2 * (lane % 4) + j : lane / 4, col = trans ? lane / 4 : 2 * (lane % 4) + j;
            std::memcpy(&e[j], static_cast<const uint8_t*>(f.addr[8 * i + row]) + 2 * col, 2);
        }
        r[i] = uint32_t(e[0]) | (uint32_t(e[1]) << 16);
    }
    wbar();
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) { emu_ldmatrix(r, p, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) { emu_ldmatrix(r, p, true); }

}  // namespace osprey::cuda
