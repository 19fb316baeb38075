// What the persistent warp-specialised MoE GEMMs share (moe_mlp_wgmma.cu: W4A16, moe_mlp_w4a8.cu: W4A8):
// the PTX wrappers of their producer/consumer pipeline (bulk and 16/4-byte cp.async with zero fill and
// the mbarrier arrival, the generic-to-async proxy fence, setmaxnreg, the wgmma fence/commit/wait), the
// K-major 128B-swizzle descriptor, the clamped SwiGLU of mlp1's epilogue, the (expert, n-tile, m-tile)
// schedule, and the host's shared-memory opt-in. Their CPU emulations (tests/kernels/emu) provide the
// wrappers under #ifndef OSPREY_CUDA_EMULATION with the same names; the rest is compiled there as is.
#pragma once

#ifndef OSPREY_CUDA_EMULATION
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {

__device__ __forceinline__ uint8_t* dynamic_smem() {
    extern __shared__ __align__(16) uint8_t smem_raw[];
    return smem_raw;
}
// bytes (multiple of 16, both addresses 16-byte aligned) from global to shared memory, counted on bar.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, mbar_t* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
            smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
}
// 16 bytes global -> shared; valid == false zero-fills the destination and reads nothing.
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
// 4 bytes global -> shared (both 4-byte aligned), zero-filled when !valid.
__device__ __forceinline__ void cp_async4_zfill(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 4 : 0)
                 : "memory");
}
// One arrival on bar once all of this thread's earlier cp.async have landed (.noinc: the arrival is
// one of the barrier's expected count).
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(mbar_t* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Orders this thread's view of the generic-proxy writes (cp.async) before its async-proxy reads (wgmma).
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accesses of the accumulators across the wgmma fences and waits.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The dynamic shared memory a MoE GEMM may use: 227 KB per block on the H200, less the static barriers
// and tile table.
inline constexpr int kMoeGemmMaxSmemBytes = 227 * 1024 - 2048;

// Opts `kernel` in to kMoeGemmMaxSmemBytes of dynamic shared memory; returns the SM count (the
// persistent grid).
inline int moe_gemm_prepare_device(const void* kernel) {
    int device = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMoeGemmMaxSmemBytes));
    return sms;
}

}  // namespace osprey::cuda
#endif  // OSPREY_CUDA_EMULATION

namespace osprey::cuda {

// Descriptor of a K-major operand with the 128-byte swizzle starting at shared address `addr` (rows of
// 128 bytes: 64 BF16 or 128 E4M3; 8-row groups 1024 bytes apart; PTX "Matrix Descriptor Format"):
// start >> 4 in [0,14), LBO 1 (unused by swizzled K-major layouts), SBO 1024 >> 4 in [32,46), base
// offset 0 (1024-aligned tiles), layout type 1 (128B swizzle) in [62,64).
__device__ __forceinline__ uint64_t desc_k_sw128(uint32_t addr) {
    return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
           (uint64_t(1) << 62);
}

// gpt-oss's clamped SwiGLU (spec §3.6) of one unit.
__device__ __forceinline__ float moe_swiglu(float gate, float up, float alpha, float limit) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    return gate / (1.0f + __expf(-alpha * gate)) * (up + 1.0f);
}

// One tile of the schedule: routed rows [row0, row0 + n_rows) of sorted order, weight rows f0.. of expert.
struct MoeTile {
    int expert, row0, n_rows, f0;
};

// Tile t (< tile_start[n_experts]) from the per-expert prefix sum of tile counts; tiles are numbered
// expert-major, then n-tile (kBN routed rows), then m-tile (kBM weight rows). P: the kernel's Params
// (offsets, n_experts, m_tiles).
template <int kBN, int kBM, class P>
__device__ __forceinline__ MoeTile moe_tile_at(const P& p, const int* tile_start, int t) {
    int lo = 0, hi = p.n_experts - 1;  // the last expert e with tile_start[e] <= t has tiles
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (tile_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    const int local = t - tile_start[lo];
    const int n_tile = local / p.m_tiles, m_tile = local % p.m_tiles;
    const int begin = p.offsets[lo], end = p.offsets[lo + 1];
    const int row0 = begin + n_tile * kBN;
    return {lo, row0, min(kBN, end - row0), m_tile * kBM};
}

// tile_start[e] = the tiles (ceil(rows / kBN) n-tiles times m_tiles each) of experts before e, and
// tile_start[n_experts] all of them: a prefix sum by the 32 lanes of one warp. P as for moe_tile_at.
template <int kBN, class P>
__device__ __forceinline__ void moe_count_tiles(const P& p, int* tile_start, int lane) {
    int before = 0;
    for (int e0 = 0; e0 < p.n_experts; e0 += 32) {
        const int e = e0 + lane;
        const int rows = e < p.n_experts ? p.offsets[e + 1] - p.offsets[e] : 0;
        int incl = (rows + kBN - 1) / kBN * p.m_tiles;
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
            const int n = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += n;
        }
        if (e < p.n_experts) tile_start[e + 1] = before + incl;
        before += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) tile_start[0] = 0;
}

}  // namespace osprey::cuda
