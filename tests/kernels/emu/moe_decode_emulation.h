// What kernels/cuda/moe_decode.cu and moe_mid.cu need beyond cuda_emulation.h, for running its device code on the
// CPU (scripts/emulate_moe_decode.sh): uint4, float4, BF16 conversions and bf16x2 multiply, byte_perm,
// cache-hinted loads and stores, fences, and a warp-collective mma.sync m16n8k16 (BF16 in, FP32
// accumulate) that gathers the 32 lanes' fragments exactly as PTX lays them out. PDL is a no-op
// (the emulated grids run one after the other); dynamic shared memory is g_dyn_smem.
#pragma once

#define OSPREY_CUDA_EMULATION 1

#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "core/check.h"
#include "cuda_emulation.h"

struct uint4 {
    uint32_t x, y, z, w;
};
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    return {a, b, c, d};
}
inline dim3 gridDim;
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) {
    return {a, b, c, d};
}
#define __align__(n) alignas(n)

struct __nv_bfloat16 {
    uint16_t bits;
};
inline float bits_to_float(uint16_t b) {
    const uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint16_t float_to_bits_rn(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // NaN stays NaN
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float __bfloat162float(__nv_bfloat16 h) {
    return bits_to_float(h.bits);
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    return {float_to_bits_rn(f)};
}
inline float __expf(float x) {
    return std::exp(x);
}

inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    uint8_t b[8];
    std::memcpy(b, &x, 4), std::memcpy(b + 4, &y, 4);
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r |= uint32_t(b[(s >> (4 * i)) & 7]) << (8 * i);
    return r;
}

template <class T>
T __ldg(const T* p) {
    return *p;
}
inline float __ldcg(const float* p) {
    return std::atomic_ref<const float>(*p).load();
}
inline void __stcg(float* p, float v) {
    std::atomic_ref<float>(*p).store(v);
}
inline void __threadfence() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
}
inline void __threadfence_block() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
}
inline void __syncwarp() {
    wbar();
}
[[noreturn]] inline void __trap() {
    std::fprintf(stderr, "__trap() in block %u thread %u\n", blockIdx.x, threadIdx.x);
    std::abort();
}

namespace osprey::cuda {

inline uint8_t* g_dyn_smem = nullptr;

// mbarrier: pending arrivals and transaction bytes of the current phase; the phase flips when both
// reach zero. cp.async.bulk is a memcpy followed by its byte count's completion.
struct mbar_t {
    std::mutex m;
    int count = 0, pending = 0;
    long tx = 0;
    std::atomic<uint32_t> phase{0};
    void complete_if_done() {
        if (pending == 0 && tx == 0) pending = count, phase.fetch_add(1);
    }
};
inline void mbar_init(mbar_t* b, uint32_t count) {
    b->count = b->pending = int(count), b->tx = 0, b->phase = 0;
}
inline void mbar_init_fence() {}
inline void mbar_arrive_expect_tx(mbar_t* b, uint32_t bytes) {
    std::lock_guard<std::mutex> l(b->m);
    b->tx += bytes, --b->pending;
    b->complete_if_done();
}
inline void mbar_arrive(mbar_t* b) {
    std::lock_guard<std::mutex> l(b->m);
    --b->pending;
    b->complete_if_done();
}
// Spins a little, then sleeps between polls: hundreds of emulated threads wait at once, and yielding
// alone keeps them all runnable (the emulations slowed each other down on a shared 2-core machine).
inline void mbar_wait(mbar_t* b, uint32_t parity) {
    for (int n = 0; (b->phase.load() & 1u) == parity; ++n) {
        if (n < 64) {
            std::this_thread::yield();
        } else {
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
}
inline void mbar_wait_sleep(mbar_t* b, uint32_t parity) {  // the hint changes nothing here
    mbar_wait(b, parity);
}
inline void bulk_copy(void* dst, const void* src, uint32_t bytes, mbar_t* b, uint64_t) {
    if (bytes % 16 || reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16) {
        std::fprintf(stderr, "bulk_copy: misaligned (%u bytes)\n", bytes);
        std::abort();
    }
    std::memcpy(dst, src, bytes);
    std::lock_guard<std::mutex> l(b->m);
    b->tx -= bytes;
    b->complete_if_done();
}
inline uint4 ld_shared16(const uint8_t* p) {
    uint4 r;
    std::memcpy(&r, p, 16);
    return r;
}
inline uint4 ld_act16(const __nv_bfloat16* p) {
    uint4 r;
    std::memcpy(&r, p, 16);
    return r;
}

inline uint64_t evict_first_policy() {
    return 0;
}
inline uint64_t evict_last_policy() {
    return 0;
}
inline void bulk_prefetch_l2(const void*, uint32_t bytes) {
    if (bytes % 16) {
        std::fprintf(stderr, "bulk_prefetch_l2: %u bytes\n", bytes);
        std::abort();
    }
}

inline void griddep_wait() {}
inline void griddep_launch_dependents() {}
inline uint4 ldg_stream(const uint8_t* p) {
    uint4 r;
    std::memcpy(&r, p, 16);
    return r;
}
// Each half: exact product of two BF16 (fits FP32), rounded to BF16 (mul.rn.bf16x2).
inline uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    const float lo = bits_to_float(uint16_t(a)) * bits_to_float(uint16_t(b));
    const float hi = bits_to_float(uint16_t(a >> 16)) * bits_to_float(uint16_t(b >> 16));
    return uint32_t(float_to_bits_rn(lo)) | (uint32_t(float_to_bits_rn(hi)) << 16);
}

struct MmaLane {
    uint32_t a[4], b[2];
};
inline std::vector<std::array<MmaLane, 32>> g_mma;  // [warps of the block]

// c[16x8] += a[16x16] · b[16x8]; fragments as PTX "mma.m16n8k16" (r = lane / 4, q = lane % 4):
// a0 (row r, k 2q..2q+1), a1 (row r+8), a2 (row r, k 2q+8..), a3 (row r+8, k 2q+8..);
// b0 (k 2q..2q+1, col r), b1 (k 2q+8..); c0 (r, 2q), c1 (r, 2q+1), c2 (r+8, 2q), c3 (r+8, 2q+1).
inline void mma_bf16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    g_mma[w][lane] = {{a0, a1, a2, a3}, {b0, b1}};
    wbar();
    auto half = [](uint32_t r, int k) { return bits_to_float(uint16_t(k % 2 ? r >> 16 : r)); };
    auto A = [&](int row, int k) {
        return half(g_mma[w][(row % 8) * 4 + (k % 8) / 2].a[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k);
    };
    auto B = [&](int k, int col) { return half(g_mma[w][col * 4 + (k % 8) / 2].b[k >= 8 ? 1 : 0], k); };
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

// CTA b's `threads` CUDA threads, a std::thread each (threadIdx.x, blockIdx.x set), each calling kernel();
// returns when all have ended. The caller sets up the block's barriers and gridDim first.
template <class Kernel>
void emu_threads(int b, int threads, Kernel&& kernel) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            threadIdx.x = unsigned(t);
            blockIdx.x = unsigned(b);
            kernel();
        });
    for (auto& th : pool) th.join();
}

// CTA b of a grid of `grid` (gridDim.x, blockIdx.x) of the mma.sync kernels (moe_decode, moe_mid) as `threads`
// std::threads each calling kernel(): fresh block and warp barriers, shuffle slots and mma fragments, and
// smem bytes of dynamic shared memory (g_dyn_smem, 128-byte aligned) that start as 0xFF.
template <class Kernel>
void emu_run_mma_cta(int b, int grid, int threads, size_t smem, Kernel&& kernel) {
    std::vector<uint8_t> dyn(smem + 256, 0xFF);
    g_dyn_smem = dyn.data() + (128 - reinterpret_cast<uintptr_t>(dyn.data()) % 128) % 128;
    const EmuCtaSync sync(threads);
    g_mma.assign(size_t(threads) / 32, {});
    gridDim.x = unsigned(grid);
    emu_threads(b, threads, kernel);
}

}  // namespace osprey::cuda
