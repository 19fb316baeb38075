// W4A8 MXFP4 expert GEMMs on Hopper FP8 warpgroup MMA (wgmma m64nNk32 e4m3 x e4m3 -> f32, sm_90a):
// moe_w4a8() of moe_mlp_w4a8.h. The arithmetic is kernels/cpu/w4a8_matmul.h's (docs/fp8.md, "W4A8").
//
// Roles, schedule and pipeline follow the W4A16 kernel (moe_mlp_wgmma.cu): a persistent CTA of one
// producer warpgroup (cp.async) and kConsumerWGs consumer warpgroups; a tile is (expert, kBN routed rows,
// kBM weight rows), tiles numbered expert-major then n-tile then m-tile, CTA b takes b, b + grid, ...;
// kStages stages on full/empty mbarriers; the tile's E8M0 scales in one cp.async.bulk into one of two
// per-tile buffers. What differs:
//
// Stage = one 128-k block (kBK = 128): the B tile holds kBN rows x 128 E4M3 (128 bytes per row, the
// 128-byte swizzle, chunk c of row n at c ^ (n % 8)), the FP4 tile kBM rows x 64 bytes (4 MXFP4 groups,
// chunk h of row m at h ^ ((m >> 1) & 3): the consumers' 32-bit loads are bank-conflict free), and the
// stage's activation scales (kBN floats, one 4-byte cp.async per row, zero-filled past the tile).
// K = 2880 (22.5 blocks): the last stage's chunks past n_in are zero-filled (FP4 0 and E4M3 0).
//
// Operands. Weights are the M side, decoded into the register A fragment of wgmma's RS form; routed
// rows are N, the B operand, read through a K-major 128B-swizzle descriptor (8-bit operands must be
// K-major; the descriptor is the BF16 kernel's: a k32 step of E4M3 is 32 bytes, as a k16 step of BF16).
// 8-bit A fragment (PTX "Register Fragments", wgmma .m64nNk32 .e4m3): thread t, warp w = t / 32,
// g = lane / 4, q = lane % 4: a[0] = row 16w + g, k 4q..4q+3 (byte i = k 4q + i); a[1] = row + 8, same k;
// a[2] = row 16w + g, k 16 + 4q..; a[3] = row + 8, k 16 + 4q... The k order inside a 32-element step
// is ours to choose as long as A and B agree: moe_w4a8_quantize stores activation element 8j + 4h + i of
// each group at position 16h + 4j + i, so thread q's A registers hold weight elements 8q..8q+3 (a[0],
// a[1]) and 8q+4..8q+7 (a[2], a[3]) = the low and high halves of 32-bit word q of the group's 16 FP4
// bytes. One 32-bit shared load per (row, group).
//
// Exact FP4 -> E4M3 (kernels/cpu/w4a8_matmul.h): in the 128-k block of a weight row, S = the largest of
// its group scale bytes, and group i's FP4 x becomes e4m3(x · 2^(s_i - S + 6)); the block multiplier
// 2^(S - 133) goes into the promotion. Per (row, group) the 8 magnitudes' codes form a byte table of
// two registers, indexed by prmt with the 3-bit magnitudes; the sign bits are moved to bit 7 of each
// byte. With off = s_i - S + 12 >= 1 the table is the base codes plus off in the exponent field
// (two integer multiply-adds; no E4M3 subnormals arise); below (spreads of 12 or more binades, never
// in trained checkpoints) it is computed value by value with round to nearest even, as the reference.
//
// Consumers, per tile: the accumulators start from the bias (FP32, unscaled). Per stage: the block
// maxima S of its two rows per m-block, then for each of the 4 groups: the tables, decode the A
// fragment into buffer h % 2, wgmma.fence, wgmma m64nNk32 into the partial accumulators (scale-d 0 on
// the first group: no zeroing), commit, wait_group 1 (group h - 1 done: its buffer is the next one);
// after the 4: wait_group 0, then acc = fma(part · 2^(S - 133), xs(row n), acc)
// for every accumulator, and the stage goes back to the producer. Two consumer warpgroups share the
// tensor cores, so one warpgroup's promotion overlaps the other's MMAs. Epilogues: mlp1 the clamped
// SwiGLU on the gate/up row pairs (lanes 4 apart) into u, bf16, natural columns; mlp2 y per routed row.
//
// Numerics: the weights are the MXFP4 weights exactly (spread <= 14); the activations carry E4M3's
// rounding (2^-4 relative, half a step); the tensor core adds each k32 step's products to the partial
// accumulator with about 13 fraction bits of the largest term (truncation), a 128-k block at a time,
// then FP32 promotion. Tests: tests/kernels/test_moe_mlp.cu (w4a8 cases against the W4A8 CPU reference
// and the exact MXFP4 one), scripts/emulate_moe_w4a8.sh (this file's device code on the CPU).
#ifndef OSPREY_CUDA_EMULATION
#include "kernels/cuda/moe_mlp_w4a8.h"
#include "kernels/cuda/mbarrier.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/runtime.h"
#endif

#include <tuple>

#include "kernels/cuda/moe_gemm_sm90.cuh"

namespace osprey::cuda::w4a8 {

constexpr int kConsumerWGs = 2;
constexpr int kBK = 128;  // k per stage: one scale block, 4 MXFP4 groups, one 128-byte row of E4M3
constexpr int kThreads = 128 * (1 + kConsumerWGs);
constexpr int kConsumerWarps = 4 * kConsumerWGs;
constexpr int kMaxExperts = 256;
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;

template <int kMBlocks_, int kBN_, int kStages_>
struct Config {
    static constexpr int kMBlocks = kMBlocks_;                // wgmma m64 blocks per consumer warpgroup
    static constexpr int kBM = 64 * kMBlocks * kConsumerWGs;  // weight rows per tile
    static constexpr int kBN = kBN_;                          // routed rows per tile (wgmma n)
    static constexpr int kStages = kStages_;
    static constexpr int kAcc = kBN / 2;                      // accumulator registers per m-block (main; the same partial)
    static constexpr int kXStageBytes = kBN * kBK;            // B: kBN rows x 128 E4M3
    static constexpr int kWStageBytes = kBM * kBK / 2;        // FP4: kBM rows x 64 bytes
    static constexpr int kSStageBytes = kBN * 4;              // activation scales of the stage's block
    static constexpr int kStageBytes = (kXStageBytes + kWStageBytes + kSStageBytes + 1023) / 1024 * 1024;
    static_assert(kMBlocks == 1 || kMBlocks == 2);
    static_assert(kBN == 64 || kBN == 128);
    static_assert(kXStageBytes % 1024 == 0);
};

// $OSPREY_MOE_W4A8_VARIANT. Main + partial accumulators: 2 · kMBlocks · kBN / 2 registers per thread.
using Variants = std::tuple<Config<1, 128, 6>,   // 0: 128 x 128 tiles (m64n128k32), 6 stages (default)
                            Config<2, 64, 6>,    // 1: 256 x 64 tiles (2 x m64n64k32)
                            Config<1, 64, 8>>;   // 2: 128 x 64 tiles, 8 stages (small batches per expert)
constexpr int kVariants = int(std::tuple_size_v<Variants>);
template <int kVariant>
using Variant = std::tuple_element_t<kVariant, Variants>;

enum class Proj { mlp1, mlp2 };

struct Params {
    const uint8_t* blocks;        // [n_experts, n_out, n_groups, 16]
    const uint8_t* scales;        // [n_experts, n_out, n_groups]
    const __nv_bfloat16* bias;    // [n_experts, n_out]
    const uint8_t* xq;            // mlp1: [n_tokens, n_in] (gathered); mlp2: [n_rows, n_in] (sorted); MMA order
    const float* xs;              // [rows, n_kt]
    void* out;                    // mlp1: u [n_rows, n_out / 2] bf16 natural columns; mlp2: y [n_rows, n_out] f32
    const int32_t* offsets;       // [n_experts + 1]
    const int32_t* sorted_rows;   // [n_rows]
    int n_experts, top_k, n_in, n_out, n_groups, n_kt, m_tiles;
    float alpha, limit;
};

template <class Cfg>
constexpr size_t smem_bytes(int n_groups) {
    return 1024 + size_t(Cfg::kStages) * Cfg::kStageBytes + 2 * size_t(Cfg::kBM) * n_groups;
}

#ifndef OSPREY_CUDA_EMULATION
// d[64 x N] (+)= a[64 x 32] (registers, E4M3) · b[32 x N] (shared memory, K-major E4M3 via desc); scale_d 0
// overwrites d. 8-bit wgmma has no transpose immediates: "scale-d, imm-scale-a, imm-scale-b".
template <int N>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc, int scale_d);
template <>
__device__ __forceinline__ void wgmma_e4m3<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wgmma_e4m3<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

__device__ __forceinline__ uint32_t ld_shared32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t sel) { return __byte_perm(lo, hi, sel); }
__device__ __forceinline__ float round_even(float x) { return rintf(x); }
__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return lo | (hi << 16);
}
#endif  // OSPREY_CUDA_EMULATION

// The E4M3 code of a small positive value fp4 · 2^k, k <= -6 (the slow table path): exact at and
// above 2^-6, else round to nearest even in steps of 2^-9 (as fp8::float_to_e4m3).
__device__ __forceinline__ uint32_t e4m3_small(float v) {
    if (v >= 0.015625f) {
        const uint32_t bits = __float_as_uint(v);
        return ((((bits >> 23) & 0xFFu) - 127u + 7u) << 3) | ((bits >> 20) & 7u);
    }
    return uint32_t(round_even(v * 512.0f));
}
// The code table of one (row, group): bytes 0..7 of {lo, hi} = the E4M3 codes of FP4 magnitudes
// 0, .5, 1, 1.5, 2, 3, 4, 6 times 2^(s - S + 6), off = s - S + 12.
__device__ __forceinline__ void code_table(int off, uint32_t& lo, uint32_t& hi) {
    if (off >= 1) {  // every code normal: exponent field = the base's + off
        lo = 0x0C080000u + uint32_t(off) * 0x08080800u;
        hi = 0x1C181410u + uint32_t(off) * 0x08080808u;
        return;
    }
    // 12 binades or more below the block's largest scale: E4M3 subnormals, rounded. 2^(off - 7) as a
    // float (0 below 2^-126: every code of such a group is 0 after rounding anyway).
    const float m = off - 7 >= -126 ? __uint_as_float(uint32_t(off - 7 + 127) << 23) : 0.0f;
    lo = (e4m3_small(1.0f * m) << 8) | (e4m3_small(2.0f * m) << 16) | (e4m3_small(3.0f * m) << 24);
    hi = e4m3_small(4.0f * m) | (e4m3_small(6.0f * m) << 8) | (e4m3_small(8.0f * m) << 16) |
         (e4m3_small(12.0f * m) << 24);
}
// Four FP4 nibbles (bits 0..15 of h, element i in nibble i) -> four E4M3 bytes (byte i = element i).
__device__ __forceinline__ uint32_t decode4(uint32_t h, uint32_t lo, uint32_t hi) {
    const uint32_t mag = byte_perm(lo, hi, h & 0x7777u);
    const uint32_t t = byte_perm(h, 0u, 0x1100u);  // bytes [B0, B0, B1, B1] of h
    return mag | ((t << 4) & 0x00800080u) | (t & 0x80008000u);
}

template <class Cfg, Proj kProj>
__global__ void __launch_bounds__(kThreads, 1) moe_w4a8_kernel(const Params p) {
    constexpr int kMBlocks = Cfg::kMBlocks, kBM = Cfg::kBM, kBN = Cfg::kBN, kStages = Cfg::kStages;
    constexpr int kStageBytes = Cfg::kStageBytes, kXStageBytes = Cfg::kXStageBytes, kWStageBytes = Cfg::kWStageBytes;
    pdl_enter();

    __shared__ mbar_t full[kStages], empty[kStages], scales_full[2], scales_empty[2];
    __shared__ int tile_start[kMaxExperts + 1];
    uint8_t* const raw = dynamic_smem();
    uint8_t* const smem = raw + (1024 - smem_u32(raw) % 1024) % 1024;
    uint8_t* const scales_s = smem + kStages * kStageBytes;  // [2][kBM * n_groups]
    const int tid = threadIdx.x;

    if (tid < 32) {
        moe_count_tiles<kBN>(p, tile_start, tid);
        if (tid == 0) {
            for (int s = 0; s < kStages; ++s) {
                mbar_init(&full[s], 128);
                mbar_init(&empty[s], kConsumerWarps);
            }
            for (int s = 0; s < 2; ++s) {
                mbar_init(&scales_full[s], 1);
                mbar_init(&scales_empty[s], kConsumerWarps);
            }
            mbar_init_fence();
        }
    }
    __syncthreads();
    const int n_tiles = tile_start[p.n_experts];
    const int wg = tid / 128;

    if (wg == 0) {
        // ---- producer: per stage kBN / 16 chunks of B, kBM / 32 of the FP4 tile and the scale of row pt ----
        setmaxnreg_dec<kProducerRegs>();
        const int pt = tid;
        const int xc = pt % 8, xr = pt / 8;  // chunk xc of B rows xr + 16 j
        const int wc = pt % 4, wr = pt / 4;  // chunk (group) wc of FP4 rows wr + 32 j
        constexpr uint32_t kInvalid = 0xFFFFFFFFu;
        int it = 0;
        int local_tile = 0;
        for (int t = blockIdx.x; t < n_tiles; t += gridDim.x, ++local_tile) {
            const MoeTile tile = moe_tile_at<Cfg::kBN, Cfg::kBM>(p, tile_start, t);
            const int slot = local_tile & 1;
            const int rows_w = min(kBM, p.n_out - tile.f0);
            if (pt == 0) {
                mbar_wait(&scales_empty[slot], ((local_tile >> 1) & 1) ^ 1);
                const uint32_t bytes = uint32_t(rows_w) * uint32_t(p.n_groups);
                mbar_arrive_expect_tx(&scales_full[slot], bytes);
                bulk_copy_g2s(scales_s + slot * kBM * p.n_groups,
                              p.scales + (size_t(tile.expert) * p.n_out + tile.f0) * p.n_groups, bytes,
                              &scales_full[slot]);
            }
            uint32_t x_row[kBN / 16], w_src[kBM / 32];  // activation row / FP4 byte offset of k = 0, or kInvalid
#pragma unroll
            for (int j = 0; j < kBN / 16; ++j) {
                const int n = xr + 16 * j;
                x_row[j] = kInvalid;
                if (n < tile.n_rows) {
                    const int sorted = tile.row0 + n;
                    x_row[j] = uint32_t(kProj == Proj::mlp1 ? p.sorted_rows[sorted] / p.top_k : sorted);
                }
            }
#pragma unroll
            for (int j = 0; j < kBM / 32; ++j) {
                const int m = wr + 32 * j;
                w_src[j] = m < rows_w ? (uint32_t(tile.expert) * uint32_t(p.n_out) + uint32_t(tile.f0 + m)) *
                                            uint32_t(p.n_groups * 16)
                                      : kInvalid;
            }
            uint32_t s_row[(kBN + 127) / 128];
#pragma unroll
            for (int j = 0; j < (kBN + 127) / 128; ++j) {
                const int n = pt + 128 * j;
                s_row[j] = kInvalid;
                if (n < tile.n_rows) {
                    const int sorted = tile.row0 + n;
                    s_row[j] = uint32_t(kProj == Proj::mlp1 ? p.sorted_rows[sorted] / p.top_k : sorted);
                }
            }
            for (int kt = 0; kt < p.n_kt; ++kt, ++it) {
                const int stage = it % kStages;
                mbar_wait(&empty[stage], ((it / kStages) & 1) ^ 1);
                uint8_t* xs = smem + stage * kStageBytes;
                uint8_t* ws = xs + kXStageBytes;
                uint8_t* ss = ws + kWStageBytes;
                const bool x_in = kt * kBK + xc * 16 < p.n_in;  // chunks past n_in (a partial last block): zeros
                const bool w_in = kt * 4 + wc < p.n_groups;
#pragma unroll
                for (int j = 0; j < kBN / 16; ++j) {
                    const int n = xr + 16 * j;
                    const bool ok = x_row[j] != kInvalid && x_in;
                    cp_async16_zfill(xs + n * 128 + ((xc ^ (n & 7)) << 4),
                                     p.xq + (ok ? size_t(x_row[j]) * p.n_in + size_t(kt * kBK + xc * 16) : 0), ok);
                }
#pragma unroll
                for (int j = 0; j < kBM / 32; ++j) {
                    const int m = wr + 32 * j;
                    const bool ok = w_src[j] != kInvalid && w_in;
                    cp_async16_zfill(ws + m * 64 + ((wc ^ ((m >> 1) & 3)) << 4),
                                     p.blocks + (ok ? w_src[j] + uint32_t((kt * 4 + wc) * 16) : 0u), ok);
                }
#pragma unroll
                for (int j = 0; j < (kBN + 127) / 128; ++j) {
                    const int n = pt + 128 * j;
                    if (n < kBN) {
                        const bool ok = s_row[j] != kInvalid;
                        cp_async4_zfill(ss + 4 * n, p.xs + (ok ? size_t(s_row[j]) * p.n_kt + kt : 0), ok);
                    }
                }
                cp_async_mbar_arrive_noinc(&full[stage]);
            }
        }
        cp_async_wait_all();
        return;
    }

    // ---- consumers ----
    setmaxnreg_inc<kConsumerRegs>();
    const int cw = wg - 1;
    const int wt = tid % 128;
    const int warp = wt / 32, lane = wt % 32;
    const int g = lane / 4, q = lane % 4;
    int it = 0;
    int local_tile = 0;
    float acc[kMBlocks][Cfg::kAcc];
    float part[kMBlocks][Cfg::kAcc];
    uint32_t afrag[2][kMBlocks][4];  // [group h % 2][m-block][register]

    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x, ++local_tile) {
        const MoeTile tile = moe_tile_at<Cfg::kBN, Cfg::kBM>(p, tile_start, t);
        const int slot = local_tile & 1;
        const int e = tile.expert;

#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb) {
            const int fa = tile.f0 + 64 * (kMBlocks * cw + mb) + 16 * warp + g;
            const bool ok = fa < p.n_out;
            const float ba = ok ? __bfloat162float(p.bias[size_t(e) * p.n_out + fa]) : 0.0f;
            const float bb = ok ? __bfloat162float(p.bias[size_t(e) * p.n_out + fa + 8]) : 0.0f;
#pragma unroll
            for (int i = 0; i < kBN / 8; ++i) {
                acc[mb][4 * i + 0] = ba, acc[mb][4 * i + 1] = ba;
                acc[mb][4 * i + 2] = bb, acc[mb][4 * i + 3] = bb;
            }
        }

        mbar_wait(&scales_full[slot], (local_tile >> 1) & 1);
        const uint8_t* sc = scales_s + slot * kBM * p.n_groups;
        // Warpgroups whose rows all lie past n_out (a partial m-tile) only hand the stages back.
        const bool active = tile.f0 + 64 * kMBlocks * cw < p.n_out;  // uniform over the warpgroup

        for (int kt = 0; kt < p.n_kt; ++kt, ++it) {
            const int stage = it % kStages;
            mbar_wait(&full[stage], (it / kStages) & 1);
            if (active) {
                fence_proxy_async();
                const uint8_t* xs = smem + stage * kStageBytes;
                const uint8_t* ws = xs + kXStageBytes;
                const float* ss = reinterpret_cast<const float*>(ws + kWStageBytes);
                const uint32_t xs_addr = smem_u32(xs);
                const int g_end = min(4, p.n_groups - 4 * kt);  // groups of this block that exist
                uint32_t sp[kMBlocks][2];  // the 4 group scale bytes of the block, rows fa / fa + 8
                int smax[kMBlocks][2];     // S: the largest of them
                float wmul[kMBlocks][2];   // 2^(S - 133)
#pragma unroll
                for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int fl = 64 * (kMBlocks * cw + mb) + 16 * warp + g + 8 * r;
                        const uint8_t* srow = sc + fl * p.n_groups + 4 * kt;
                        uint32_t packed = 0;
                        int S = 0;
#pragma unroll
                        for (int h = 0; h < 4; ++h) {
                            const int v = h < g_end ? int(srow[h]) : 0;
                            packed |= uint32_t(v) << (8 * h);
                            S = max(S, v);
                        }
                        sp[mb][r] = packed, smax[mb][r] = S;
                        // 2^(S - 127) from its float bits, then an exact power-of-two multiply (S = 0:
                        // 2^-133, a subnormal's bits).
                        wmul[mb][r] = S >= 1 ? __uint_as_float(uint32_t(S) << 23) * 0.015625f : __uint_as_float(1u << 16);
                    }
                // Group h: decode into A buffer h % 2, MMA, and wait for group h - 1 (its buffer is next).
#pragma unroll
                for (int h = 0; h < 4; ++h) {
#pragma unroll
                    for (int mb = 0; mb < kMBlocks; ++mb) {
                        uint32_t lo[2], hi[2];
#pragma unroll
                        for (int r = 0; r < 2; ++r)  // groups past n_in hold zero nibbles: any table will do
                            code_table(h < g_end ? int((sp[mb][r] >> (8 * h)) & 0xFFu) - smax[mb][r] + 12 : 12, lo[r],
                                       hi[r]);
                        const int fl = 64 * (kMBlocks * cw + mb) + 16 * warp + g;  // and fl + 8: the same swizzle
                        const uint8_t* row = ws + fl * 64 + ((h ^ ((fl >> 1) & 3)) << 4) + 4 * q;
                        const uint32_t wa = ld_shared32(row), wb = ld_shared32(row + 8 * 64);
                        uint32_t(&f)[4] = afrag[h & 1][mb];
                        f[0] = decode4(wa & 0xFFFFu, lo[0], hi[0]);
                        f[1] = decode4(wb & 0xFFFFu, lo[1], hi[1]);
                        f[2] = decode4(wa >> 16, lo[0], hi[0]);
                        f[3] = decode4(wb >> 16, lo[1], hi[1]);
                    }
                    wgmma_fence();
#pragma unroll
                    for (int mb = 0; mb < kMBlocks; ++mb) {
                        fence_operands(part[mb]);
                        wgmma_e4m3<kBN>(part[mb], afrag[h & 1][mb], desc_k_sw128(xs_addr + 32 * h), h == 0 ? 0 : 1);
                    }
                    wgmma_commit();
                    wgmma_wait<1>();
                }
                wgmma_wait<0>();
#pragma unroll
                for (int mb = 0; mb < kMBlocks; ++mb) fence_operands(part[mb]);
                // Promotion: acc += part · 2^(S - 133) · xs(routed row). part[4i + j]: row fa (j < 2) or
                // fa + 8, tile row 8i + 2q + j % 2.
#pragma unroll
                for (int i = 0; i < kBN / 8; ++i) {
                    const float2 as = *reinterpret_cast<const float2*>(ss + 8 * i + 2 * q);
#pragma unroll
                    for (int mb = 0; mb < kMBlocks; ++mb) {
                        acc[mb][4 * i + 0] = fmaf(part[mb][4 * i + 0] * wmul[mb][0], as.x, acc[mb][4 * i + 0]);
                        acc[mb][4 * i + 1] = fmaf(part[mb][4 * i + 1] * wmul[mb][0], as.y, acc[mb][4 * i + 1]);
                        acc[mb][4 * i + 2] = fmaf(part[mb][4 * i + 2] * wmul[mb][1], as.x, acc[mb][4 * i + 2]);
                        acc[mb][4 * i + 3] = fmaf(part[mb][4 * i + 3] * wmul[mb][1], as.y, acc[mb][4 * i + 3]);
                    }
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[stage]);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&scales_empty[slot]);
        if (!active) continue;

        // Epilogue. acc[mb][4i + j]: weight row fa (j < 2) or fa + 8, tile row 8i + 2q + j % 2.
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb) {
            const int fa = tile.f0 + 64 * (kMBlocks * cw + mb) + 16 * warp + g, fb = fa + 8;
            if (fa >= p.n_out) continue;  // uniform over the warpgroup (n_out % 64 == 0)
            if constexpr (kProj == Proj::mlp1) {
                const bool even = (g & 1) == 0;
                const int d_ff = p.n_out / 2;
                __nv_bfloat16* u = static_cast<__nv_bfloat16*>(p.out);
#pragma unroll
                for (int i = 0; i < kBN / 8; ++i) {
                    const float* v = &acc[mb][4 * i];
                    const float a_other = __shfl_xor_sync(0xffffffffu, even ? v[1] : v[0], 4);
                    const float b_other = __shfl_xor_sync(0xffffffffu, even ? v[3] : v[2], 4);
                    const int n = 8 * i + 2 * q + (even ? 0 : 1);
                    if (n < tile.n_rows) {
                        const float out_a = even ? moe_swiglu(v[0], a_other, p.alpha, p.limit) : moe_swiglu(a_other, v[1], p.alpha, p.limit);
                        const float out_b = even ? moe_swiglu(v[2], b_other, p.alpha, p.limit) : moe_swiglu(b_other, v[3], p.alpha, p.limit);
                        __nv_bfloat16* urow = u + size_t(tile.row0 + n) * d_ff;
                        urow[fa >> 1] = __float2bfloat16_rn(out_a);
                        urow[fb >> 1] = __float2bfloat16_rn(out_b);
                    }
                }
            } else {
                float* y = static_cast<float*>(p.out);
#pragma unroll
                for (int i = 0; i < kBN / 8; ++i) {
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        const int n = 8 * i + 2 * q + j;
                        if (n < tile.n_rows) {
                            float* yrow = y + size_t(p.sorted_rows[tile.row0 + n]) * p.n_out;
                            yrow[fa] = acc[mb][4 * i + j];
                            yrow[fb] = acc[mb][4 * i + 2 + j];
                        }
                    }
                }
            }
        }
    }
}

// One warp per (row, 128-k block): lane l quantises elements 4l..4l+3 of the block and stores their
// codes at 32 (l / 8) + 16 (l % 2) + 4 ((l % 8) / 2) (moe_w4a8_position; kMmaOrder), or at 4 l (natural
// order: the matrix-expert GEMM, whose weights are E4M3 rows in natural order, moe_mlp_matrix.cu).
template <bool kMmaOrder>
__global__ void quantize_kernel(uint8_t* q, float* scales, const __nv_bfloat16* x, int n_rows, int n, int n_kb) {
    pdl_enter();
    const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (w >= int64_t(n_rows) * n_kb) return;  // whole warps
    const int row = int(w / n_kb), kb = int(w % n_kb);
    const int k = kb * 128 + 4 * lane;
    const bool in = k < n;  // n % 32 == 0: all four or none
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (in) {  // 8 bytes, 8-byte aligned (n % 32 == 0, k % 4 == 0): BF16 -> FP32 by a shift of the bits
        const uint2 b = *reinterpret_cast<const uint2*>(x + size_t(row) * n + k);
        v[0] = __uint_as_float(b.x << 16), v[1] = __uint_as_float(b.x & 0xFFFF0000u);
        v[2] = __uint_as_float(b.y << 16), v[3] = __uint_as_float(b.y & 0xFFFF0000u);
    }
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
    if (lane == 0) scales[size_t(row) * n_kb + kb] = s;
    if (in) {
        const uint32_t codes = e4m3x4(__fdiv_rn(v[0], s), __fdiv_rn(v[1], s), __fdiv_rn(v[2], s), __fdiv_rn(v[3], s));
        const int pos = kMmaOrder ? 32 * (lane / 8) + 16 * (lane % 2) + 4 * ((lane % 8) / 2) : 4 * lane;
        *reinterpret_cast<uint32_t*>(q + size_t(row) * n + kb * 128 + pos) = codes;
    }
}

}  // namespace osprey::cuda::w4a8

#ifndef OSPREY_CUDA_EMULATION
namespace osprey::cuda {

namespace {

constexpr int kMaxSmemBytes = kMoeGemmMaxSmemBytes;

template <int... kV>
constexpr bool all_fit(std::integer_sequence<int, kV...>) {
    return ((w4a8::smem_bytes<w4a8::Variant<kV>>(2880 / 32) <= size_t(kMaxSmemBytes)) && ...);
}
static_assert(all_fit(std::make_integer_sequence<int, w4a8::kVariants>{}));

template <typename F>
void with_variant(int variant, F&& f) {
    [&]<int... kV>(std::integer_sequence<int, kV...>) {
        dispatch_int<kV...>("OSPREY_MOE_W4A8_VARIANT", variant,
                            [&]<int kVariant>() { f.template operator()<w4a8::Variant<kVariant>>(); });
    }(std::make_integer_sequence<int, w4a8::kVariants>{});
}

template <class Cfg, w4a8::Proj kProj>
void launch_gemm(const w4a8::Params& p, int n_rows, cudaStream_t stream) {
    namespace mw = w4a8;
    auto kernel = mw::moe_w4a8_kernel<Cfg, kProj>;
    const size_t smem = mw::smem_bytes<Cfg>(p.n_groups);
    thread_local const int n_sms = moe_gemm_prepare_device(reinterpret_cast<const void*>(kernel));
    OSPREY_CHECK(smem <= size_t(kMaxSmemBytes), "moe w4a8: n_in = ", p.n_in, " needs ", smem, " bytes of shared memory");
    const int64_t max_tiles = (int64_t(n_rows) / Cfg::kBN + std::min(p.n_experts, n_rows)) * p.m_tiles;
    const int grid = int(std::min<int64_t>(n_sms, max_tiles));
    cuda::launch(kernel, dim3(grid), dim3(mw::kThreads), smem, stream, p);
    CUDA_CHECK(cudaGetLastError());
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }
int n_kb(int n) { return (n + 127) / 128; }

}  // namespace

int moe_w4a8_variants() { return w4a8::kVariants; }

int moe_w4a8_default_variant() {
    static const int variant = [] {
        const char* v = std::getenv("OSPREY_MOE_W4A8_VARIANT");
        if (v == nullptr || *v == '\0') return 0;
        char* end = nullptr;
        const long n = std::strtol(v, &end, 10);
        OSPREY_CHECK(*end == '\0' && n >= 0 && n < w4a8::kVariants, "OSPREY_MOE_W4A8_VARIANT = '", v,
                     "': expected 0..", w4a8::kVariants - 1);
        return int(n);
    }();
    return variant;
}

bool moe_w4a8_env() {
    static const bool on = [] {
        const char* v = std::getenv("OSPREY_MOE_W4A8");
        return v != nullptr && std::strcmp(v, "1") == 0;
    }();
    return on;
}

bool moe_w4a8_supports(int d_model, int d_ff, int variant) {
    if (!(d_model > 0 && d_ff > 0 && d_model % 64 == 0 && d_ff % 64 == 0)) return false;
    bool fits = false;
    with_variant(variant < 0 ? moe_w4a8_default_variant() : variant, [&]<class Cfg>() {
        fits = w4a8::smem_bytes<Cfg>(d_model / 32) <= size_t(kMaxSmemBytes) &&
               w4a8::smem_bytes<Cfg>(d_ff / 32) <= size_t(kMaxSmemBytes);
    });
    return fits;
}

bool moe_w4a8_wanted(int n_tokens, int top_k, int n_experts) {
    const MoeKernel k = moe_choose_kernel(n_tokens, top_k, n_experts);
    const int64_t rows = int64_t(n_tokens) * top_k;
    const int min_rows = n_experts >= kMoeWgmmaManyExperts ? kMoeWgmmaMinRowsPerExpertMany : kMoeWgmmaMinRowsPerExpert;
    return k == MoeKernel::gemm || (k == MoeKernel::narrow && rows >= int64_t(min_rows) * n_experts);
}

size_t moe_w4a8_workspace_bytes(int n_tokens, int top_k, int d_model, int d_ff) {
    const size_t rows = size_t(n_tokens) * top_k;
    return align256(size_t(n_tokens) * d_model) + align256(size_t(n_tokens) * n_kb(d_model) * 4) +
           align256(rows * d_ff) + align256(rows * n_kb(d_ff) * 4);
}

void moe_w4a8_quantize(uint8_t* q, float* scales, const bf16* x, int n_rows, int n, cudaStream_t stream,
                       bool mma_order) {
    OSPREY_CHECK(n > 0 && n % 32 == 0 && n_rows >= 0, "moe w4a8 quantize: n = ", n, " (multiple of 32)");
    if (n_rows == 0) return;
    const int64_t warps = int64_t(n_rows) * n_kb(n);
    const int block = 256;
    const int64_t grid = (warps * 32 + block - 1) / block;
    cuda::launch(mma_order ? w4a8::quantize_kernel<true> : w4a8::quantize_kernel<false>, dim3(unsigned(grid)),
                 dim3(block), 0, stream, q, scales, reinterpret_cast<const __nv_bfloat16*>(x), n_rows, n, n_kb(n));
    CUDA_CHECK(cudaGetLastError());
}

// The configuration of a call: the argument's, else $OSPREY_MOE_W4A8_VARIANT's, else by routed rows per
// expert (not yet measured: 64-row tiles (v2) below 96 rows per expert, where 128-row tiles would be
// mostly empty - 120b at 1024 tokens has 32 - else v0).
static int variant_for(const MoeW4a8Args& a) {
    if (a.variant >= 0) return a.variant;
    static const bool from_env = [] {
        const char* v = std::getenv("OSPREY_MOE_W4A8_VARIANT");
        return v != nullptr && *v != '\0';
    }();
    if (from_env) return moe_w4a8_default_variant();
    return int64_t(a.n_tokens) * a.top_k < int64_t(96) * a.n_experts ? 2 : 0;
}

void moe_w4a8(const MoeW4a8Args& a, cudaStream_t stream) {
    const int variant = variant_for(a);
    OSPREY_CHECK(moe_w4a8_supports(a.d_model, a.d_ff, variant), "moe w4a8: unsupported widths d_model = ", a.d_model,
                 ", d_ff = ", a.d_ff, " (multiples of 64) for variant ", variant);
    OSPREY_CHECK(a.n_experts > 0 && a.n_experts <= w4a8::kMaxExperts, "moe w4a8: n_experts = ", a.n_experts);
    OSPREY_CHECK(a.y && a.u && a.x && a.workspace && a.expert_offsets && a.sorted_rows && a.mlp1.blocks &&
                     a.mlp1.scales && a.mlp1.bias && a.mlp2.blocks && a.mlp2.scales && a.mlp2.bias,
                 "moe w4a8: null argument");
    const int n_rows = a.n_tokens * a.top_k;
    if (n_rows == 0) return;
    uint8_t* base = static_cast<uint8_t*>(a.workspace);
    uint8_t* xq = base;
    base += align256(size_t(a.n_tokens) * a.d_model);
    float* xs = reinterpret_cast<float*>(base);
    base += align256(size_t(a.n_tokens) * n_kb(a.d_model) * 4);
    uint8_t* uq = base;
    base += align256(size_t(n_rows) * a.d_ff);
    float* us = reinterpret_cast<float*>(base);

    moe_w4a8_quantize(xq, xs, a.x, a.n_tokens, a.d_model, stream);
    with_variant(variant, [&]<class Cfg>() {
        const w4a8::Params p1{a.mlp1.blocks, a.mlp1.scales, reinterpret_cast<const __nv_bfloat16*>(a.mlp1.bias),
                                  xq, xs, a.u, a.expert_offsets, a.sorted_rows, a.n_experts, a.top_k, a.d_model,
                                  2 * a.d_ff, a.d_model / 32, n_kb(a.d_model), (2 * a.d_ff + Cfg::kBM - 1) / Cfg::kBM,
                                  a.swiglu_alpha, a.swiglu_limit};
        launch_gemm<Cfg, w4a8::Proj::mlp1>(p1, n_rows, stream);
    });
    moe_w4a8_quantize(uq, us, a.u, n_rows, a.d_ff, stream);
    with_variant(variant, [&]<class Cfg>() {
        const w4a8::Params p2{a.mlp2.blocks, a.mlp2.scales, reinterpret_cast<const __nv_bfloat16*>(a.mlp2.bias),
                                  uq, us, a.y, a.expert_offsets, a.sorted_rows, a.n_experts, a.top_k, a.d_ff,
                                  a.d_model, a.d_ff / 32, n_kb(a.d_ff), (a.d_model + Cfg::kBM - 1) / Cfg::kBM,
                                  a.swiglu_alpha, a.swiglu_limit};
        launch_gemm<Cfg, w4a8::Proj::mlp2>(p2, n_rows, stream);
    });
}

}  // namespace osprey::cuda
#endif  // OSPREY_CUDA_EMULATION
