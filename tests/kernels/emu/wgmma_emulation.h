// What the Hopper kernels' sm90 primitives (kernels/cuda/wgmma.cuh) and attention_prefill_wgmma.cu
// need beyond cuda_emulation.h + moe_decode_emulation.h, for running their device code on the CPU
// (scripts/emulate_attention_wgmma.sh), one std::thread per CUDA thread:
//   - shared memory is a 1024-aligned "window"; a shared address is the byte offset into it, and the
//     dynamic shared memory starts g_smem_skew bytes in (so the kernel's own alignment is exercised);
//   - cp.async copies are queued per thread and land only when a cp.async.wait_group retires their
//     group (so a consumer that reads a stage before the producer's barrier sees stale bytes);
//   - mbarriers (phase/parity as PTX) and named barriers (bar.sync / bar.arrive with a thread count)
//     block on condition variables;
//   - wgmma.mma_async runs synchronously at issue, as a warpgroup collective: the operands are read
//     through the matrix descriptors exactly as the PTX ISA defines the canonical 128B-swizzled
//     K-major and MN-major layouts (computed here from the descriptor fields, independently of the
//     kernel's own sw128_offset), the fragments are gathered from the 128 threads with the documented
//     register layouts, and the descriptors and scale-d must be warpgroup-uniform.
#pragma once

#include <barrier>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include "cp_async_queue.h"
#include "moe_decode_emulation.h"

namespace osprey::cuda {

inline constexpr int kWarpSize = 32;

inline uint8_t* g_smem_window = nullptr;  // 1024-aligned start of the emulated shared address space
inline size_t g_smem_window_bytes = 0;

[[noreturn]] inline void emu_fail(const char* what) {
    std::fprintf(stderr, "emulation: %s (block %u,%u thread %u)\n", what, blockIdx.x, blockIdx.y, threadIdx.x);
    std::abort();
}

// ---- cp.async (mma.cuh): cp_async_queue.h ----
inline void cp_async16(void* smem, const void* gmem, bool valid = true) {
    const auto* p = static_cast<uint8_t*>(smem);
    if (p < g_smem_window || p + 16 > g_smem_window + g_smem_window_bytes || (p - g_smem_window) % 16)
        emu_fail("cp.async destination outside shared memory or misaligned");
    if (valid && reinterpret_cast<uintptr_t>(gmem) % 16) emu_fail("cp.async source misaligned");
    cp_async_enqueue(smem, gmem, valid, 16);
}
inline void cp_async4(void* smem, const void* gmem, bool valid = true) {
    const auto* p = static_cast<uint8_t*>(smem);
    if (p < g_smem_window || p + 4 > g_smem_window + g_smem_window_bytes || (p - g_smem_window) % 4)
        emu_fail("cp.async (4 bytes) destination outside shared memory or misaligned");
    if (valid && reinterpret_cast<uintptr_t>(gmem) % 4) emu_fail("cp.async (4 bytes) source misaligned");
    cp_async_enqueue(smem, gmem, valid, 4);
}

inline uint32_t pack_bf16(float lo, float hi) {
    return uint32_t(float_to_bits_rn(lo)) | (uint32_t(float_to_bits_rn(hi)) << 16);
}
inline void pdl_enter() {}

namespace sm90 {

inline uint32_t smem_u32(const void* p) {
    const auto* b = static_cast<const uint8_t*>(p);
    if (b < g_smem_window || b > g_smem_window + g_smem_window_bytes) emu_fail("not a shared-memory pointer");
    return uint32_t(b - g_smem_window);
}

// ---- mbarrier ----
struct EmuMbar {
    std::mutex m;
    std::condition_variable cv;
    int count = 0, pending = 0;
    uint32_t phase = 0;
};
inline std::mutex g_mbar_mutex;
inline std::map<const void*, std::unique_ptr<EmuMbar>> g_mbars;  // keyed by the barrier's shared address
inline EmuMbar& emu_mbar(const uint64_t* bar) {
    std::lock_guard<std::mutex> l(g_mbar_mutex);
    auto it = g_mbars.find(bar);
    if (it == g_mbars.end()) emu_fail("mbarrier used before mbarrier.init");
    return *it->second;
}
inline void mbar_init(uint64_t* bar, uint32_t count) {
    smem_u32(bar);
    auto b = std::make_unique<EmuMbar>();
    b->count = b->pending = int(count);
    std::lock_guard<std::mutex> l(g_mbar_mutex);
    g_mbars[bar] = std::move(b);
}
inline void mbar_arrive(uint64_t* bar) {
    EmuMbar& b = emu_mbar(bar);
    std::lock_guard<std::mutex> l(b.m);
    if (--b.pending == 0) {
        b.pending = b.count;
        ++b.phase;
        b.cv.notify_all();
    }
}
inline void mbar_wait(uint64_t* bar, uint32_t parity) {
    EmuMbar& b = emu_mbar(bar);
    std::unique_lock<std::mutex> l(b.m);
    b.cv.wait(l, [&] { return (b.phase & 1u) != parity; });
}
inline void fence_proxy_async() {}

// ---- named barriers ----
struct EmuNamedBar {
    std::mutex m;
    std::condition_variable cv;
    int arrived = 0, expected = 0;
    uint64_t generation = 0;
};
inline std::array<EmuNamedBar, 16> g_named;
inline void emu_named_reset() {
    for (auto& b : g_named) b.arrived = 0, b.expected = 0, b.generation = 0;
}
inline uint64_t emu_named_arrive(EmuNamedBar& b, int n, std::unique_lock<std::mutex>&) {
    if (b.arrived == 0) b.expected = n;
    if (b.expected != n) emu_fail("named barrier used with two thread counts");
    const uint64_t gen = b.generation;
    if (++b.arrived == n) {
        b.arrived = 0;
        ++b.generation;
        b.cv.notify_all();
    }
    return gen;
}
inline void named_bar_sync(int id, int n) {
    EmuNamedBar& b = g_named.at(size_t(id));
    std::unique_lock<std::mutex> l(b.m);
    const uint64_t gen = emu_named_arrive(b, n, l);
    b.cv.wait(l, [&] { return b.generation != gen; });
}
inline void named_bar_arrive(int id, int n) {
    EmuNamedBar& b = g_named.at(size_t(id));
    std::unique_lock<std::mutex> l(b.m);
    emu_named_arrive(b, n, l);
}

// ---- wgmma ----
inline void wgmma_fence() {}
inline void wgmma_commit() {}
template <int kPending>
inline void wgmma_wait() {}
template <class T, int N>
inline void fence_regs(T (&)[N]) {}

struct WgSlot {
    uint64_t desc_a = 0, desc_b = 0;
    int accumulate = 0;
    uint32_t a[4] = {0, 0, 0, 0};
};
inline std::vector<std::unique_ptr<std::barrier<>>> g_wg_bar;  // [warpgroups of the block]
inline std::vector<std::array<WgSlot, 128>> g_wg_slots;

// The bf16 element (row, k) of a K-major (mn_major false: row = M/N index) or MN-major operand
// (mn_major true: row = M/N index, k = K index, stored with the MN dimension contiguous), 128B swizzle.
inline float emu_desc_element(uint64_t desc, bool mn_major, int mn, int k) {
    if ((desc >> 62) != 1) emu_fail("descriptor: only the 128B swizzle is emulated");
    if (((desc >> 49) & 7) != 0) emu_fail("descriptor: base offset must be 0");
    const uint32_t start = uint32_t(desc & 0x3FFF) << 4;
    const uint32_t lbo = uint32_t((desc >> 16) & 0x3FFF) << 4;
    const uint32_t sbo = uint32_t((desc >> 32) & 0x3FFF) << 4;
    uint32_t addr;
    if (!mn_major)  // ((8,m),(T,2k)) : ((8T,SBO),(1,T)), T = 8 elements
        addr = start + uint32_t(mn % 8) * 128 + uint32_t(mn / 8) * sbo + uint32_t(k) * 2;
    else  // ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO))
        addr = start + uint32_t(mn % 64) * 2 + uint32_t(mn / 64) * lbo + uint32_t(k % 8) * 128 + uint32_t(k / 8) * sbo;
    addr ^= ((addr >> 7) & 7u) << 4;  // Swizzle<3,4,3>
    if (addr + 2 > g_smem_window_bytes) emu_fail("wgmma operand outside shared memory");
    uint16_t bits;
    std::memcpy(&bits, g_smem_window + addr, 2);
    return bits_to_float(bits);
}

inline float emu_half(uint32_t r, int hi) { return bits_to_float(uint16_t(hi ? r >> 16 : r)); }

// d[64 x N] (+)= A[64 x 16] · B[16 x N] for the calling thread's fragment of the warpgroup.
template <int N>
inline void emu_wgmma(float* d, const uint32_t* a_regs, uint64_t desc_a, uint64_t desc_b, bool accumulate,
                      bool b_mn_major) {
    const int wg = int(threadIdx.x) / 128, t = int(threadIdx.x) % 128;
    WgSlot& mine = g_wg_slots[wg][t];
    mine.desc_a = desc_a, mine.desc_b = desc_b, mine.accumulate = accumulate;
    if (a_regs) std::memcpy(mine.a, a_regs, sizeof mine.a);
    g_wg_bar[wg]->arrive_and_wait();
    const WgSlot& first = g_wg_slots[wg][0];
    if (first.desc_a != desc_a || first.desc_b != desc_b || first.accumulate != int(accumulate))
        emu_fail("wgmma operands differ across the warpgroup");
    auto A = [&](int row, int k) {
        if (!a_regs) return emu_desc_element(desc_a, false, row, k);
        // RS form: warp row / 16, lane (row % 8) * 4 + (k % 8) / 2; register (row % 16 >= 8) + 2 (k >= 8).
        const WgSlot& s = g_wg_slots[wg][(row / 16) * 32 + (row % 8) * 4 + (k % 8) / 2];
        return emu_half(s.a[(row % 16 >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
    };
    auto B = [&](int k, int n) { return emu_desc_element(desc_b, b_mn_major, n, k); };
    const int warp = t / 32, lane = t % 32;
    float out[N / 2];
    for (int i = 0; i < N / 8; ++i)
        for (int e = 0; e < 4; ++e) {
            const int row = warp * 16 + lane / 4 + (e >= 2 ? 8 : 0), col = i * 8 + 2 * (lane % 4) + e % 2;
            double sum = accumulate ? double(d[4 * i + e]) : 0.0;
            for (int k = 0; k < 16; ++k) sum += double(A(row, k)) * double(B(k, col));
            out[4 * i + e] = float(sum);
        }
    g_wg_bar[wg]->arrive_and_wait();  // the slots are read by the whole warpgroup before reuse
    for (int i = 0; i < N / 2; ++i) d[i] = out[i];
}

inline void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    emu_wgmma<128>(d, nullptr, desc_a, desc_b, accumulate, false);
}
inline void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    emu_wgmma<64>(d, nullptr, desc_a, desc_b, accumulate, false);
}
inline void wgmma_m64n64k16_rs_mn(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
    emu_wgmma<64>(d, a, 0, desc_b, accumulate, true);
}
inline float exp2_approx(float x) { return std::exp2(x); }
template <int kRegs>
inline void reg_dealloc() {
    static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256);
}
template <int kRegs>
inline void reg_alloc() {
    static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256);
}

}  // namespace sm90
}  // namespace osprey::cuda
