// What kernels/cuda/moe_mlp_wgmma.cu needs beyond moe_decode_emulation.h, for running its device code
// on the CPU (scripts/emulate_moe_wgmma.sh):
//   - shared addresses: offsets from g_smem_window (a 1024-aligned base); the dynamic shared memory the
//     kernel sees starts 16 bytes past it, so the kernel's own 1024-byte alignment is exercised;
//   - cp.async (16 bytes, zero-fill) as an immediate copy, its mbarrier arrival as a plain arrival;
//     st.shared.v4 as a copy (alignment checked);
//     cp.async.bulk as moe_decode_emulation.h's bulk_copy;
//   - wgmma.mma_async m64nNk16 (N = 64, 128, 256; A from registers or, the SS form, from a shared-memory
//     descriptor like B; B from a shared-memory descriptor) as the PTX ISA defines it, executed LAZILY:
//     mma_async only records (accumulator pointer, A register pointer or A descriptor, B descriptor);
//     wait_group N executes every recorded operation but those of the newest N committed groups,
//     reading the A registers and shared memory at that moment (so a decoded weight tile rewritten
//     before the wait that covers its MMAs gives a wrong result). So a kernel that rewrites an A
//     buffer, releases a stage, or reads its accumulators before the wait that covers them computes a
//     wrong result here, as it could on the GPU. The B element (k, n) is read from the address the
//     descriptor defines for a K-major operand with the 128-byte swizzle:
//         start + (n % 8) * 128 + (n / 8) * SBO + (k / 8) * 16 + (k % 8) * 2, then bits [4,7) ^= bits [7,10)
//     and descriptors of any other form (layout type, LBO != 1, base offset) abort;
//   - wgmma.mma_async m64nNk32 e4m3 x e4m3 (moe_w4a8_emulation.h records it with e4m3 = true): the same
//     lazy execution, the 8-bit A fragment or (SS form, the matrix-expert GEMM) an 8-bit K-major A read
//     through its descriptor like B, a K-major 8-bit B (byte k of the 128-byte row), and scale-d 0
//     (accumulate = false) overwriting d;
//   - g_wgmma_complete_at_commit: every group executed at its commit instead (the earliest completion);
//   - setmaxnreg, wgmma.fence, fence.proxy.async, PDL: no-ops.
#pragma once

#include <algorithm>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "core/fp8.h"
#include "moe_decode_emulation.h"

namespace osprey::cuda {

inline uint8_t* g_smem_window = nullptr;  // 1024-aligned; shared address 0
inline std::vector<std::barrier<>*> g_warpgroup;  // [warpgroups of the block]

inline uint32_t smem_u32(const void* p) {
    return uint32_t(static_cast<const uint8_t*>(p) - g_smem_window);
}
inline uint8_t* dynamic_smem() {
    return g_dyn_smem;
}
inline void pdl_enter() {}
template <int kRegs>
void setmaxnreg_dec() {}
template <int kRegs>
void setmaxnreg_inc() {}
inline void fence_proxy_async() {}
inline void wgmma_fence() {}
template <int N>
void fence_operands(float (&)[N]) {}

inline void cp_async16_zfill(void* dst, const void* src, bool valid) {
    if (reinterpret_cast<uintptr_t>(dst) % 16 || (valid && reinterpret_cast<uintptr_t>(src) % 16)) {
        std::fprintf(stderr, "cp.async: misaligned\n");
        std::abort();
    }
    if (valid) std::memcpy(dst, src, 16);
    else std::memset(dst, 0, 16);
}
inline void cp_async_mbar_arrive_noinc(mbar_t* bar) {
    mbar_arrive(bar);
}
inline void cp_async_wait_all() {}
inline void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, mbar_t* bar) {
    bulk_copy(dst, src, bytes, bar, 0);
}

struct WgmmaOp {
    float* d;
    const uint32_t* a;  // register A (RS form), or nullptr: A from shared memory through desc_a (SS form)
    uint64_t desc;      // B
    int n;              // wgmma N: d holds n / 2 values per thread
    uint64_t desc_a = 0;
    bool e4m3 = false;       // m64nNk32 e4m3 x e4m3 (moe_w4a8_emulation.h) instead of m64nNk16 bf16
    bool accumulate = true;  // scale-d: false overwrites d
};
struct WgmmaQueue {
    std::vector<WgmmaOp> ops;        // recorded, not yet executed
    std::vector<size_t> group_ends;  // ops.size() at each commit not yet executed
};
inline std::vector<WgmmaQueue> g_wgmma;  // [threads of the block]

template <int N>
void wgmma_m64nNk16(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc) {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256);
    g_wgmma[threadIdx.x].ops.push_back({d, a, desc, N});
}
template <int N>
void wgmma_m64nNk16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b) {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256);
    g_wgmma[threadIdx.x].ops.push_back({d, nullptr, desc_b, N, desc_a});
}
inline void st_shared16(uint8_t* p, uint4 v) {
    if (reinterpret_cast<uintptr_t>(p) % 16) {
        std::fprintf(stderr, "st.shared.v4: misaligned\n");
        std::abort();
    }
    std::memcpy(p, &v, 16);
}
// Completion time of the wgmma groups: false (the default) at the wait_group that covers them, the latest
// the hardware may (catches reading partial sums or releasing operands too early); true at their commit,
// the earliest (catches a group overwriting registers that the kernel still reads, e.g. one partial set
// reused while its previous contents are being promoted).
inline bool g_wgmma_complete_at_commit = false;
template <int kPending>
void wgmma_wait();
inline void wgmma_commit() {
    WgmmaQueue& q = g_wgmma[threadIdx.x];
    q.group_ends.push_back(q.ops.size());
    if (g_wgmma_complete_at_commit) wgmma_wait<0>();  // warpgroup-wide, as commit_group (.sync.aligned)
}

// B(k, n) of a K-major BF16 operand with the 128-byte swizzle, from its descriptor (also A(m, k) of
// the SS form: the same canonical layout with m in place of n).
inline float wgmma_b(uint64_t desc, int k, int n) {
    const uint32_t start = uint32_t(desc & 0x3FFFu) << 4;
    const uint32_t lbo = uint32_t((desc >> 16) & 0x3FFFu);
    const uint32_t sbo = uint32_t((desc >> 32) & 0x3FFFu) << 4;
    const uint32_t base_offset = uint32_t((desc >> 49) & 7u);
    const uint32_t layout = uint32_t(desc >> 62);
    constexpr uint64_t kFields = 0x3FFFull | (0x3FFFull << 16) | (0x3FFFull << 32) | (7ull << 49) | (3ull << 62);
    if (layout != 1 || lbo != 1 || base_offset != 0 || (desc & ~kFields) != 0) {
        std::fprintf(stderr, "wgmma: unsupported descriptor %016llx\n", static_cast<unsigned long long>(desc));
        std::abort();
    }
    uint32_t addr = start + uint32_t(n % 8) * 128 + uint32_t(n / 8) * sbo + uint32_t(k / 8) * 16 + uint32_t(k % 8) * 2;
    addr ^= ((addr >> 7) & 7u) << 4;
    uint16_t bits;
    std::memcpy(&bits, g_smem_window + addr, 2);
    return bits_to_float(bits);
}

// B(k, n) of a K-major E4M3 operand with the 128-byte swizzle (one byte per k: rows of 128 k), from its
// descriptor (the same fields as the BF16 form above).
inline float wgmma_b_e4m3(uint64_t desc, int k, int n) {
    const uint32_t start = uint32_t(desc & 0x3FFFu) << 4;
    const uint32_t sbo = uint32_t((desc >> 32) & 0x3FFFu) << 4;
    if (uint32_t(desc >> 62) != 1 || ((desc >> 16) & 0x3FFFu) != 1 || ((desc >> 49) & 7u) != 0) {
        std::fprintf(stderr, "wgmma e4m3: unsupported descriptor %016llx\n", static_cast<unsigned long long>(desc));
        std::abort();
    }
    uint32_t addr = start + uint32_t(n % 8) * 128 + uint32_t(n / 8) * sbo + uint32_t(k);
    addr ^= ((addr >> 7) & 7u) << 4;
    return osprey::fp8::e4m3_to_float(g_smem_window[addr]);
}
// A(row, k) of an 8-bit register fragment (wgmma .m64nNk32, PTX "Register Fragments"): the owner thread
// is lane (row % 8) * 4 + (k % 16) / 4 of warp row / 16; register (row % 16) / 8 + 2 (k / 16), byte k % 4.
inline float wgmma_a_e4m3(const uint32_t* a_of_owner, int row, int k) {
    const uint32_t reg = a_of_owner[(row % 16) / 8 + 2 * (k / 16)];
    return osprey::fp8::e4m3_to_float(uint8_t(reg >> (8 * (k % 4))));
}

// Executes every recorded operation of this thread's warpgroup but those of the newest kPending
// committed groups. All 128 threads of the warpgroup call it together (.sync.aligned).
template <int kPending>
void wgmma_wait() {
    const int wg = int(threadIdx.x) / 128, t = int(threadIdx.x) % 128, warp = t / 32, lane = t % 32;
    WgmmaQueue& me = g_wgmma[threadIdx.x];
    const size_t groups = me.group_ends.size();
    const size_t n_exec = groups > size_t(kPending) ? me.group_ends[groups - kPending - 1] : 0;
    g_warpgroup[wg]->arrive_and_wait();  // every thread's registers and queue are final
    auto a_elem = [&](size_t op, int row, int k) {  // A(row, k) of operation op, from its owner's registers
        if (me.ops[op].a == nullptr) return wgmma_b(me.ops[op].desc_a, k, row);  // SS: shared memory, now
        const int owner = wg * 128 + (row / 16) * 32 + (row % 8) * 4 + (k % 8) / 2;
        const uint32_t reg = g_wgmma[owner].ops[op].a[(row % 16) / 8 + 2 * (k / 8)];
        return bits_to_float(uint16_t(k % 2 ? reg >> 16 : reg));
    };
    for (size_t i = 0; i < n_exec; ++i) {
        const WgmmaOp& op = me.ops[i];
        for (int v = 0; v < op.n / 2; ++v) {  // d[4j + r]: row 16 warp + lane / 4 + 8 (r / 2), column 8j + 2 (lane % 4) + r % 2
            const int row = 16 * warp + lane / 4 + 8 * ((v / 2) % 2);
            const int col = 8 * (v / 4) + 2 * (lane % 4) + v % 2;
            double sum = 0.0;
            if (op.e4m3) {
                for (int k = 0; k < 32; ++k) {
                    const int owner = wg * 128 + (row / 16) * 32 + (row % 8) * 4 + (k % 16) / 4;
                    const double a = op.a == nullptr ? double(wgmma_b_e4m3(op.desc_a, k, row))  // SS: shared memory, now
                                                     : double(wgmma_a_e4m3(g_wgmma[owner].ops[i].a, row, k));
                    sum += a * double(wgmma_b_e4m3(op.desc, k, col));
                }
            } else {
                for (int k = 0; k < 16; ++k) sum += double(a_elem(i, row, k)) * double(wgmma_b(op.desc, k, col));
            }
            op.d[v] = float((op.accumulate ? double(op.d[v]) : 0.0) + sum);
        }
    }
    g_warpgroup[wg]->arrive_and_wait();  // nobody reads this queue any more
    me.ops.erase(me.ops.begin(), me.ops.begin() + long(n_exec));
    while (!me.group_ends.empty() && me.group_ends.front() <= n_exec) me.group_ends.erase(me.group_ends.begin());
    for (size_t& e : me.group_ends) e -= n_exec;
}

// ---- the drivers' CTA launch (emulate_moe_wgmma.cpp, emulate_moe_w4a8.cpp, emulate_moe_matrix.cpp) ----

// The block-level state of `threads` emulated CUDA threads: block, warp and warpgroup barriers, the warp
// shuffle slots and an empty wgmma queue per thread.
inline void emu_setup_block(int threads) {
    static std::vector<std::unique_ptr<std::barrier<>>> warps, wgs;
    static std::unique_ptr<std::barrier<>> block;
    block = std::make_unique<std::barrier<>>(threads);
    warps.clear(), wgs.clear();
    for (int w = 0; w < threads / 32; ++w) warps.push_back(std::make_unique<std::barrier<>>(32));
    for (int w = 0; w < threads / 128; ++w) wgs.push_back(std::make_unique<std::barrier<>>(128));
    g_block = block.get();
    g_warp.clear();
    for (auto& w : warps) g_warp.push_back(w.get());
    g_warpgroup.clear();
    for (auto& w : wgs) g_warpgroup.push_back(w.get());
    g_slots.assign(size_t(threads) / 32, Slot{});
    g_wgmma.assign(size_t(threads), {});
}

// CTA b of a grid of `grid` (gridDim.x, blockIdx.x), as `threads` std::threads each calling kernel(); then
// aborts if a thread left wgmma operations it never waited for (a missing wait_group).
template <class Kernel>
void emu_run_cta(int b, int grid, int threads, Kernel&& kernel) {
    emu_setup_block(threads);
    gridDim.x = unsigned(grid);
    emu_threads(b, threads, kernel);
    for (const WgmmaQueue& q : g_wgmma)
        if (!q.ops.empty()) {
            std::fprintf(stderr, "CTA %d: a thread exited with %zu wgmma operations never waited for\n", b, q.ops.size());
            std::abort();
        }
}

// A persistent grid, CTA after CTA, over dynamic shared memory of smem_bytes that starts as 0xFF in every CTA
// (g_dyn_smem 16 bytes into a 1024-byte aligned window, as the kernels' static part puts it).
template <class Kernel>
void emu_run_grid(int grid, int threads, size_t smem_bytes, Kernel&& kernel) {
    std::vector<uint8_t> buf(smem_bytes + 2048);
    g_smem_window = buf.data() + (1024 - reinterpret_cast<uintptr_t>(buf.data()) % 1024) % 1024;
    for (int b = 0; b < grid; ++b) {
        std::fill(buf.begin(), buf.end(), 0xFF);
        g_dyn_smem = g_smem_window + 16;
        emu_run_cta(b, grid, threads, kernel);
    }
}

}  // namespace osprey::cuda
