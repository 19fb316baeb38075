#!/usr/bin/env bash
# Checks the GEMV kernel's logic (indices, bounds, the k permutation of the mma fragments, the
# persistent row-block loop, synchronisation) on a machine without a GPU: extracts the device code of
# src/kernels/cuda/linear.cu, compiles it as C++ against a CPU emulation (tests/kernels/emu/
# cuda_emulation.h; mma.sync m16n8k16 from PTX's fragment layout) and compares it with a double
# reference (about 1-3 minutes on 2 cores).
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
inline thread_local unsigned char* g_dyn_smem = nullptr;
inline dim3 gridDim;
namespace osprey::cuda {
inline constexpr int kWarpSize = 32;
using std::min;
inline void pdl_enter() {}
inline float __ldcg(const float* p) { return *p; }
struct __nv_bfloat162 { bf16 x, y; };
// The norm prologue (kNorm) has its own test on the GPU (test_linear); the emulation runs kNorm = false.
struct GemvNorm { const float *res, *moe_y, *moe_w, *gain; bf16* h; float eps; };
template <int kThreads>
void rmsnorm_row(const float*, const float*, const float*, const float*, const float*, const float*, int, float,
                 __nv_bfloat162*) {}
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
  cat <<'CPP'
// One block after the other, a std::thread per CUDA thread.
inline void emu_launch(const GemvParams& p, int tiles, bool f32, int grid, size_t smem_bytes) {
    gridDim.x = unsigned(grid);
    for (int b = 0; b < grid; ++b) {
        std::vector<unsigned char> smem(smem_bytes, 0xFF);  // garbage: NaN if read unwritten
        std::barrier<> block(kGemvThreads);
        std::vector<std::unique_ptr<std::barrier<>>> warps;
        for (int w = 0; w < kGemvWarps; ++w) warps.push_back(std::make_unique<std::barrier<>>(32));
        g_block = &block;
        g_warp.clear();
        for (auto& w : warps) g_warp.push_back(w.get());
        g_mma.assign(kGemvThreads, MmaSlot{});
        std::vector<std::thread> threads;
        for (int t = 0; t < kGemvThreads; ++t)
            threads.emplace_back([&, t] {
                threadIdx.x = unsigned(t);
                blockIdx.x = unsigned(b);
                g_dyn_smem = smem.data();
                auto run = [&]<int kT, bool kF>() { gemv_kernel<kT, kF, false>(p); };
                if (tiles == 1) f32 ? run.operator()<1, true>() : run.operator()<1, false>();
                if (tiles == 2) f32 ? run.operator()<2, true>() : run.operator()<2, false>();
                if (tiles == 4) f32 ? run.operator()<4, true>() : run.operator()<4, false>();
            });
        for (auto& th : threads) th.join();
    }
}
}  // namespace osprey::cuda
CPP
} > "$out/gemv_emulated.h"
grep -q "gemv_kernel" "$out/gemv_emulated.h"
g++ -std=c++20 -O1 -ffp-contract=off -I"$out" -I"$root/tests/kernels/emu" -I"$root/src" \
  "$root/tests/kernels/emu/emulate_gemv.cpp" "$build/src/core/libosprey_core.a" -lpthread -o "$out/emulate_gemv"
"$out/emulate_gemv" "$seed"
