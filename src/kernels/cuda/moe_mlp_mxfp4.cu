// MXFP4 expert projections on tensor cores. One kernel template serves both projections and both
// configurations (see moe_mlp_mxfp4.h):
//   block = (token tile of one expert) x (kBM weight rows); warp w owns weight rows 16w..16w+15
//   and all kBN routed rows of the tile (mma.sync m16n8k16: M = weight rows, N = routed rows).
//   A k-loop over n_in in stages of kBK = 64 (two MXFP4 groups), cp.async multi-stage pipeline:
//   raw FP4 bytes and BF16 activations go to shared memory; each warp decodes its own weight
//   fragments in registers (every weight is decoded once per block) and feeds the tensor cores.
//
// NOTE (fragment layout): the order of k inside one mma is free as long as A and B agree. A
// thread's A fragment needs 4 k-values for each of its two rows; we give it the 8 nibbles of one
// 32-bit word of its row and pair nibble i with nibble i + 4 in each BF16x2 register, because
// those two sit 16 bits apart and one shift + mask turns both into BF16 at once. B (activations)
// must then be paired the same way: elements (i, i + 4) of each group of 8. mlp1 permutes its x
// fragments with byte_perm; mlp1 writes u already in that order (moe_u_column), so mlp2 loads it
// as is.
#include "kernels/cuda/moe_mlp_mxfp4.h"
#include "kernels/cuda/launch.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <utility>

#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/moe_mlp_wgmma.h"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kBK = 64;                 // k per mma k-tile = two MXFP4 groups of 32
constexpr int kGroupsPerTile = kBK / 32;
// Decoded weights are FP4 · 2^(scale - 127 - 32) (kept inside BF16's normal range for scale bytes
// 34..160); the accumulators are multiplied back by 2^32 in the epilogue (exact in FP32).
constexpr float kUnscale = 4294967296.0f;  // 2^32
constexpr int kScaleExponentBias = 127 - 33;  // BF16 exponent field of 2^(scale - 33)

// Warps are arranged kWarpsM x kWarpsN x kSplitK: a warp owns kMTiles m16 tiles of weight rows,
// kBN / kWarpsN routed rows, and one k-tile of every pipeline stage (a stage holds kSplitK
// consecutive k-tiles; split-K partial sums are added in shared memory at the end).
template <int kWarpsM_, int kWarpsN_, int kSplitK_, int kMTiles_, int kBN_, int kStages_, int kMinBlocks_>
struct Config {
    static constexpr int kWarpsM = kWarpsM_, kWarpsN = kWarpsN_, kSplitK = kSplitK_, kMTiles = kMTiles_;
    static constexpr int kWarps = kWarpsM * kWarpsN * kSplitK;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kBM = 16 * kMTiles * kWarpsM;  // weight rows per block
    static constexpr int kBN = kBN_;                    // routed rows per token tile
    static constexpr int kNTiles = kBN / 8 / kWarpsN;   // mma n-tiles per warp
    static constexpr int kStages = kStages_;
    static constexpr int kMinBlocks = kMinBlocks_;
    static constexpr int kWChunks = 2 * kSplitK;        // 16-byte chunks of one weight row per stage
    static constexpr int kXChunks = 8 * kSplitK;        // 16-byte chunks of one activation row per stage
    static constexpr int kWStageBytes = kBM * kWChunks * 16;
    static constexpr int kStageBytes = kWStageBytes + kBN * kXChunks * 16;
    static_assert(kBN % (8 * kWarpsN) == 0);
    static_assert(kWChunks == 2 || kWChunks == 4 || kWChunks == 8, "weight swizzle below");
};
// Decode: 8 routed rows, 32 weight rows per block, K split 4 ways: many warps in flight per SM, each
// with a short dependency chain, so that the weight stream is not limited by latency. Measured
// against <4,1,1,1,8,8,4> (no split, 8 stages), <4,1,2,1,8,4,4> and <2,1,4,1,16,4,4>: best at 1 token
// (mlp1 32.5 us vs 34.5-36.8), 5-15% behind the unsplit one at 8-128 tokens.
// A build may override either list (OSPREY_MOE_GEMV_CONFIG / OSPREY_MOE_GEMM_CONFIG, e.g. from a
// wrapper source that defines them and includes this file) to measure other tilings with
// bench/bench_moe.cu and the tests; the comparison above was made that way.
#ifndef OSPREY_MOE_GEMV_CONFIG
#define OSPREY_MOE_GEMV_CONFIG 2, 1, 4, 1, 8, 4, 4
#endif
using GemvConfig = Config<OSPREY_MOE_GEMV_CONFIG>;
// Prefill: 128 x 128 tiles, warps of 32 weight rows x 64 routed rows (shared-memory traffic for the
// activations halves against 16-row warps; each weight is decoded by the 2 warps that share it).
// Against 16-row warps (<8,1,1,1,128,4,2>) mlp1 is 2% slower and mlp2 11% faster at 8192 tokens.
#ifndef OSPREY_MOE_GEMM_CONFIG
#define OSPREY_MOE_GEMM_CONFIG 4, 2, 1, 2, 128, 4, 2
#endif
using GemmConfig = Config<OSPREY_MOE_GEMM_CONFIG>;
// Between the two: 32 routed rows per token tile (5-128 rows per expert would leave most of a
// 128-row tile empty, and outgrow gemv's 8-row tiles), 128 weight rows per block, K split 2 ways
// for more warps in flight. 1.7-1.9x faster than the better of the other two at 16-32 rows per expert.
#ifndef OSPREY_MOE_NARROW_CONFIG
#define OSPREY_MOE_NARROW_CONFIG 4, 1, 2, 2, 32, 4, 2
#endif
using NarrowConfig = Config<OSPREY_MOE_NARROW_CONFIG>;

enum class Proj { mlp1, mlp2 };

struct KernelArgs {
    const uint8_t* blocks;        // [n_experts, n_out, n_groups, 16]
    const uint8_t* scales;        // [n_experts, n_out, n_groups]
    const __nv_bfloat16* bias;    // [n_experts, n_out]
    const __nv_bfloat16* x;       // mlp1: [n_tokens, n_in] (gathered); mlp2: [n_rows, n_in] (sorted order)
    void* out;                    // mlp1: u [n_rows, n_out / 2] bf16; mlp2: y [n_rows, n_out] f32
    const int32_t* offsets;       // [n_experts + 1]
    const int32_t* sorted_rows;   // [n_rows]
    int n_experts, top_k, n_in, n_out, n_groups;
    float alpha, limit;
};

__device__ inline uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

// The 8 nibbles of w (elements 0..7 of a row) as 4 BF16x2 (element i low, element i + 4 high),
// times 2^(scale - 33) in both halves of scale2. The nibble's bits (sign, e1, e0, m) land on BF16
// bits 15, 8, 7, 6: exponent field e, mantissa m, i.e. FP4 · 2^-126 exactly (0.5 is a BF16
// subnormal); the multiply by the scale makes it normal and exact.
__device__ inline void decode_fp4x8(uint32_t w, uint32_t scale2, uint32_t (&r)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t t = w >> (4 * i);
        const uint32_t raw = ((t << 6) & 0x01C001C0u) | ((t << 12) & 0x80008000u);
        r[i] = bf16x2_mul(raw, scale2);
    }
}

// Swizzled byte offsets inside one stage, so that the fragment loads below are free of bank
// conflicts: the 16-byte chunks of weight row r are permuted by r (rows of 2 chunks: swap when bit
// 2 of r is set; 4 chunks: XOR bits 1-2 of r; 8 chunks: XOR r mod 8), and those of activation row r
// XOR 4 when r is odd.
template <class Cfg>
__device__ inline int w_offset(int r, int chunk) {
    const int swz = Cfg::kWChunks == 2 ? (r >> 2) & 1 : Cfg::kWChunks == 4 ? (r >> 1) & 3 : r & 7;
    return (r * Cfg::kWChunks + (chunk ^ swz)) * 16;
}
template <class Cfg>
__device__ inline int x_offset(int r, int chunk) {
    return (r * Cfg::kXChunks + (chunk ^ ((r & 1) << 2))) * 16;
}

// Finds this block's token tile: the blockIdx.x-th tile when each expert's rows are cut into tiles
// of kBN, experts in order. Returns false for blocks past the last tile.
template <int kBN>
__device__ bool find_tile(const KernelArgs& a, int& expert, int& row0, int& n_rows) {
    __shared__ int s_tile[3];
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        const int target = blockIdx.x;
        int before = 0;
        bool found = false;
        for (int e0 = 0; e0 < a.n_experts && !found; e0 += 32) {
            const int e = e0 + lane;
            const int begin = e < a.n_experts ? a.offsets[e] : 0;
            const int end = e < a.n_experts ? a.offsets[e + 1] : 0;
            const int tiles = (end - begin + kBN - 1) / kBN;
            int incl = tiles;
#pragma unroll
            for (int o = 1; o < 32; o *= 2) {
                const int n = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += n;
            }
            const unsigned hit = __ballot_sync(0xffffffffu, before + incl > target);
            if (hit) {
                found = true;
                if (lane == __ffs(hit) - 1) {
                    const int r0 = begin + (target - (before + incl - tiles)) * kBN;
                    s_tile[0] = e, s_tile[1] = r0, s_tile[2] = min(kBN, end - r0);
                }
            }
            before += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (!found && lane == 0) s_tile[0] = -1;
    }
    __syncthreads();
    expert = s_tile[0], row0 = s_tile[1], n_rows = s_tile[2];
    return expert >= 0;
}

__device__ inline float swiglu(float gate, float up, float alpha, float limit) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    return gate / (1.0f + __expf(-alpha * gate)) * (up + 1.0f);
}

template <class Cfg, Proj kProj>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) moe_mlp_mxfp4_kernel(const KernelArgs a) {
    pdl_enter();  // launch.cuh: before any early return or global access
    extern __shared__ __align__(16) uint8_t smem[];  // [kStages][stage] then scales [kBM, n_groups]
    __shared__ int32_t s_rows[Cfg::kBN];  // mlp1: token of each tile row; mlp2: its routed row

    int e, row0, n_rows;
    if (!find_tile<Cfg::kBN>(a, e, row0, n_rows)) return;
    const int f0 = blockIdx.y * Cfg::kBM;  // first weight row of this block
    const int tid = threadIdx.x;
    for (int r = tid; r < Cfg::kBN; r += Cfg::kThreads) {
        const int s = r < n_rows ? a.sorted_rows[row0 + r] : -1;
        s_rows[r] = kProj == Proj::mlp1 && s >= 0 ? s / a.top_k : s;
    }
    __syncthreads();

    uint8_t* scales_s = smem + Cfg::kStages * Cfg::kStageBytes;  // [kBM, n_groups]
    const int n_kt = a.n_in / kBK;                                // k-tiles
    const int n_stages_k = (n_kt + Cfg::kSplitK - 1) / Cfg::kSplitK;
    const size_t row_base = size_t(e) * a.n_out + f0;             // expert e's row f0 in [n_experts * n_out]

    // Scale panel of the block's rows: contiguous, 16-byte aligned (rows come in 16s).
    {
        const int valid_bytes = min(Cfg::kBM, a.n_out - f0) * a.n_groups;
        const uint8_t* src = a.scales + row_base * a.n_groups;
        for (int i = tid; i * 16 < Cfg::kBM * a.n_groups; i += Cfg::kThreads)
            cp_async16(scales_s + i * 16, i * 16 < valid_bytes ? src + i * 16 : a.scales, i * 16 < valid_bytes);
    }

    // Per-thread copy assignments, fixed for the whole k-loop: source offsets of k-stage 0 (32-bit:
    // the wrapper checks the sizes) and shared-memory destinations; a stage adds a constant stride.
    constexpr int kWIters = Cfg::kBM * Cfg::kWChunks / Cfg::kThreads;
    constexpr int kXTotal = Cfg::kBN * Cfg::kXChunks;  // activation chunks per stage
    constexpr int kXIters = (kXTotal + Cfg::kThreads - 1) / Cfg::kThreads;
    static_assert(kWIters * Cfg::kThreads == Cfg::kBM * Cfg::kWChunks);
    // kThreads is a multiple of the chunks per row, so a thread copies the same chunk of rows
    // r0, r0 + kThreads / chunks, ...: chunk, k-tile and swizzle are the same for all its copies.
    static_assert(Cfg::kThreads % Cfg::kWChunks == 0 && Cfg::kThreads % Cfg::kXChunks == 0);
    const bool x_copies = kXTotal % Cfg::kThreads == 0 || tid < kXTotal % Cfg::kThreads;  // last round
    constexpr uint32_t kInvalid = 0xffffffffu;
    const int w_chunk = tid % Cfg::kWChunks, w_r0 = tid / Cfg::kWChunks, w_kt = w_chunk / 2;
    const int x_chunk = tid % Cfg::kXChunks, x_r0 = tid / Cfg::kXChunks, x_kt = x_chunk / 8;
    const int w_dst = w_offset<Cfg>(w_r0, w_chunk), x_dst = x_offset<Cfg>(x_r0, x_chunk);
    uint32_t w_src[kWIters], x_src[kXIters];  // bytes into a.blocks / elements into a.x, or kInvalid
#pragma unroll
    for (int it = 0; it < kWIters; ++it) {
        const int r = w_r0 + it * (Cfg::kThreads / Cfg::kWChunks);
        w_src[it] = f0 + r < a.n_out ? uint32_t(((row_base + r) * a.n_groups + w_chunk) * 16) : kInvalid;
    }
#pragma unroll
    for (int it = 0; it < kXIters; ++it) {
        const int r = x_r0 + it * (Cfg::kThreads / Cfg::kXChunks);
        const int src_row = r >= Cfg::kBN ? -1 : kProj == Proj::mlp1 ? s_rows[r] : (r < n_rows ? row0 + r : -1);
        x_src[it] = src_row >= 0 ? uint32_t(src_row) * uint32_t(a.n_in) + uint32_t(x_kt * kBK + x_chunk % 8 * 8) : kInvalid;
    }
    auto load_stage = [&](int stage, int ks) {
        uint8_t* ws = smem + stage * Cfg::kStageBytes;
        uint8_t* xs = ws + Cfg::kWStageBytes;
        const int kt0 = ks * Cfg::kSplitK;
        const bool w_kt_ok = kt0 + w_kt < n_kt, x_kt_ok = kt0 + x_kt < n_kt;
#pragma unroll
        for (int it = 0; it < kWIters; ++it) {
            const bool valid = w_kt_ok && w_src[it] != kInvalid;
            cp_async16(ws + w_dst + it * (Cfg::kThreads / Cfg::kWChunks) * Cfg::kWChunks * 16,
                       a.blocks + (valid ? w_src[it] + uint32_t(kt0) * (kGroupsPerTile * 16) : 0u), valid);
        }
#pragma unroll
        for (int it = 0; it < kXIters; ++it) {
            if (it == kXIters - 1 && !x_copies) break;
            const bool valid = x_kt_ok && x_src[it] != kInvalid;
            cp_async16(xs + x_dst + it * (Cfg::kThreads / Cfg::kXChunks) * Cfg::kXChunks * 16,
                       a.x + (valid ? x_src[it] + uint32_t(kt0) * kBK : 0u), valid);
        }
    };

#pragma unroll
    for (int s = 0; s < Cfg::kStages - 1; ++s) {
        if (s < n_stages_k) load_stage(s, s);
        cp_async_commit();
    }

    const int lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, c = lane % 4;
    const int wm = warp % Cfg::kWarpsM;                          // weight-row slice
    const int wn = warp / Cfg::kWarpsM % Cfg::kWarpsN;           // routed-row slice
    const int ws_k = warp / (Cfg::kWarpsM * Cfg::kWarpsN);       // k-tile inside each stage
    const int r_warp = wm * 16 * Cfg::kMTiles;                   // first block-local weight row of the warp
    const int n_warp = wn * 8 * Cfg::kNTiles;                    // first tile row of the warp
    const bool warp_active = f0 + r_warp < a.n_out;              // n_out % 32 == 0: a warp's rows are all valid or none
    float acc[Cfg::kMTiles][Cfg::kNTiles][4] = {};

    // Loop-invariant fragment addresses inside a stage. Row swizzles depend on g only (warp row
    // bases are multiples of 16, tile rows multiples of 8), so m-tiles, the rb half and n-tiles are
    // compile-time strides from these.
    int a_off[kGroupsPerTile], b_off[kGroupsPerTile];
#pragma unroll
    for (int h = 0; h < kGroupsPerTile; ++h) {
        a_off[h] = w_offset<Cfg>(r_warp + g, ws_k * 2 + h) + 4 * c;
        b_off[h] = Cfg::kWStageBytes + x_offset<Cfg>(n_warp + g, ws_k * 8 + 4 * h + c);
    }
    constexpr int kARowStride = Cfg::kWChunks * 16;   // bytes between weight rows
    constexpr int kBRowStride = Cfg::kXChunks * 16;   // bytes between activation rows
    const int sc_off = (r_warp + g) * a.n_groups;     // scale of row ra, group 0

    // One pipeline step: wait for stage ks, prefetch stage ks + kStages - 1, compute on stage ks.
    // kStage = ks % kStages is a template constant so that all shared-memory offsets fold.
    auto step = [&]<int kStage>(int ks) {
        cp_async_wait<Cfg::kStages - 2>();
        __syncthreads();
        if (ks + Cfg::kStages - 1 < n_stages_k) load_stage((kStage + Cfg::kStages - 1) % Cfg::kStages, ks + Cfg::kStages - 1);
        cp_async_commit();
        const int kt = ks * Cfg::kSplitK + ws_k;
        if (!warp_active || kt >= n_kt) return;
        const uint8_t* stage = smem + kStage * Cfg::kStageBytes;
#pragma unroll
        for (int h = 0; h < kGroupsPerTile; ++h) {
            const int grp = kt * kGroupsPerTile + h;
            uint32_t wa[Cfg::kMTiles][4], wb[Cfg::kMTiles][4];
#pragma unroll
            for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
                const uint32_t sa = (uint32_t(scales_s[sc_off + 16 * mt * a.n_groups + grp]) + kScaleExponentBias) * 0x00800080u;
                const uint32_t sb = (uint32_t(scales_s[sc_off + (16 * mt + 8) * a.n_groups + grp]) + kScaleExponentBias) * 0x00800080u;
                decode_fp4x8(*reinterpret_cast<const uint32_t*>(stage + a_off[h] + 16 * mt * kARowStride), sa, wa[mt]);
                decode_fp4x8(*reinterpret_cast<const uint32_t*>(stage + a_off[h] + (16 * mt + 8) * kARowStride), sb, wb[mt]);
            }
#pragma unroll
            for (int j = 0; j < Cfg::kNTiles; ++j) {
                // Elements 8c..8c+7 of group h of routed row n_warp + 8j + g.
                const uint4 xv = *reinterpret_cast<const uint4*>(stage + b_off[h] + 8 * j * kBRowStride);
                uint32_t bf[4];
                if constexpr (kProj == Proj::mlp1) {  // natural order: pair (i, i + 4)
                    bf[0] = __byte_perm(xv.x, xv.z, 0x5410), bf[1] = __byte_perm(xv.x, xv.z, 0x7632);
                    bf[2] = __byte_perm(xv.y, xv.w, 0x5410), bf[3] = __byte_perm(xv.y, xv.w, 0x7632);
                } else {  // u is stored pre-paired
                    bf[0] = xv.x, bf[1] = xv.y, bf[2] = xv.z, bf[3] = xv.w;
                }
#pragma unroll
                for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
                    mma_bf16(acc[mt][j], wa[mt][0], wb[mt][0], wa[mt][1], wb[mt][1], bf[0], bf[1]);
                    mma_bf16(acc[mt][j], wa[mt][2], wb[mt][2], wa[mt][3], wb[mt][3], bf[2], bf[3]);
                }
            }
        }
    };
    for (int ks0 = 0; ks0 < n_stages_k; ks0 += Cfg::kStages) {
        [&]<int... kStage>(std::integer_sequence<int, kStage...>) {
            ((ks0 + kStage < n_stages_k ? (step.template operator()<kStage>(ks0 + kStage), 0) : 0), ...);
        }(std::make_integer_sequence<int, Cfg::kStages>{});
    }
    cp_async_wait<0>();

    if constexpr (Cfg::kSplitK > 1) {  // add the split-K partial sums: warps with ws_k > 0 hand theirs over
        __syncthreads();  // every warp is done with the pipeline's shared memory
        constexpr int kAccPerThread = Cfg::kMTiles * Cfg::kNTiles * 4;
        float* red = reinterpret_cast<float*>(smem);  // [kSplitK - 1, kWarpsM * kWarpsN, kAccPerThread, 32]
        const int slice = warp % (Cfg::kWarpsM * Cfg::kWarpsN);
        float* flat = &acc[0][0][0];
        if (ws_k > 0) {
#pragma unroll
            for (int i = 0; i < kAccPerThread; ++i)
                red[(((ws_k - 1) * Cfg::kWarpsM * Cfg::kWarpsN + slice) * kAccPerThread + i) * 32 + lane] = flat[i];
        }
        __syncthreads();
        if (ws_k > 0) return;
        for (int s = 1; s < Cfg::kSplitK; ++s)  // in k order: deterministic
#pragma unroll
            for (int i = 0; i < kAccPerThread; ++i)
                flat[i] += red[(((s - 1) * Cfg::kWarpsM * Cfg::kWarpsN + slice) * kAccPerThread + i) * 32 + lane];
    }
    if (!warp_active) return;

    // Epilogue. acc[mt][j] = weight rows (ra, rb) of m-tile mt x tile rows n_warp + 8j + 2c, + 1.
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
        const int fa = f0 + r_warp + 16 * mt + g, fb = fa + 8;  // global weight rows
        if (fa >= a.n_out) break;
        const float bias_a = __bfloat162float(a.bias[size_t(e) * a.n_out + fa]);
        const float bias_b = __bfloat162float(a.bias[size_t(e) * a.n_out + fb]);
        if constexpr (kProj == Proj::mlp1) {
            // Rows 2j (gate) and 2j + 1 (up) of unit j sit in lanes 4 apart: the even lane keeps
            // routed row 2c, the odd lane 2c + 1, after swapping the other half with its partner.
            const bool even = (g & 1) == 0;
            const int d_ff = a.n_out / 2;
            __nv_bfloat16* u = static_cast<__nv_bfloat16*>(a.out);
#pragma unroll
            for (int j = 0; j < Cfg::kNTiles; ++j) {
                const float* v = acc[mt][j];
                const float va0 = v[0] * kUnscale + bias_a, va1 = v[1] * kUnscale + bias_a;
                const float vb0 = v[2] * kUnscale + bias_b, vb1 = v[3] * kUnscale + bias_b;
                const float a_other = __shfl_xor_sync(0xffffffffu, even ? va1 : va0, 4);
                const float b_other = __shfl_xor_sync(0xffffffffu, even ? vb1 : vb0, 4);
                const int n = n_warp + 8 * j + 2 * c + (even ? 0 : 1);
                if (n < n_rows) {
                    const float out_a = even ? swiglu(va0, a_other, a.alpha, a.limit) : swiglu(a_other, va1, a.alpha, a.limit);
                    const float out_b = even ? swiglu(vb0, b_other, a.alpha, a.limit) : swiglu(b_other, vb1, a.alpha, a.limit);
                    __nv_bfloat16* row = u + size_t(row0 + n) * d_ff;
                    row[moe_u_column(fa >> 1)] = __float2bfloat16_rn(out_a);
                    row[moe_u_column(fb >> 1)] = __float2bfloat16_rn(out_b);
                }
            }
        } else {
            float* y = static_cast<float*>(a.out);
#pragma unroll
            for (int j = 0; j < Cfg::kNTiles; ++j) {
#pragma unroll
                for (int k = 0; k < 2; ++k) {
                    const int n = n_warp + 8 * j + 2 * c + k;
                    if (n < n_rows) {
                        float* row = y + size_t(s_rows[n]) * a.n_out;
                        row[fa] = acc[mt][j][k] * kUnscale + bias_a;
                        row[fb] = acc[mt][j][2 + k] * kUnscale + bias_b;
                    }
                }
            }
        }
    }
}

template <class Cfg, Proj kProj>
void launch(const KernelArgs& a, int n_routed, cudaStream_t stream) {
    const size_t smem = size_t(Cfg::kStages) * Cfg::kStageBytes + size_t(Cfg::kBM) * a.n_groups;
    auto kernel = moe_mlp_mxfp4_kernel<Cfg, kProj>;
    // Opt in once per thread (the attribute is per device, and each rank of a parallel layout drives
    // its GPU from its own thread) to all the dynamic shared memory a block may have (the static part,
    // s_rows and the tile lookup, stays below 64 bytes + kBN ints); same limit on every H200.
    thread_local const size_t smem_limit = [&] {
        int device = 0, max_optin = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        max_optin - int(sizeof(int32_t) * Cfg::kBN) - 64));
        return size_t(max_optin - int(sizeof(int32_t) * Cfg::kBN) - 64);
    }();
    OSPREY_CHECK(smem <= smem_limit, "moe mlp: n_in = ", a.n_in, " needs ", smem, " bytes of shared memory");
    // Upper bound of the number of token tiles: Σ_e ceil(rows_e / kBN) <= rows / kBN + active experts.
    const int max_tiles = (n_routed + Cfg::kBN - 1) / Cfg::kBN + std::min(a.n_experts, n_routed);
    const dim3 grid(max_tiles, (a.n_out + Cfg::kBM - 1) / Cfg::kBM);
    cuda::launch(kernel, grid, Cfg::kThreads, smem, stream, a);
    CUDA_CHECK(cudaGetLastError());
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void check_common(const char* what, const Mxfp4Experts& w, const int32_t* offsets, const int32_t* sorted_rows,
                  int n_tokens, int n_experts, int top_k, int n_in, int n_out) {
    OSPREY_CHECK(n_tokens >= 0 && int64_t(n_tokens) * top_k < (int64_t(1) << 30), what, ": n_tokens = ", n_tokens);
    // (n_experts may be below top_k: an expert-parallel rank holds some of the experts)
    OSPREY_CHECK(n_experts > 0 && top_k > 0, what, ": n_experts = ", n_experts, ", top_k = ", top_k);
    OSPREY_CHECK(n_in > 0 && n_in % kBK == 0, what, ": input width ", n_in, " must be a positive multiple of ", kBK);
    OSPREY_CHECK(n_out > 0 && n_out % 32 == 0, what, ": output width ", n_out, " must be a positive multiple of 32");
    OSPREY_CHECK(w.blocks && w.scales && w.bias && offsets && sorted_rows, what, ": null pointer");
    OSPREY_CHECK(aligned16(w.blocks) && aligned16(w.scales), what, ": weight blocks and scales must be 16-byte aligned");
    // The kernels address weights (bytes) and activations (elements) with 32-bit offsets.
    OSPREY_CHECK(int64_t(n_experts) * n_out * (n_in / 2) < (int64_t(1) << 32) &&
                     int64_t(n_tokens) * top_k * std::max(n_in, n_out) < (int64_t(1) << 31),
                 what, ": ", n_experts, " experts of ", n_out, " x ", n_in, " with ", n_tokens,
                 " tokens exceed 32-bit offsets");
}

}  // namespace

const char* moe_kernel_name(MoeKernel k) {
    switch (k) {
        case MoeKernel::automatic: return "auto";
        case MoeKernel::gemv: return "gemv";
        case MoeKernel::narrow: return "narrow";
        case MoeKernel::gemm: return "gemm";
        case MoeKernel::wgmma: return "wgmma";
    }
    return "?";
}

MoeKernel moe_choose_kernel(int n_tokens, int top_k, int n_experts) {
    const int64_t rows = int64_t(n_tokens) * top_k;
    if (rows <= int64_t(kMoeGemvMaxRowsPerExpert) * n_experts) return MoeKernel::gemv;
    if (rows <= int64_t(kMoeNarrowMaxRowsPerExpert) * n_experts) return MoeKernel::narrow;
    return MoeKernel::gemm;
}

// The wgmma configuration for a call that names none (`requested` < 0), by shape, from the variants'
// H200 timings (bench_moe, 2026-12-01; docs/performance.md "Hopper tensor cores for prefill"):
//   v3 (128 weight rows x 256 routed rows) for mlp1 from 1024 routed rows per expert: 20b at 8192 tokens
//      2496 against 2761 us on v0 (mlp2 is slower on it: 1322 against 1226);
//   v4 (256 x 64, 8 stages) below kMoeWgmmaMinRowsPerExpert rows per expert, which automatic sends to
//      wgmma only for 128+ experts (120b at 1024 tokens, 32 rows per expert: 987 + 438 us against
//      1275 + 544 on v0 and 2183 + 918 on gemm; narrow there ~1654 for both, an earlier run);
//   v0 otherwise. $OSPREY_MOE_WGMMA_VARIANT, when set, applies to every call instead.
static int wgmma_variant_for(int requested, bool mlp1, int n_tokens, int top_k, int n_experts) {
    if (requested >= 0) return requested;
    if (moe_wgmma_variant_from_env()) return moe_wgmma_default_variant();
    const int64_t rows = int64_t(n_tokens) * top_k;
    if (rows < int64_t(kMoeWgmmaMinRowsPerExpert) * n_experts) return 4;
    if (mlp1 && rows >= int64_t(1024) * n_experts) return 3;
    return 0;
}

// The kernel a call runs: `requested`, or for automatic the batch-shape choice, with gemm (and narrow
// from kMoeWgmmaMinRowsPerExpert routed rows per expert, or from kMoeWgmmaMinRowsPerExpertMany with
// kMoeWgmmaManyExperts or more experts) replaced by wgmma where the projection's widths allow it,
// unless $OSPREY_MOE_WGMMA=0.
static MoeKernel resolve_kind(MoeKernel requested, int n_tokens, int top_k, int n_experts, int n_in, int n_out,
                              int wgmma_variant) {
    if (requested != MoeKernel::automatic) return requested;
    const MoeKernel k = moe_choose_kernel(n_tokens, top_k, n_experts);
    const int64_t rows = int64_t(n_tokens) * top_k;
    const int min_rows = n_experts >= kMoeWgmmaManyExperts ? kMoeWgmmaMinRowsPerExpertMany : kMoeWgmmaMinRowsPerExpert;
    const bool wide = k == MoeKernel::gemm || (k == MoeKernel::narrow && rows >= int64_t(min_rows) * n_experts);
    return wide && moe_wgmma_enabled() && moe_wgmma_supports(n_in, n_out, wgmma_variant) ? MoeKernel::wgmma : k;
}

// The launch of one projection with the tiling `kind` (automatic resolved by the caller).
template <Proj kProj>
void launch_kind(MoeKernel kind, const KernelArgs& k, int n_routed, cudaStream_t stream) {
    switch (kind) {
        case MoeKernel::gemv: launch<GemvConfig, kProj>(k, n_routed, stream); return;
        case MoeKernel::narrow: launch<NarrowConfig, kProj>(k, n_routed, stream); return;
        case MoeKernel::gemm: launch<GemmConfig, kProj>(k, n_routed, stream); return;
        case MoeKernel::wgmma: break;  // launched by the callers (moe_wgmma_launch)
        case MoeKernel::automatic: break;
    }
    OSPREY_FAIL("moe mlp: unresolved kernel choice");
}

void moe_mlp1(const MoeMlp1Args& a, cudaStream_t stream) {
    check_common("moe_mlp1", a.w, a.expert_offsets, a.sorted_rows, a.n_tokens, a.n_experts, a.top_k, a.d_model,
                 2 * a.d_ff);
    if (a.n_tokens == 0) return;
    OSPREY_CHECK(a.u && a.x && aligned16(a.x), "moe_mlp1: u and x must be set, x 16-byte aligned");
    const KernelArgs k{a.w.blocks, a.w.scales, reinterpret_cast<const __nv_bfloat16*>(a.w.bias),
                       reinterpret_cast<const __nv_bfloat16*>(a.x), a.u, a.expert_offsets, a.sorted_rows,
                       a.n_experts, a.top_k, a.d_model, 2 * a.d_ff, a.d_model / 32, a.swiglu_alpha, a.swiglu_limit};
    const int variant = wgmma_variant_for(a.wgmma_variant, true, a.n_tokens, a.top_k, a.n_experts);
    const MoeKernel kind = resolve_kind(a.kernel, a.n_tokens, a.top_k, a.n_experts, a.d_model, 2 * a.d_ff, variant);
    if (kind == MoeKernel::wgmma) {
        moe_wgmma_launch({.mlp1 = true, .blocks = a.w.blocks, .scales = a.w.scales, .bias = a.w.bias, .x = a.x,
                          .out = a.u, .expert_offsets = a.expert_offsets, .sorted_rows = a.sorted_rows,
                          .n_rows = a.n_tokens * a.top_k, .n_experts = a.n_experts, .top_k = a.top_k,
                          .n_in = a.d_model, .n_out = 2 * a.d_ff, .swiglu_alpha = a.swiglu_alpha,
                          .swiglu_limit = a.swiglu_limit, .variant = variant},
                         stream);
        return;
    }
    launch_kind<Proj::mlp1>(kind, k, a.n_tokens * a.top_k, stream);
}

void moe_mlp2(const MoeMlp2Args& a, cudaStream_t stream) {
    check_common("moe_mlp2", a.w, a.expert_offsets, a.sorted_rows, a.n_tokens, a.n_experts, a.top_k, a.d_ff,
                 a.d_model);
    if (a.n_tokens == 0) return;
    OSPREY_CHECK(a.y && a.u && aligned16(a.u), "moe_mlp2: y and u must be set, u 16-byte aligned");
    const KernelArgs k{a.w.blocks, a.w.scales, reinterpret_cast<const __nv_bfloat16*>(a.w.bias),
                       reinterpret_cast<const __nv_bfloat16*>(a.u), a.y, a.expert_offsets, a.sorted_rows,
                       a.n_experts, a.top_k, a.d_ff, a.d_model, a.d_ff / 32, 0.0f, 0.0f};
    const int variant = wgmma_variant_for(a.wgmma_variant, false, a.n_tokens, a.top_k, a.n_experts);
    const MoeKernel kind = resolve_kind(a.kernel, a.n_tokens, a.top_k, a.n_experts, a.d_ff, a.d_model, variant);
    if (kind == MoeKernel::wgmma) {
        moe_wgmma_launch({.mlp1 = false, .blocks = a.w.blocks, .scales = a.w.scales, .bias = a.w.bias, .x = a.u,
                          .out = a.y, .expert_offsets = a.expert_offsets, .sorted_rows = a.sorted_rows,
                          .n_rows = a.n_tokens * a.top_k, .n_experts = a.n_experts, .top_k = a.top_k,
                          .n_in = a.d_ff, .n_out = a.d_model, .variant = variant},
                         stream);
        return;
    }
    launch_kind<Proj::mlp2>(kind, k, a.n_tokens * a.top_k, stream);
}

}  // namespace osprey::cuda
