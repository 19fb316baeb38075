// A CPU emulation of the CUDA features the sampling kernel uses, to check its block-level logic without a
// GPU (scripts/emulate_sampling_kernel.sh): one block at a time, one std::thread per CUDA thread,
// std::barrier for __syncthreads and for the warp-synchronous intrinsics (all lanes must call them
// together, as the kernel does with full masks), std::atomic_ref for atomics. Slow (OS threads), so
// only small vocabularies; not a CTest test.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
#include <algorithm>
#include <climits>
using std::min; using std::max;
struct dim3 { unsigned x = 1, y = 1, z = 1; };
// kernels/cuda/timeline.cuh's instrumentation (off in every emulation).
#define OSPREY_TL_ENTER() (void)0
#define OSPREY_TL_WAITED() (void)0
#define OSPREY_TL_EXIT(key, tag) (void)0
inline thread_local dim3 threadIdx, blockIdx;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
inline std::barrier<>* g_block = nullptr;
inline std::vector<std::barrier<>*> g_warp;
struct alignas(8) Slot { uint64_t v[32]; };
inline std::vector<Slot> g_slots;
// One emulated CTA of `threads` threads: its block barrier (__syncthreads), its warp barriers (wbar) and
// its warps' shuffle slots, installed in g_block / g_warp / g_slots for as long as it lives.
struct EmuCtaSync {
    std::barrier<> block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    explicit EmuCtaSync(int threads) : block(threads) {
        for (int w = 0; w < threads / 32; ++w) warps.push_back(std::make_unique<std::barrier<>>(32));
        g_block = &block;
        g_warp.clear();
        for (auto& w : warps) g_warp.push_back(w.get());
        g_slots.assign(size_t(threads / 32), Slot{});
    }
};
inline void __syncthreads() { g_block->arrive_and_wait(); }
inline void wbar() { g_warp[threadIdx.x / 32]->arrive_and_wait(); }
template <class T> T xchg(T v, int src_lane) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    uint64_t b = 0; std::memcpy(&b, &v, sizeof(T));
    g_slots[w].v[lane] = b;
    wbar();
    uint64_t o = g_slots[w].v[src_lane];
    wbar();
    T r; std::memcpy(&r, &o, sizeof(T));
    return r;
}
template <class T> T __shfl_up_sync(unsigned, T v, int o) { int l = threadIdx.x % 32; return xchg(v, l >= o ? l - o : l); }
template <class T> T __shfl_xor_sync(unsigned, T v, int o) { int l = threadIdx.x % 32; return xchg(v, l ^ o); }
template <class T> T __shfl_sync(unsigned, T v, int s) { return xchg(v, s); }
inline unsigned __ballot_sync(unsigned, bool p) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    g_slots[w].v[lane] = p; wbar();
    unsigned m = 0; for (int i = 0; i < 32; ++i) if (g_slots[w].v[i]) m |= 1u << i;
    wbar(); return m;
}
inline unsigned __match_any_sync(unsigned, uint32_t v) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    g_slots[w].v[lane] = v; wbar();
    unsigned m = 0; for (int i = 0; i < 32; ++i) if (g_slots[w].v[i] == v) m |= 1u << i;
    wbar(); return m;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs(int(x)); }
inline uint32_t atomicAdd(uint32_t* p, uint32_t v) { return std::atomic_ref<uint32_t>(*p).fetch_add(v); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline uint32_t atomicOr(uint32_t* p, uint32_t v) { return std::atomic_ref<uint32_t>(*p).fetch_or(v); }
inline uint32_t atomicExch(uint32_t* p, uint32_t v) { return std::atomic_ref<uint32_t>(*p).exchange(v); }
inline int atomicMin(int* p, int v) { std::atomic_ref<int> a(*p); int o = a.load(); while (v < o && !a.compare_exchange_weak(o, v)) {} return o; }
inline int atomicMax(int* p, int v) { std::atomic_ref<int> a(*p); int o = a.load(); while (v > o && !a.compare_exchange_weak(o, v)) {} return o; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
inline uint32_t __float_as_uint(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
using std::isnan; using std::isfinite; using std::exp; using std::log;
typedef void* cudaStream_t;
