#!/usr/bin/env bash
# Checks the GEMV kernels' logic (indices, bounds, the k permutation of the mma fragments, the
# persistent row-block loop, synchronisation) on a machine without a GPU: extracts the device code of
# src/kernels/cuda/linear.cu, compiles it as C++ against a CPU emulation (tests/kernels/emu/
# cuda_emulation.h; mma.sync m16n8k16 from PTX's fragment layout) and compares it with a double
# reference. Both weight formats: BF16, and FP8 E4M3 with block multipliers (the in-register E4M3 ->
# BF16 decode is the kernel's own integer code; mul.bf16x2 and, for the one-warp-per-row gemv_wide,
# cvt.rn.f16x2.e4m3x2 are emulated). About 1-2 minutes on 2 cores.
#   usage: scripts/emulate_gemv_kernel.sh BUILD_DIR [seed]
#   BUILD_DIR: a configured build with osprey_core built (ninja -C BUILD_DIR osprey_core).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?usage: $0 BUILD_DIR [seed]}"
seed="${2:-1}"
out="$build/emulate_gemv"
mkdir -p "$out"
src="$root/src/kernels/cuda/linear.cu"
{
  echo '#include "cuda_emulation.h"'
  echo '#include "core/bf16.h"'
  cat <<'CPP'
#include <memory>
#include "core/fp8.h"
#define __align__(n)
using osprey::bf16;
using __nv_bfloat16 = osprey::bf16;
inline float __bfloat162float(bf16 v) { return osprey::bf16_to_float(v); }
inline bf16 __float2bfloat16_rn(float f) { return osprey::float_to_bf16(f); }
struct uint4 { uint32_t x, y, z, w; };
struct float2 { float x, y; };
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint4 __ldcs(const uint4* p) { return *p; }
inline uint4 __ldg(const uint4* p) { return *p; }
inline float __ldg(const float* p) { return *p; }
inline thread_local unsigned char* g_dyn_smem = nullptr;
inline dim3 gridDim;
namespace osprey::cuda {
inline constexpr int kWarpSize = 32;
using std::min;
inline void pdl_enter() {}
// The router tail's counter (outside the extracted part): CTAs run one after the other here, so a router
// CTA must find the projection's count complete when it starts; anything else would hang on the GPU.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void gemv_count_release(unsigned* counter) { atomicAdd(counter, 1u); }
inline void gemv_count_wait(const unsigned* counter, unsigned target) {
    const unsigned v = std::atomic_ref<unsigned>(*const_cast<unsigned*>(counter)).load();
    if (v < target) {
        std::fprintf(stderr, "router tail: a router CTA waits for %u projection CTAs, %u counted\n", target, v);
        std::abort();
    }
}
inline float __ldcg(const float* p) { return *p; }
struct __nv_bfloat162 { bf16 x, y; };
struct GemvNorm { const float *res, *moe_y, *moe_w, *gain; bf16* h; float eps; };
struct Fp8Weight { const uint8_t* codes; const float* scale; int block_rows; };
// The fields of linear.h's LinearArgs that gemv_wide_kernel reads.
struct LinearArgs {
    void* y; const bf16* x; const bf16* w; Fp8Weight w8; const void* bias;
    int n_tokens, n_out, n_in; bool accumulate;
};
// The norm prologue's row (rmsnorm_row.cuh) as a plain loop: what the emulation checks is how the GEMV
// stages, reorders and hands on the rows, not the norm's own arithmetic (test_linear checks that on the
// GPU, bit for bit against the rmsnorm kernel). emu_rmsnorm_row is also the checker's reference.
inline void emu_rmsnorm_row(const float* x, const float* moe_y, const float* moe_w, const float* gain, int d,
                            float eps, bf16* y) {
    std::vector<float> v(size_t(d), 0.f);
    double sq = 0;
    for (int i = 0; i < d; ++i) {
        float dv = 0.f;
        if (moe_y)
            for (int k = 0; k < 4; ++k) dv += moe_w[k] * moe_y[size_t(k) * d + i];
        v[size_t(i)] = x[i] + dv;
        sq += double(v[size_t(i)]) * v[size_t(i)];
    }
    const float scale = float(1.0 / std::sqrt(sq / d + double(eps)));
    for (int i = 0; i < d; ++i) y[i] = osprey::float_to_bf16(v[size_t(i)] * scale * gain[i]);
}
template <int kThreads>
void rmsnorm_row(const float* x, const float*, const float* moe_y, const float* moe_w, const float*,
                 const float* gain, int d, float eps, __nv_bfloat162* y) {
    if (threadIdx.x == 0) emu_rmsnorm_row(x, moe_y, moe_w, gain, d, eps, reinterpret_cast<bf16*>(y));
    __syncthreads();
}
inline float warp_reduce_sum(float v) {
    for (int o = kWarpSize / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
inline void bf16x8_to_float(const uint4& u, float (&f)[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    for (int i = 0; i < 4; ++i)
        f[2 * i] = osprey::bf16_to_float(bf16{uint16_t(w[i] & 0xFFFF)}),
        f[2 * i + 1] = osprey::bf16_to_float(bf16{uint16_t(w[i] >> 16)});
}
// mul.rn.bf16x2: each half's product in float (exact: 8-bit significands), rounded to nearest even.
inline uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
    auto half = [](uint32_t v, int i) { return osprey::bf16_to_float(bf16{uint16_t(v >> (16 * i))}); };
    uint32_t r = 0;
    for (int i = 0; i < 2; ++i) r |= uint32_t(osprey::float_to_bf16(half(a, i) * half(b, i)).bits) << (16 * i);
    return r;
}
// cvt.rn.f16x2.e4m3x2 + widening (gemv_wide): the reference decode (the PTX itself is not emulated).
inline float2 e4m3x2_to_float2(uint32_t pair) {
    return {osprey::fp8::e4m3_to_float(uint8_t(pair)), osprey::fp8::e4m3_to_float(uint8_t(pair >> 8))};
}
// mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32 from PTX's fragment layout (lane: g = lane / 4,
// q = lane % 4): A regs {a0: row g, k 2q..2q+1; a1: row g+8, k 2q..; a2: row g, k 2q+8..; a3: row
// g+8, k 2q+8..}, B regs {b0: k 2q..2q+1, col g; b1: k 2q+8.., col g}, C {row g col 2q, 2q+1; row g+8
// col 2q, 2q+1}; the lower 16 bits hold the lower k.
struct MmaSlot { uint32_t a[4], b[2]; };
inline std::vector<MmaSlot> g_mma;  // [warps * 32]
inline float lo_bf(uint32_t r) { return osprey::bf16_to_float(bf16{uint16_t(r & 0xFFFF)}); }
inline float hi_bf(uint32_t r) { return osprey::bf16_to_float(bf16{uint16_t(r >> 16)}); }
inline void mma_bf16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    g_mma[w * 32 + lane] = {{a0, a1, a2, a3}, {b0, b1}};
    wbar();
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
        const MmaSlot& s = g_mma[w * 32 + l];
        const int g = l / 4, q = l % 4;
        A[g][2 * q] = lo_bf(s.a[0]), A[g][2 * q + 1] = hi_bf(s.a[0]);
        A[g + 8][2 * q] = lo_bf(s.a[1]), A[g + 8][2 * q + 1] = hi_bf(s.a[1]);
        A[g][2 * q + 8] = lo_bf(s.a[2]), A[g][2 * q + 9] = hi_bf(s.a[2]);
        A[g + 8][2 * q + 8] = lo_bf(s.a[3]), A[g + 8][2 * q + 9] = hi_bf(s.a[3]);
        B[2 * q][g] = lo_bf(s.b[0]), B[2 * q + 1][g] = hi_bf(s.b[0]);
        B[2 * q + 8][g] = lo_bf(s.b[1]), B[2 * q + 9][g] = hi_bf(s.b[1]);
    }
    wbar();
    const int g = lane / 4, q = lane % 4;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * q, 2 * q + 1, 2 * q, 2 * q + 1};
    for (int i = 0; i < 4; ++i) {
        float s = c[i];
        for (int kk = 0; kk < 16; ++kk) s += A[rows[i]][kk] * B[kk][cols[i]];
        c[i] = s;
    }
}
}  // namespace osprey::cuda
CPP
  echo 'namespace osprey::cuda {'
  sed -n '/^constexpr int kGemvWarps/,/^bool aligned16/p' "$src" | sed '$d' \
    | sed 's/extern __shared__ __align__(16) unsigned char smem\[\];/unsigned char* smem = g_dyn_smem;/'
  sed -n '/^constexpr int kWideWarps/,/^void gemv_wide(/p' "$src" | sed '$d'
  cat <<'CPP'
// `grid` CTAs of `threads` threads, one block after the other, a std::thread per CUDA thread running body().
template <class Body>
inline void emu_run_ctas(int grid, int threads_per_cta, size_t smem_bytes, Body body) {
    gridDim.x = unsigned(grid);
    for (int b = 0; b < grid; ++b) {
        std::vector<unsigned char> smem(smem_bytes, 0xFF);  // garbage: NaN if read unwritten
        const EmuCtaSync sync(threads_per_cta);
        g_mma.assign(size_t(threads_per_cta), MmaSlot{});
        std::vector<std::thread> threads;
        for (int t = 0; t < threads_per_cta; ++t)
            threads.emplace_back([&, t] {
                threadIdx.x = unsigned(t);
                blockIdx.x = unsigned(b);
                g_dyn_smem = smem.data();
                body();
            });
        for (auto& th : threads) th.join();
    }
}
// gemv_kernel.
inline void emu_launch(const GemvParams& p, int tiles, bool f32, bool norm, bool fp8, int grid, size_t smem_bytes) {
    emu_run_ctas(grid, kGemvThreads, smem_bytes, [&] {
        auto run = [&]<int kT, bool kF>() {
            if (norm) {
                fp8 ? gemv_kernel<kT, kF, true, true>(p) : gemv_kernel<kT, kF, true, false>(p);
            } else {
                fp8 ? gemv_kernel<kT, kF, false, true>(p) : gemv_kernel<kT, kF, false, false>(p);
            }
        };
        if (tiles == 1) f32 ? run.operator()<1, true>() : run.operator()<1, false>();
        if (tiles == 2) f32 ? run.operator()<2, true>() : run.operator()<2, false>();
        if (tiles == 4) f32 ? run.operator()<4, true>() : run.operator()<4, false>();
    });
}
// gemv_router_tail_kernel over its n_main + n_tail CTAs.
inline void emu_launch_tail(const GemvTailParams& tp, int tiles_main, size_t smem_bytes) {
    emu_run_ctas(tp.n_main + tp.n_tail, kGemvThreads, smem_bytes, [&] {
        if (tiles_main == 1) gemv_router_tail_kernel<1>(tp);
        if (tiles_main == 2) gemv_router_tail_kernel<2>(tp);
        if (tiles_main == 4) gemv_router_tail_kernel<4>(tp);
    });
}
// gemv_wide_kernel (one warp per output row), blocks of kWideWarps warps one after the other.
inline void emu_launch_wide(const LinearArgs& a, int ldx, int ldy, bool f32, bool fp8) {
    const int t_case = a.n_tokens <= 1 ? 1 : a.n_tokens <= 2 ? 2 : a.n_tokens <= 4 ? 4 : 8;
    emu_run_ctas((a.n_out + kWideWarps - 1) / kWideWarps, kWideWarps * 32, 0, [&] {
        auto run = [&]<int kT>() {
            if (f32) {
                fp8 ? gemv_wide_kernel<kT, true, true>(a, ldx, ldy) : gemv_wide_kernel<kT, true, false>(a, ldx, ldy);
            } else {
                fp8 ? gemv_wide_kernel<kT, false, true>(a, ldx, ldy) : gemv_wide_kernel<kT, false, false>(a, ldx, ldy);
            }
        };
        if (t_case == 1) run.operator()<1>();
        if (t_case == 2) run.operator()<2>();
        if (t_case == 4) run.operator()<4>();
        if (t_case == 8) run.operator()<8>();
    });
}
}  // namespace osprey::cuda
CPP
} > "$out/gemv_emulated.h"
grep -q "gemv_kernel" "$out/gemv_emulated.h"
grep -q "gemv_router_tail_kernel" "$out/gemv_emulated.h"
grep -q "gemv_wide_kernel" "$out/gemv_emulated.h"
grep -q "e4m3x4_to_bf16x2" "$out/gemv_emulated.h"
g++ -std=c++20 -O1 -ffp-contract=off -I"$out" -I"$root/tests/kernels/emu" -I"$root/src" \
  "$root/tests/kernels/emu/emulate_gemv.cpp" "$build/src/core/libosprey_core.a" -lpthread -o "$out/emulate_gemv"
"$out/emulate_gemv" "$seed"
