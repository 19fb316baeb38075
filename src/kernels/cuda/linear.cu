// cuBLASLt plans for the dense linears. Row-major y[T, N] = x[T, K]·Wᵀ is computed as the
// column-major product yᵀ[N, T] = op(W)[N, K] · xᵀ[K, T] with op = transpose on the row-major W
// (which cuBLASLt sees as a column-major [K, N] matrix), so both operands are read as stored.
#include "kernels/cuda/linear.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string_view>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/log.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/rmsnorm_row.cuh"
#include "kernels/cuda/timeline.cuh"

#define CUBLAS_CHECK(expr)                                                                          \
    do {                                                                                            \
        const cublasStatus_t osprey_blas_st_ = (expr);                                              \
        if (osprey_blas_st_ != CUBLAS_STATUS_SUCCESS) {                                             \
            std::fprintf(stderr, "cuBLASLt error %s (%d) in `%s` at %s:%d\n",                       \
                         cublasLtGetStatusName(osprey_blas_st_), int(osprey_blas_st_), #expr, __FILE__, \
                         __LINE__);                                                                 \
            std::abort();                                                                           \
        }                                                                                           \
    } while (0)

namespace osprey::cuda {

namespace {

// Two BF16 products at once, rounded to nearest (the FP8 decode multiplies by a power of two: exact).
// Outside the part of this file scripts/emulate_gemv_kernel.sh extracts: the emulation has its own.
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
// Two E4M3 codes (low byte first) as two floats, exactly: cvt.rn.f16x2.e4m3x2 (every E4M3 value is an
// FP16 value) then the exact widening. Also outside the extracted part.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t pair) {
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(uint16_t(pair)));
    return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// The router tail's hand-over (gemv_router_tail_kernel below): one arrival counter, released by each
// projection CTA after its rows are stored and acquired by the router CTAs before their norm reads
// them. Also outside the extracted part (the emulation runs one CTA after the other: the count is
// complete when a router CTA starts).
__device__ __forceinline__ void gemv_count_release(unsigned* counter) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
}
__device__ __forceinline__ void gemv_count_wait(const unsigned* counter, unsigned target) {
    for (;;) {
        unsigned v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
        if (v >= target) return;
        __nanosleep(32);
    }
}

// GEMV for decode-sized batches (T <= kGemvMaxTokens) on the tensor cores. A memory-bound kernel:
// the weight is streamed from HBM exactly once per call whatever T is, x is tiny.
//
// mma.sync m16n8k16 with the roles of a decode GEMV: B (16 k x 8 n) = 8 weight rows, A (16 m x 16 k)
// = x with tokens as rows m (rows 8..15 stay zero, so T = 1..8 all cost the same), C = y[token][row].
// The sum over k does not care how k is ordered as long as A and B agree, so a lane's fragment
// slots are filled straight from one 16-byte load of 8 consecutive k: lane (g = lane / 4,
// q = lane % 4) loads W[row g][32c + 8q .. + 8) of a 32-wide chunk c; elements 0-3 go to the k slots
// {2q, 2q+1, 2q+8, 2q+9} of the first mma and 4-7 to those of the second. x uses the same map from
// a 16-byte shared-memory load of x[token g][32c + 8q .. + 8]. No conversions, no shuffles.
//
// CTA = 8 warps on kRows = 8 kTiles rows; the warps split K (each takes kUnroll adjacent chunks per
// round, i.e. 64 kUnroll contiguous bytes of each row) and keep kTiles x kUnroll = 8 16-byte loads per
// lane in flight, double-buffered in registers across rounds and across row blocks: up to 8 KB per
// warp. Both buffers' loads (the first two steps) go out before the PDL wait (weights are constant),
// so they stream while the kernels before finish. x is staged once per CTA into shared memory (bf16,
// rows padded so that the fragment loads are conflict-free) while those loads are in flight. Per row block the 8 warps'
// partial tiles are summed through shared memory in a fixed order (deterministic), then bias,
// residual and rounding. The grid is persistent (at most 2 CTAs per SM, grid-stride over row blocks)
// so the large unembedding keeps its prefetch running across row blocks.
//
// FP8 weights (kFp8, linear.h Fp8Weight): the same CTA, loads and epilogue; a 16-byte load now holds
// 16 codes, so a warp's unit of work is one 128-input block of its rows (two loads per row: k =
// 128 b + 64 h + 16 q .. + 16 for h = 0, 1), kUnroll / 2 blocks per round. Each 32-bit word of codes
// feeds one mma (e4m3x4_to_bf16x2: codes 0 and 2 as the B pair of slots 2q, 2q + 1, codes 1 and 3 as
// that of slots 2q + 8, 2q + 9); x is staged in the matching order (gemv_fp8_order: within each
// group of 4 inputs, elements 0, 2, 1, 3), so its fragments are still plain 16-byte shared loads.
// The mmas of one block accumulate into a zeroed partial tile, which is multiplied by its rows'
// multipliers (loaded at the start of the step, L1/L2-resident) and added into the accumulators:
// the scale is applied once per 128-input block and row, as cpu::fp8_matmul does.
constexpr int kGemvWarps = 8;
constexpr int kGemvThreads = kGemvWarps * kWarpSize;
constexpr int kGemvLoads = 8;      // 16-byte weight loads per lane per round (x2: double-buffered)
constexpr int kGemvChunk = 32;     // k per lane group of 4 per round: 4 lanes x 8 bf16
constexpr int kGemvCtasPerSm = 2;  // __launch_bounds__ below; the persistent grid's size
constexpr int kFp8Block = 128;     // inputs per FP8 multiplier (weight_block_size)

struct GemvParams {
    void* y;           // [T, ldy] bf16 or f32
    const bf16* x;     // [T, ldx]
    const bf16* w;     // [N, K] (bf16 weights)
    const void* bias;  // [N] bf16 (bf16 y) or f32 (f32 y), or null
    int n_tokens, n_out, n_in, ldx, ldy;
    int xs_ld;  // row stride of x in shared memory (elements): gemv_xs_ld()
    bool accumulate;
    GemvNorm norm;            // kNorm: x = this norm of the residual, computed in every CTA
    const float* acc_moe_y;   // accumulate: the MoE slots added to y first (linear.h), or null
    const float* acc_moe_w;
    Fp8Weight w8;             // kFp8: the weight's codes [N, K] and multipliers (linear.h)
    bool ahead2;              // two steps of weight loads before the PDL wait instead of one
};

// Row stride of the staged x. BF16: K rounded up to 64 elements plus 32, so that rows g and g + 1 of
// one 8-lane phase of a 16-byte shared load fall into different halves of the 32 banks (lanes q read
// 16-byte pieces 16 bytes apart). FP8: plus 8 instead, an odd number of 16-byte units per row, since
// lanes q read pieces 32 bytes apart (units 0, 2, 4, 6 for row g, the odd ones for row g + 1).
constexpr int gemv_xs_ld(int k, bool fp8 = false) {
    return (k + 63) / 64 * 64 + (fp8 ? 8 : 32);
}
__host__ __device__ constexpr size_t gemv_red_bytes(int tiles) {
    return size_t(kGemvWarps) * tiles * 64 * sizeof(float);
}
size_t gemv_smem_bytes(int tiles, int t, int k, bool fp8 = false) {
    return gemv_red_bytes(tiles) + size_t(t) * gemv_xs_ld(k, fp8) * sizeof(bf16);
}

// E4M3 -> BF16, exact, four codes at a time (code i in byte i of w) as two BF16x2 registers: codes 0
// and 2 (p02, low half first) and codes 1 and 3 (p13). A code s.eeee.mmm placed as the BF16 bits
// s.0000eeee.mmm0000 is its value times 2^-120, subnormals included (a zero exponent field is
// subnormal in both formats, with the same mantissa), so one mul.bf16x2 by 2^120 makes it exact: every
// E4M3 value is a BF16 value. The magnitude bits come from w shifted by 4 (left for bytes 0, 2, right
// for bytes 1, 3), the sign bits from s (in place for bytes 1, 3, shifted by 8 for bytes 0, 2), merged
// by one LOP3 each. 8 integer/FMA-pipe instructions per 4 codes (4 per pair); cvt.rn.f16x2.e4m3x2 then
// f16 -> f32 -> bf16x2 costs the same count with three conversions per pair. (NaN codes 0x7F/0xFF
// decode to 480: the converter never writes them, core/fp8.h saturates.)
constexpr uint32_t kE4m3Magnitude = 0x07F007F0u;  // bits 4..10 of both halves: eeee.mmm
constexpr uint32_t kBf16x2Pow120 = 0x7B807B80u;   // 2^120 in both halves
__device__ __forceinline__ void e4m3x4_to_bf16x2(uint32_t w, uint32_t& p02, uint32_t& p13) {
    const uint32_t s = w & 0x80808080u;  // the four sign bits, 7, 15, 23, 31
    p02 = mul_bf16x2(((w << 4) & kE4m3Magnitude) | ((s << 8) & ~kE4m3Magnitude), kBf16x2Pow120);
    p13 = mul_bf16x2(((w >> 4) & kE4m3Magnitude) | (s & ~kE4m3Magnitude), kBf16x2Pow120);
}

// Eight bf16 x values (one 16-byte piece, two groups of 4 inputs) in the FP8 kernel's k order: each
// group's elements 0, 2, 1, 3, so that words 0 and 1 of a group are the A pairs of the mma that takes
// that group's codes (p02, p13 above).
__device__ __forceinline__ uint4 gemv_fp8_order(uint4 v) {
    return make_uint4((v.x & 0xFFFFu) | (v.y << 16), (v.x >> 16) | (v.y & 0xFFFF0000u),
                      (v.z & 0xFFFFu) | (v.w << 16), (v.z >> 16) | (v.w & 0xFFFF0000u));
}

// Where a CTA sits among the CTAs of its GEMV: the whole grid (gemv_kernel), or a range of it (the
// router tail runs two GEMVs side by side in one grid).
struct GemvWholeGrid {
    __device__ __forceinline__ int cta() const { return int(blockIdx.x); }
    __device__ __forceinline__ int n_ctas() const { return int(gridDim.x); }
};
struct GemvGridRange {
    int first, count;
    __device__ __forceinline__ int cta() const { return int(blockIdx.x) - first; }
    __device__ __forceinline__ int n_ctas() const { return count; }
};

// One CTA's share of a GEMV (gemv_kernel's whole body). after_wait() runs right after the PDL wait, in
// every thread.
template <int kTiles, bool kF32, bool kNorm, bool kFp8, class Grid, class AfterWait>
__device__ __forceinline__ void gemv_cta(const GemvParams& p, const Grid grid, AfterWait after_wait) {
    OSPREY_TL_ENTER();
    constexpr int kUnroll = kGemvLoads / kTiles;  // 16-byte loads per row per warp and round
    constexpr int kBlocks = kUnroll / 2;          // FP8: 128-input blocks per warp and round
    constexpr int kUnits = kFp8 ? kBlocks : kUnroll;  // a warp's k units per round (chunks, or blocks)
    constexpr int kRows = 8 * kTiles;             // output rows per row block
    static_assert(kGemvLoads % kTiles == 0 && kTiles * 64 <= kGemvThreads && (!kFp8 || kUnroll % 2 == 0));
    extern __shared__ __align__(16) unsigned char smem[];
    float* red = reinterpret_cast<float*>(smem);                        // [warps][kTiles][8 tokens][8 rows]
    bf16* xs = reinterpret_cast<bf16*>(smem + gemv_red_bytes(kTiles));  // [T][xs_ld]

    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const int g = lane / 4, q = lane % 4;  // fragment coordinates: weight row / token g, k group q
    const int K = p.n_in, N = p.n_out;
    const int n_kblocks = (K + kFp8Block - 1) / kFp8Block;  // FP8: multipliers per row
    const int n_units = kFp8 ? n_kblocks : (K + kGemvChunk - 1) / kGemvChunk;
    const int per_round = kGemvWarps * kUnits;  // units a CTA covers per round
    const int n_rounds = (n_units + per_round - 1) / per_round;
    const int n_blocks = (N + kRows - 1) / kRows;
    // Row blocks cta, + n_ctas, ... (grid.cta(), grid.n_ctas()); every warp runs the same number of
    // steps (rounds of every block), so the __syncthreads below are reached uniformly.
    const int my_blocks = grid.cta() < n_blocks ? (n_blocks - 1 - grid.cta()) / grid.n_ctas() + 1 : 0;
    const int n_steps = my_blocks * n_rounds;
    if (n_steps == 0) {
        pdl_enter();  // launch.cuh: every block waits before it exits
        return;
    }

    // Weight fragments of one step; zeros past K or N (the matching x fragment is zero past K too).
    // BF16: load u is chunk u of the warp's kUnroll; FP8: half u % 2 of its block u / 2.
    auto load_step = [&](int step, uint4(&wv)[kUnroll][kTiles]) {
        const int block = grid.cta() + step / n_rounds * grid.n_ctas();
        const int round = step % n_rounds;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int k = kFp8 ? ((round * kGemvWarps + warp) * kBlocks + u / 2) * kFp8Block + u % 2 * 64 + 16 * q
                               : ((round * kGemvWarps + warp) * kUnroll + u) * kGemvChunk + 8 * q;
#pragma unroll
            for (int r = 0; r < kTiles; ++r) {
                const int row = block * kRows + 8 * r + g;
                const void* src = kFp8 ? static_cast<const void*>(p.w8.codes + size_t(row) * K + k)
                                       : static_cast<const void*>(p.w + size_t(row) * K + k);
                wv[u][r] = k < K && row < N ? __ldcs(reinterpret_cast<const uint4*>(src))  // streamed once
                                            : make_uint4(0, 0, 0, 0);
            }
        }
    };

    uint4 cur[kUnroll][kTiles], next[kUnroll][kTiles];
    load_step(0, cur);  // in flight while x is staged
    // p.ahead2: the second step's loads go out before the wait too (two steps of this CTA's weights:
    // both register buffers; the loop then skips its first load).
    const bool ahead2 = p.ahead2 && n_steps > 1;
    if (ahead2) load_step(1, next);
    // The weights are constant, so their first loads go out before the wait: when the previous kernel
    // triggered early (rmsnorm does), they overlap its tail. x and y belong to the kernels before.
    pdl_enter();
    OSPREY_TL_WAITED();
    after_wait();

    const int vecs_per_row = K / 8;
    if constexpr (kNorm) {
        // xs[t] = rmsnorm(res[t] + MoE slots) · gain, bit-identical to the rmsnorm kernel's rows.
        for (int t = 0; t < p.n_tokens; ++t) {
            if (t > 0) __syncthreads();  // rmsnorm_row's reduction scratch is reused
            const size_t r = size_t(t) * K;
            rmsnorm_row<kGemvThreads>(p.norm.res + r, nullptr, p.norm.moe_y ? p.norm.moe_y + 4 * r : nullptr,
                                      p.norm.moe_w ? p.norm.moe_w + 4 * t : nullptr, nullptr, p.norm.gain, K,
                                      p.norm.eps, reinterpret_cast<__nv_bfloat162*>(xs + size_t(t) * p.xs_ld));
        }
        __syncthreads();
        // The normed rows for later kernels (one CTA), and (FP8) the rows put in the mma's k order; each
        // thread rewrites only the pieces it read.
        const bool write_h = grid.cta() == 0 && p.norm.h;
        if (write_h || kFp8) {
            for (int v = threadIdx.x; v < p.n_tokens * vecs_per_row; v += kGemvThreads) {
                const int t = v / vecs_per_row, j = v % vecs_per_row;
                uint4* piece = reinterpret_cast<uint4*>(xs + size_t(t) * p.xs_ld + 8 * j);
                const uint4 u = *piece;
                if (write_h) *reinterpret_cast<uint4*>(p.norm.h + size_t(t) * K + 8 * j) = u;
                if constexpr (kFp8) *piece = gemv_fp8_order(u);
            }
            if constexpr (kFp8) __syncthreads();
        }
    } else {
        // x[T, K] -> xs[T, xs_ld], 16 bytes per thread and step (K, ldx multiples of 8; x 16-byte aligned).
        for (int v = threadIdx.x; v < p.n_tokens * vecs_per_row; v += kGemvThreads) {
            const int t = v / vecs_per_row, j = v % vecs_per_row;
            const uint4 u = __ldg(reinterpret_cast<const uint4*>(p.x + size_t(t) * p.ldx + 8 * j));
            *reinterpret_cast<uint4*>(xs + size_t(t) * p.xs_ld + 8 * j) = kFp8 ? gemv_fp8_order(u) : u;
        }
        __syncthreads();
    }

    float acc[kTiles][4];
#pragma unroll
    for (int r = 0; r < kTiles; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.f;

    for (int step = 0; step < n_steps; ++step) {
        if (step == 0 && ahead2) {
            // next already holds step 1's loads (issued before the wait)
        } else if (step + 1 < n_steps) {
            load_step(step + 1, next);  // issued before this step's fragments are used
        } else {
#pragma unroll
            for (int u = 0; u < kUnroll; ++u)
#pragma unroll
                for (int r = 0; r < kTiles; ++r) next[u][r] = make_uint4(0, 0, 0, 0);
        }

        const int round = step % n_rounds;
        if constexpr (kFp8) {
            // The multipliers of this lane's accumulator rows (8r + 2q + i) for the step's blocks: read
            // before the mmas, used after them; 0 past N or the last block (those partials are 0 too).
            const int block = grid.cta() + step / n_rounds * grid.n_ctas();
            float sc[kBlocks][kTiles][2];
#pragma unroll
            for (int b = 0; b < kBlocks; ++b) {
                const int kb = (round * kGemvWarps + warp) * kBlocks + b;
#pragma unroll
                for (int r = 0; r < kTiles; ++r)
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const int row = block * kRows + 8 * r + 2 * q + i;
                        sc[b][r][i] = kb < n_kblocks && row < N
                                          ? __ldg(p.w8.scale + size_t(row / p.w8.block_rows) * n_kblocks + kb)
                                          : 0.f;
                    }
            }
#pragma unroll
            for (int b = 0; b < kBlocks; ++b) {
                float part[kTiles][4];
#pragma unroll
                for (int r = 0; r < kTiles; ++r) part[r][0] = part[r][1] = part[r][2] = part[r][3] = 0.f;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int u = 2 * b + h;
                    const int k = ((round * kGemvWarps + warp) * kBlocks + b) * kFp8Block + 64 * h + 16 * q;
                    uint4 xa = make_uint4(0, 0, 0, 0), xb = xa;
                    if (g < p.n_tokens && k < K) {  // K % 16 == 0: a piece is wholly inside or outside
                        xa = *reinterpret_cast<const uint4*>(xs + size_t(g) * p.xs_ld + k);
                        xb = *reinterpret_cast<const uint4*>(xs + size_t(g) * p.xs_ld + k + 8);
                    }
                    const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                    for (int r = 0; r < kTiles; ++r) {
                        const uint32_t cw[4] = {cur[u][r].x, cur[u][r].y, cur[u][r].z, cur[u][r].w};
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            uint32_t p02, p13;
                            e4m3x4_to_bf16x2(cw[j], p02, p13);
                            // A rows g + 8 (tokens 8..15) are zero; inputs 4j + {0, 2 | 1, 3} of the piece.
                            mma_bf16(part[r], xw[2 * j], 0u, xw[2 * j + 1], 0u, p02, p13);
                        }
                    }
                }
#pragma unroll
                for (int r = 0; r < kTiles; ++r) {
                    acc[r][0] = fmaf(part[r][0], sc[b][r][0], acc[r][0]);
                    acc[r][1] = fmaf(part[r][1], sc[b][r][1], acc[r][1]);
                }
            }
        } else {
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int k = ((round * kGemvWarps + warp) * kUnroll + u) * kGemvChunk + 8 * q;
                const uint4 xv = g < p.n_tokens && k < K ? *reinterpret_cast<const uint4*>(xs + size_t(g) * p.xs_ld + k)
                                                         : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int r = 0; r < kTiles; ++r) {
                    // A rows g + 8 (tokens 8..15) are zero; B = the weight row's k slots of this lane.
                    mma_bf16(acc[r], xv.x, 0u, xv.y, 0u, cur[u][r].x, cur[u][r].y);
                    mma_bf16(acc[r], xv.z, 0u, xv.w, 0u, cur[u][r].z, cur[u][r].w);
                }
            }
        }

        if (round == n_rounds - 1) {
            // End of a row block: lane (g, q) holds y[token g][rows 8r + 2q, 2q + 1] of its K share.
#pragma unroll
            for (int r = 0; r < kTiles; ++r) {
                *reinterpret_cast<float2*>(red + ((warp * kTiles + r) * 8 + g) * 8 + 2 * q) =
                    make_float2(acc[r][0], acc[r][1]);
                acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.f;
            }
            __syncthreads();
            if (threadIdx.x < kTiles * 64) {
                const int r = threadIdx.x / 64, t = threadIdx.x / 8 % 8, j = threadIdx.x % 8;
                const int block = grid.cta() + step / n_rounds * grid.n_ctas();
                const int row = block * kRows + 8 * r + j;
                if (t < p.n_tokens && row < N) {
                    float v = 0.f;
#pragma unroll
                    for (int w = 0; w < kGemvWarps; ++w) v += red[((w * kTiles + r) * 8 + t) * 8 + j];  // fixed order
                    if constexpr (kF32) {
                        if (p.bias) v += static_cast<const float*>(p.bias)[row];
                        float* y = static_cast<float*>(p.y) + size_t(t) * p.ldy + row;
                        if (p.accumulate) {
                            float base = *y;
                            if (p.acc_moe_y) {  // the previous block's MoE residual add, in rmsnorm's order
                                float dv = 0.f;
#pragma unroll
                                for (int k = 0; k < 4; ++k)
                                    dv += __ldcg(p.acc_moe_w + 4 * t + k) *
                                          __ldcg(p.acc_moe_y + (size_t(t) * 4 + k) * N + row);
                                base += dv;
                            }
                            *y = base + v;
                        } else {
                            *y = v;
                        }
                    } else {
                        if (p.bias) v += __bfloat162float(static_cast<const __nv_bfloat16*>(p.bias)[row]);
                        static_cast<__nv_bfloat16*>(p.y)[size_t(t) * p.ldy + row] = __float2bfloat16_rn(v);
                    }
                }
            }
            __syncthreads();  // red is rewritten by the next row block
        }

#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
            for (int r = 0; r < kTiles; ++r) cur[u][r] = next[u][r];
    }
    OSPREY_TL_EXIT(kFp8 ? static_cast<const void*>(p.w8.codes) : static_cast<const void*>(p.w),
                   kTlGemv | (uint32_t(N) << 8));
}

template <int kTiles, bool kF32, bool kNorm, bool kFp8>
__global__ void __launch_bounds__(kGemvThreads, kGemvCtasPerSm) gemv_kernel(const GemvParams p) {
    gemv_cta<kTiles, kF32, kNorm, kFp8>(p, GemvWholeGrid{}, [] {});
}

// The decode out-projection and the router GEMV in one grid (gemv_router_tail in linear.h): CTAs
// [0, n_main) run the projection (f32 y, residual accumulate, BF16 weight) and count themselves done;
// CTAs [n_main, n_main + n_tail) run the router with its norm prologue, issue their first weight loads
// at once, wait for the count after their PDL wait and only then read the residual. The last router
// CTA to finish leaves the counter at zero for the next call. The router CTAs have the grid's highest
// indices, so the projection's CTAs are all dispatched before any router CTA can occupy a slot by
// waiting (the grids here are at most one wave: at most kGemvCtasPerSm per SM).
struct GemvTailParams {
    GemvParams main, tail;
    int n_main, n_tail;  // CTAs of each
    unsigned* counter;   // zero before and after every call
};

template <int kTilesMain>
__global__ void __launch_bounds__(kGemvThreads, kGemvCtasPerSm) gemv_router_tail_kernel(const GemvTailParams tp) {
    if (int(blockIdx.x) < tp.n_main) {
        gemv_cta<kTilesMain, true, false, false>(tp.main, GemvGridRange{0, tp.n_main}, [] {});
        __threadfence();  // this thread's stores of y, before the count (as attention's fused merge)
        __syncthreads();
        if (threadIdx.x == 0) gemv_count_release(tp.counter);
        return;
    }
    gemv_cta<1, true, true, false>(tp.tail, GemvGridRange{tp.n_main, tp.n_tail}, [&] {
        if (threadIdx.x == 0) gemv_count_wait(tp.counter, unsigned(tp.n_main));
        __syncthreads();
    });
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(tp.counter, 1u) == unsigned(tp.n_main + tp.n_tail - 1)) atomicExch(tp.counter, 0u);
}

bool aligned16(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// Rows per CTA: the most (fewest x copies into shared memory, x traffic = T / rows of the weight's)
// that still gives every SM a CTA; small N (the routers) takes 8 rows per CTA, K split over 8 warps.
int gemv_rows_auto(int n_out) {
    for (const int rows : {32, 16})
        if ((n_out + rows - 1) / rows >= sm_count()) return rows;
    return 8;
}

// Dynamic shared memory a block may opt in to (227 KB on the H200).
int smem_optin() {
    static const int v = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    return v;
}

// Shared memory of one SM (228 KB on the H200), for the router tail's one-wave check.
int smem_per_sm() {
    static const int v = device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
    return v;
}

// x of T tokens fits in shared memory with the largest row block (T = 8: K up to ~13k).
bool gemv_fits(int n_tokens, int n_in) {
    return gemv_smem_bytes(4, n_tokens, n_in) + 256 <= size_t(smem_optin());  // + the norm's static scratch
}

// Every CTA issues two steps of its weight loads before the PDL wait (both register buffers), so that
// more of its bytes stream while the kernels before it finish: H200, 20b, 1k context, batch 1 / 8 516.1
// / 2058.5 against 512.2 / 2048.8 tokens/s with one step, 8k 491.7 / 1707.5 against 484.3 / 1699.6
// (docs/performance.md, eleventh session). $OSPREY_GEMV_AHEAD=1 gives one step (A/B knob, read once).
bool gemv_ahead2() {
    static const bool v = [] {
        const char* e = std::getenv("OSPREY_GEMV_AHEAD");
        return !(e && std::string_view(e) == "1");
    }();
    return v;
}

GemvParams gemv_params(const LinearArgs& a, int ldx, int ldy) {
    const bool fp8 = a.w8.codes != nullptr;
    return GemvParams{.y = a.y,
                      .x = a.x,
                      .w = a.w,
                      .bias = a.bias,
                      .n_tokens = a.n_tokens,
                      .n_out = a.n_out,
                      .n_in = a.n_in,
                      .ldx = ldx,
                      .ldy = ldy,
                      .xs_ld = gemv_xs_ld(a.n_in, fp8),
                      .accumulate = a.accumulate,
                      .norm = a.norm,
                      .acc_moe_y = a.acc_moe_y,
                      .acc_moe_w = a.acc_moe_w,
                      .w8 = a.w8,
                      .ahead2 = gemv_ahead2()};
}

// CTAs of the two parts of gemv_router_tail: the projection's (its automatic row block) and the router's
// (8 rows each), and the dynamic shared memory of the larger part.
struct RouterTailGrid {
    int rows_main, n_main, n_tail;
    size_t smem;
};
RouterTailGrid router_tail_grid(const LinearArgs& proj, const LinearArgs& router) {
    const int rows = proj.gemv_rows ? proj.gemv_rows : gemv_rows_auto(proj.n_out);
    return {rows, std::min((proj.n_out + rows - 1) / rows, kGemvCtasPerSm * sm_count()),
            std::min((router.n_out + 7) / 8, kGemvCtasPerSm * sm_count()),
            std::max(gemv_smem_bytes(rows / 8, proj.n_tokens, proj.n_in), gemv_smem_bytes(1, router.n_tokens, router.n_in))};
}

void gemv(const LinearArgs& a, int ldx, int ldy, cudaStream_t stream) {
    const bool fp8 = a.w8.codes != nullptr;
    const int rows = a.gemv_rows ? a.gemv_rows : gemv_rows_auto(a.n_out);
    OSPREY_CHECK(rows == 8 || rows == 16 || rows == 32, "linear: GEMV rows per CTA must be 8, 16 or 32, got ",
                 a.gemv_rows);
    const int tiles = rows / 8;
    const size_t smem = gemv_smem_bytes(tiles, a.n_tokens, a.n_in, fp8);
    const GemvParams p = gemv_params(a, ldx, ldy);
    const int n_blocks = (a.n_out + rows - 1) / rows;
    const int grid = std::min(n_blocks, kGemvCtasPerSm * sm_count());
    dispatch_int<1, 2, 4>("gemv tiles", tiles, [&]<int kTiles>() {
        dispatch_bool(a.y_f32, [&]<bool kF32>() {
            dispatch_bool(a.norm.res != nullptr, [&]<bool kNorm>() {
                dispatch_bool(fp8, [&]<bool kFp8>() {
                    cuda::launch(gemv_kernel<kTiles, kF32, kNorm, kFp8>, grid, kGemvThreads, smem, stream, p);
                });
            });
        });
    });
    CUDA_CHECK(cudaGetLastError());
}

// gemv_wide (linear.h): one warp per output feature n streams W's row once (16-byte loads, twelve in
// flight per lane: a whole 2880-wide BF16 row in one round) and dots it with the kT token rows of x
// (read through L1: x is tiny); FP32 accumulation, a warp reduction, then bias / residual / rounding.
// FP8 (kFp8): a load is 16 codes, decoded exactly to floats (e4m3x2_to_float2); their partial dot is
// multiplied by the multiplier of the 128-input block it lies in before it joins the accumulator (one
// multiply per 16 weights and token; the block's sum is then complete once the lanes are reduced).
constexpr int kWideWarps = 8;
constexpr int kWideUnroll = 12;

// FP8 is compiled for 3 resident CTAs per SM (at most 85 registers; it takes 93 unbounded, i.e. 2 CTAs):
// the FP8 warp's decode outlasts its loads' latency, so more warps keep more loads in flight. H200,
// bench_linear unembedding T=1: 196.3 against 232.7 us (63.7% against 53.7% of 4.64 TB/s; 4 CTAs: 219.2).
template <int kT, bool kF32, bool kFp8>
__global__ void __launch_bounds__(kWideWarps * kWarpSize, kFp8 ? 3 : 1) gemv_wide_kernel(const LinearArgs a, int ldx,
                                                                                         int ldy) {
    pdl_enter();  // launch.cuh: before any early return or global access
    const int lane = threadIdx.x % kWarpSize;
    const int n = blockIdx.x * kWideWarps + threadIdx.x / kWarpSize;
    if (n >= a.n_out) return;
    constexpr int kPerVec = kFp8 ? 16 : 8;  // weights per 16-byte load
    const uint4* w = kFp8 ? reinterpret_cast<const uint4*>(a.w8.codes + size_t(n) * a.n_in)
                          : reinterpret_cast<const uint4*>(a.w + size_t(n) * a.n_in);
    const int n_vec = a.n_in / kPerVec;
    // FP8: the row's multipliers, one per 128 inputs (8 loads)
    const float* w_scale = kFp8 ? a.w8.scale + size_t(n / a.w8.block_rows) * ((a.n_in + kFp8Block - 1) / kFp8Block)
                                : nullptr;
    float acc[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) acc[t] = 0.f;
    for (int base = lane; base < n_vec; base += kWarpSize * kWideUnroll) {
        uint4 wv[kWideUnroll];
#pragma unroll
        for (int u = 0; u < kWideUnroll; ++u) {
            const int v = base + u * kWarpSize;
            wv[u] = v < n_vec ? __ldcs(w + v) : make_uint4(0, 0, 0, 0);  // streamed once: evict first
        }
#pragma unroll
        for (int u = 0; u < kWideUnroll; ++u) {
            const int v = base + u * kWarpSize;
            if (v >= n_vec) break;
            float wf[kPerVec];
            if constexpr (kFp8) {
                const uint32_t cw[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float2 lo = e4m3x2_to_float2(cw[j]), hi = e4m3x2_to_float2(cw[j] >> 16);
                    wf[4 * j] = lo.x, wf[4 * j + 1] = lo.y, wf[4 * j + 2] = hi.x, wf[4 * j + 3] = hi.y;
                }
            } else {
                bf16x8_to_float(wv[u], reinterpret_cast<float(&)[8]>(wf));
            }
            const float s = kFp8 ? __ldg(w_scale + v * kPerVec / kFp8Block) : 1.f;
#pragma unroll
            for (int t = 0; t < kT; ++t) {
                if (t >= a.n_tokens) break;
                const uint4* xv = reinterpret_cast<const uint4*>(a.x + size_t(t) * ldx) + v * (kPerVec / 8);
                float dot = 0.f;
#pragma unroll
                for (int h = 0; h < kPerVec / 8; ++h) {
                    float xf[8];
                    bf16x8_to_float(__ldg(xv + h), xf);
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        if constexpr (kFp8) {
                            dot = fmaf(wf[8 * h + e], xf[e], dot);
                        } else {
                            acc[t] = fmaf(wf[8 * h + e], xf[e], acc[t]);
                        }
                    }
                }
                if constexpr (kFp8) acc[t] = fmaf(dot, s, acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < kT; ++t) acc[t] = warp_reduce_sum(acc[t]);
    if (lane != 0) return;
    for (int t = 0; t < a.n_tokens; ++t) {
        if constexpr (kF32) {
            const float v = acc[t] + (a.bias ? static_cast<const float*>(a.bias)[n] : 0.f);
            float* y = static_cast<float*>(a.y) + size_t(t) * ldy + n;
            *y = a.accumulate ? *y + v : v;
        } else {
            const float b = a.bias ? __bfloat162float(static_cast<const __nv_bfloat16*>(a.bias)[n]) : 0.f;
            static_cast<__nv_bfloat16*>(a.y)[size_t(t) * ldy + n] = __float2bfloat16_rn(acc[t] + b);
        }
    }
}

void gemv_wide(const LinearArgs& a, int ldx, int ldy, cudaStream_t stream) {
    const dim3 grid((a.n_out + kWideWarps - 1) / kWideWarps);
    const int t_case = a.n_tokens <= 1 ? 1 : a.n_tokens <= 2 ? 2 : a.n_tokens <= 4 ? 4 : 8;
    dispatch_int<1, 2, 4, 8>("gemv tokens", t_case, [&]<int kT>() {
        dispatch_bool(a.y_f32, [&]<bool kF32>() {
            dispatch_bool(a.w8.codes != nullptr, [&]<bool kFp8>() {
                cuda::launch(gemv_wide_kernel<kT, kF32, kFp8>, grid, kWideWarps * kWarpSize, 0, stream, a, ldx, ldy);
            });
        });
    });
    CUDA_CHECK(cudaGetLastError());
}

// FP8 prefill: rows [n0, n0 + rows) of an FP8 weight as BF16, out[r][k] = bf16(e4m3(code) · multiplier)
// (the product in FP32, one rounding to BF16: what the BF16 GEMM then reads). 16 codes per thread and
// step when K is a multiple of 16 (16-byte loads), one otherwise.
constexpr int kDequantThreads = 256;

__global__ void __launch_bounds__(kDequantThreads) fp8_dequant_rows_kernel(bf16* out, const Fp8Weight w, int n0,
                                                                           int rows, int K) {
    pdl_enter();  // launch.cuh (out may still be read by the previous chunk's GEMM: stream order)
    const int n_kblocks = (K + kFp8Block - 1) / kFp8Block;
    const size_t stride = size_t(gridDim.x) * kDequantThreads;
    const size_t first = size_t(blockIdx.x) * kDequantThreads + threadIdx.x;
    if (K % 16 == 0) {
        const int per_row = K / 16;
        for (size_t i = first; i < size_t(rows) * per_row; i += stride) {
            const int r = int(i / per_row), k = int(i % per_row) * 16;
            const int n = n0 + r;
            const uint4 c = __ldcs(reinterpret_cast<const uint4*>(w.codes + size_t(n) * K + k));
            const float s = __ldg(w.scale + size_t(n / w.block_rows) * n_kblocks + k / kFp8Block);
            const uint32_t cw[4] = {c.x, c.y, c.z, c.w};
            float f[16];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 lo = e4m3x2_to_float2(cw[j]), hi = e4m3x2_to_float2(cw[j] >> 16);
                f[4 * j] = lo.x * s, f[4 * j + 1] = lo.y * s, f[4 * j + 2] = hi.x * s, f[4 * j + 3] = hi.y * s;
            }
            uint4* dst = reinterpret_cast<uint4*>(out + size_t(r) * K + k);
            dst[0] = float_to_bf16x8(reinterpret_cast<const float(&)[8]>(f[0]));
            dst[1] = float_to_bf16x8(reinterpret_cast<const float(&)[8]>(f[8]));
        }
    } else {
        for (size_t i = first; i < size_t(rows) * K; i += stride) {
            const int r = int(i / K), k = int(i % K);
            const int n = n0 + r;
            const float s = __ldg(w.scale + size_t(n / w.block_rows) * n_kblocks + k / kFp8Block);
            out[size_t(r) * K + k].bits =
                __bfloat16_as_ushort(__float2bfloat16_rn(e4m3x2_to_float2(w.codes[size_t(n) * K + k]).x * s));
        }
    }
}

// Opts every GEMV instance in to all the dynamic shared memory a block may have (x of 8 tokens at
// K = 4096 is 66 KB). Done by Blas's constructor, before any graph capture (not a stream operation).
template <int kTiles, bool kF32, bool kNorm, bool kFp8>
void gemv_configure_one(int smem_limit) {
    cudaFuncAttributes attr{};  // the norm prologue's reduction scratch is static shared memory
    CUDA_CHECK(cudaFuncGetAttributes(&attr, gemv_kernel<kTiles, kF32, kNorm, kFp8>));
    CUDA_CHECK(cudaFuncSetAttribute(gemv_kernel<kTiles, kF32, kNorm, kFp8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    smem_limit - int(attr.sharedSizeBytes)));
}

template <int kTilesMain>
void router_tail_configure_one(int smem_limit) {
    cudaFuncAttributes attr{};
    CUDA_CHECK(cudaFuncGetAttributes(&attr, gemv_router_tail_kernel<kTilesMain>));
    CUDA_CHECK(cudaFuncSetAttribute(gemv_router_tail_kernel<kTilesMain>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    smem_limit - int(attr.sharedSizeBytes)));
}

void gemv_configure() {
    const int smem_limit = smem_optin();
    router_tail_configure_one<1>(smem_limit);
    router_tail_configure_one<2>(smem_limit);
    router_tail_configure_one<4>(smem_limit);
    for (const int tiles : {1, 2, 4})
        dispatch_int<1, 2, 4>("gemv tiles", tiles, [&]<int kTiles>() {
            for (const bool f32 : {false, true})
                dispatch_bool(f32, [&]<bool kF32>() {
                    for (const bool norm : {false, true})
                        dispatch_bool(norm, [&]<bool kNorm>() {
                            gemv_configure_one<kTiles, kF32, kNorm, false>(smem_limit);
                            gemv_configure_one<kTiles, kF32, kNorm, true>(smem_limit);
                        });
                });
        });
}

}  // namespace

bool gemv_norm_supported(int n_tokens, int n_in, bool fp8_weight) {
    return n_tokens >= 1 && n_tokens <= kGemvMaxTokens && n_in % 8 == 0 && n_in <= kRmsNormMaxChannels &&
           gemv_fits(n_tokens, n_in) && (!fp8_weight || fp8_gemv_shape_ok(n_in));
}

bool gemv_router_tail_supported(const LinearArgs& proj, const LinearArgs& router) {
    const int T = proj.n_tokens;
    const bool proj_ok = proj.w && !proj.w8.codes && proj.x && !proj.norm.res && proj.y_f32 && proj.accumulate &&
                         (proj.ldy == 0 || proj.ldy == proj.n_out) && (proj.ldx == 0 || proj.ldx % 8 == 0) &&
                         proj.n_in % 8 == 0 && aligned16(proj.x) && aligned16(proj.w) &&
                         proj.path != LinearPath::blas && proj.path != LinearPath::gemv_wide &&
                         (proj.gemv_rows == 0 || proj.gemv_rows == 8 || proj.gemv_rows == 16 || proj.gemv_rows == 32) &&
                         // what Blas::linear would run for it alone: the GEMV, not gemv_wide
                         (proj.acc_moe_y || T > 1 || proj.n_out < kGemvWideMinOut) && gemv_fits(T, proj.n_in);
    const bool router_ok = router.w && !router.w8.codes && !router.x && router.norm.res && !router.norm.moe_y &&
                           router.y_f32 && !router.accumulate && !router.acc_moe_y && router.n_tokens == T &&
                           router.n_in == proj.n_out && router.norm.res == static_cast<const float*>(proj.y) &&
                           (router.ldy == 0 || router.ldy == router.n_out) && aligned16(router.w) &&
                           (!router.norm.h || aligned16(router.norm.h)) && aligned16(router.norm.res) &&
                           router.path != LinearPath::blas && router.path != LinearPath::gemv_wide &&
                           (router.gemv_rows == 0 ? gemv_rows_auto(router.n_out) == 8 : router.gemv_rows == 8) &&
                           gemv_norm_supported(T, router.n_in);
    if (!proj_ok || !router_ok || T < 1 || T > kGemvMaxTokens) return false;
    // One wave: every CTA of the grid resident at once (kGemvCtasPerSm per SM by registers; shared memory
    // checked here), so the router CTAs' wait cannot keep a projection CTA from starting.
    const RouterTailGrid g = router_tail_grid(proj, router);
    return g.n_main + g.n_tail <= kGemvCtasPerSm * sm_count() &&
           size_t(kGemvCtasPerSm) * (g.smem + 2048) <= size_t(smem_per_sm());
}

void gemv_router_tail(const LinearArgs& proj, const LinearArgs& router, unsigned* counter, cudaStream_t stream) {
    OSPREY_CHECK(counter != nullptr && gemv_router_tail_supported(proj, router),
                 "gemv_router_tail: needs a zeroed counter, an accumulating f32 BF16-weight projection on the GEMV "
                 "path and a router with the norm prologue of its output (linear.h)");
    const RouterTailGrid g = router_tail_grid(proj, router);
    const GemvTailParams tp{.main = gemv_params(proj, proj.ldx ? proj.ldx : proj.n_in, proj.n_out),
                            .tail = gemv_params(router, router.n_in, router.n_out),
                            .n_main = g.n_main,
                            .n_tail = g.n_tail,
                            .counter = counter};
    dispatch_int<1, 2, 4>("gemv tiles", g.rows_main / 8, [&]<int kTiles>() {
        cuda::launch(gemv_router_tail_kernel<kTiles>, g.n_main + g.n_tail, kGemvThreads, g.smem, stream, tp);
    });
    CUDA_CHECK(cudaGetLastError());
}

struct Blas::Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    ~Plan() {
        if (op) cublasLtMatmulDescDestroy(op);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (c) cublasLtMatrixLayoutDestroy(c);
    }
};

Blas::Blas(size_t workspace_bytes) : workspace_(workspace_bytes) {
    gemv_configure();
    cublasLtHandle_t h = nullptr;
    CUBLAS_CHECK(cublasLtCreate(&h));
    handle_ = h;
}

Blas::~Blas() {
    for (auto& [key, plan] : plans_) delete plan;
    if (handle_) cublasLtDestroy(handle_);
}

void Blas::reserve_fp8_scratch(size_t bytes) {
    if (fp8_scratch_.bytes() >= bytes) return;
    fp8_scratch_ = DeviceBuffer<bf16>(bytes / sizeof(bf16));
}

Blas::Plan& Blas::plan_for(const LinearArgs& a) {
    const int ldx = a.ldx ? a.ldx : a.n_in;
    const int ldy = a.ldy ? a.ldy : a.n_out;
    const Key key{a.n_tokens, a.n_out, a.n_in, ldx, ldy, a.y_f32, a.bias != nullptr, a.accumulate};
    if (auto it = plans_.find(key); it != plans_.end()) return *it->second;

    auto plan = std::make_unique<Plan>();
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof no_trans));
    if (a.bias) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        const cudaDataType_t bias_type = a.y_f32 ? CUDA_R_32F : CUDA_R_16BF;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                    sizeof bias_type));
    }
    const cudaDataType_t out_type = a.y_f32 ? CUDA_R_32F : CUDA_R_16BF;
    // A = W as column-major [K, N] (ld K), B = x as column-major [K, T] (ld ldx), C = D = y [N, T].
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, a.n_in, a.n_out, a.n_in));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, a.n_in, a.n_tokens, ldx));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, out_type, a.n_out, a.n_tokens, ldy));

    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = workspace_.bytes();
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t result{};
    int n_results = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, plan->op, plan->a, plan->b, plan->c, plan->c,
                                                             pref, 1, &result, &n_results);
    cublasLtMatmulPreferenceDestroy(pref);
    OSPREY_CHECK(st == CUBLAS_STATUS_SUCCESS && n_results > 0, "cuBLASLt has no algorithm for linear T=",
                 a.n_tokens, " N=", a.n_out, " K=", a.n_in, " (status ", cublasLtGetStatusName(st), ")");
    plan->algo = result.algo;
    log::debug("cublasLt plan T=", a.n_tokens, " N=", a.n_out, " K=", a.n_in, " f32=", a.y_f32,
               " bias=", a.bias != nullptr, " acc=", a.accumulate);
    Plan* raw = plan.release();
    plans_.emplace(key, raw);
    return *raw;
}

void Blas::linear(const LinearArgs& a, cudaStream_t stream) {
    OSPREY_CHECK(a.n_tokens > 0 && a.n_out > 0 && a.n_in > 0, "linear: empty shape T=", a.n_tokens, " N=", a.n_out,
                 " K=", a.n_in);
    const bool fused = a.norm.res != nullptr || a.acc_moe_y != nullptr;
    const bool fp8 = a.w8.codes != nullptr;
    const void* w = fp8 ? static_cast<const void*>(a.w8.codes) : a.w;
    OSPREY_CHECK((a.x || a.norm.res) && w && a.y, "linear: null pointer");
    OSPREY_CHECK(!fp8 || (!a.w && a.w8.scale && a.w8.block_rows >= 1 && a.w8.block_rows <= kFp8Block),
                 "linear: an FP8 weight takes no BF16 w, needs its multipliers and 1..128 rows per multiplier row "
                 "(block_rows ", a.w8.block_rows, ")");
    OSPREY_CHECK(!a.norm.res || (!a.x && a.norm.gain && (!a.norm.moe_y || a.norm.moe_w) &&
                                 a.n_in <= kRmsNormMaxChannels && a.n_in % 8 == 0),
                 "linear: the norm prologue takes no x, needs the gain (and moe_w with moe_y) and K a multiple of 8 up "
                 "to ", kRmsNormMaxChannels, " (K=", a.n_in, ")");
    OSPREY_CHECK(!a.acc_moe_y || (a.acc_moe_w && a.accumulate && a.y_f32 && (a.ldy == 0 || a.ldy == a.n_out)),
                 "linear: acc_moe_y needs acc_moe_w and a dense accumulating f32 output");
    OSPREY_CHECK(!a.accumulate || a.y_f32, "linear: accumulating into a bf16 output is not supported (f32 only)");
    OSPREY_CHECK((a.ldx == 0 || a.ldx >= a.n_in) && (a.ldy == 0 || a.ldy >= a.n_out),
                 "linear: row stride smaller than the row (ldx ", a.ldx, ", ldy ", a.ldy, ")");
    const int ldx = a.ldx ? a.ldx : a.n_in, ldy = a.ldy ? a.ldy : a.n_out;
    // The GEMV kernels read W in 16-byte pieces: K a multiple of 8 (BF16) or 16 (FP8), rows aligned.
    const bool k_ok = fp8 ? fp8_gemv_shape_ok(a.n_in) : a.n_in % 8 == 0;
    const bool wide_ok = a.n_tokens <= kGemvMaxTokens && k_ok && ldx % 8 == 0 && aligned16(a.x) && aligned16(w);
    const bool gemv_ok = wide_ok && gemv_fits(a.n_tokens, a.n_in);
    if (fused) {  // only the GEMV kernel has the norm prologue and the MoE residual add
        OSPREY_CHECK(gemv_norm_supported(a.n_tokens, a.n_in, fp8) && a.path != LinearPath::blas &&
                         a.path != LinearPath::gemv_wide,
                     "linear: the norm prologue and acc_moe_y need the GEMV path (T=", a.n_tokens, ", K=", a.n_in,
                     fp8 ? ", FP8: K a multiple of 16" : "", ")");
        OSPREY_CHECK(aligned16(w) && (a.x ? aligned16(a.x) && ldx % 8 == 0 : true) &&
                         (!a.norm.h || aligned16(a.norm.h)) && (!a.norm.res || aligned16(a.norm.res)),
                     "linear: the GEMV path needs 16-byte aligned W, x, h and residual");
        gemv(a, ldx, ldy, stream);
        return;
    }
    OSPREY_CHECK(a.path != LinearPath::gemv_wide || wide_ok, "linear: the wide GEMV path needs <= ", kGemvMaxTokens,
                 " tokens, K (a multiple of ", fp8 ? 16 : 8, ") and ldx multiples of 8 and 16-byte aligned x, W (T=",
                 a.n_tokens, ", K=", a.n_in, ")");
    if (a.path == LinearPath::gemv_wide ||
        (a.path == LinearPath::automatic && wide_ok && a.n_tokens == 1 && a.n_out >= kGemvWideMinOut)) {
        gemv_wide(a, ldx, ldy, stream);
        return;
    }
    OSPREY_CHECK(a.path != LinearPath::gemv || gemv_ok, "linear: the GEMV path needs <= ", kGemvMaxTokens,
                 " tokens, K (a multiple of ", fp8 ? 16 : 8, ") and ldx multiples of 8, 16-byte aligned x, W and x in "
                 "shared memory (T=", a.n_tokens, ", K=", a.n_in, ")");
    if (a.path == LinearPath::gemv || (a.path == LinearPath::automatic && gemv_ok && a.n_tokens <= kGemvAutoTokens)) {
        gemv(a, ldx, ldy, stream);
        return;
    }
    if (fp8 && a.path == LinearPath::automatic && k_ok && ldx % 8 == 0 && aligned16(a.x) && aligned16(w) &&
        gemv_fits(kGemvMaxTokens, a.n_in) && a.n_tokens <= kFp8GemvGroupMaxTokens) {
        // 9..32 tokens: the GEMV per group of 8 (linear.h, kFp8GemvGroupMaxTokens); rows t0.. of x and y.
        const size_t y_elem = a.y_f32 ? sizeof(float) : sizeof(bf16);
        for (int t0 = 0; t0 < a.n_tokens; t0 += kGemvMaxTokens) {
            LinearArgs g = a;
            g.n_tokens = std::min(kGemvMaxTokens, a.n_tokens - t0);
            g.x = a.x + size_t(t0) * ldx;
            g.y = static_cast<uint8_t*>(a.y) + size_t(t0) * ldy * y_elem;
            gemv(g, ldx, ldy, stream);
        }
        return;
    }
    if (fp8) {
        fp8_dequant_linear(a, ldx, ldy, stream);
        return;
    }
    Plan& p = plan_for(a);
    // The bias pointer is set per call (plans are shared by all layers of one shape).
    if (a.bias) {
        const void* bias = a.bias;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    const float alpha = 1.0f, beta = a.accumulate ? 1.0f : 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(handle_, p.op, &alpha, a.w, p.a, a.x, p.b, &beta, a.y, p.c, a.y, p.c, &p.algo,
                                workspace_.get(), workspace_.bytes(), stream));
}

// FP8 prefill (T > kFp8GemvGroupMaxTokens, or shapes the GEMVs do not take): the simplest correct path. W is dequantised to
// BF16 (fp8_dequant_rows_kernel: one rounding of code · multiplier per weight, 2^-9 relative, the
// rounding a BF16 checkpoint's weights carry too) in chunks of rows that fit the scratch, and each chunk
// runs as an ordinary BF16 cuBLASLt linear writing its columns of y (y + n0 with the row stride ldy;
// bias + n0). The scratch is bounded (kFp8ScratchBytes: the 201088 x 2880 unembedding takes 18
// chunks of 11650 rows) and reused by every call, in stream order. Traffic per call: the codes once,
// the BF16 chunk written and read: about 5x the codes' bytes, which prefill's GEMM time hides at
// T in the hundreds; a block-scaled FP8 GEMM that decodes into shared memory would remove it.
void Blas::fp8_dequant_linear(const LinearArgs& a, int ldx, int ldy, cudaStream_t stream) {
    if (fp8_scratch_.size() == 0) {
        cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
        CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
        OSPREY_CHECK(capturing == cudaStreamCaptureStatusNone,
                     "linear: the FP8 dequantisation scratch must be reserved before a graph capture "
                     "(Blas::reserve_fp8_scratch)");
        reserve_fp8_scratch();
    }
    const size_t max_rows = fp8_scratch_.size() / size_t(a.n_in);
    OSPREY_CHECK(max_rows >= 1, "linear: the FP8 scratch (", fp8_scratch_.bytes(), " bytes) holds no row of K=",
                 a.n_in);
    const int chunk = int(std::min<size_t>(max_rows, size_t(a.n_out)));
    const size_t y_elem = a.y_f32 ? sizeof(float) : sizeof(bf16);
    const size_t bias_elem = a.y_f32 ? sizeof(float) : sizeof(bf16);
    for (int n0 = 0; n0 < a.n_out; n0 += chunk) {
        const int rows = std::min(chunk, a.n_out - n0);
        const size_t work = size_t(rows) * a.n_in / (a.n_in % 16 == 0 ? 16 : 1);
        const int grid = int(std::min<size_t>((work + kDequantThreads - 1) / kDequantThreads, size_t(8) * sm_count()));
        cuda::launch(fp8_dequant_rows_kernel, grid, kDequantThreads, 0, stream, fp8_scratch_.get(), a.w8, n0, rows,
                     a.n_in);
        CUDA_CHECK(cudaGetLastError());
        LinearArgs c = a;
        c.w8 = {};
        c.w = fp8_scratch_.get();
        c.y = static_cast<uint8_t*>(a.y) + size_t(n0) * y_elem;
        c.bias = a.bias ? static_cast<const uint8_t*>(a.bias) + size_t(n0) * bias_elem : nullptr;
        c.n_out = rows;
        c.ldx = ldx;
        c.ldy = ldy;
        c.path = LinearPath::blas;
        linear(c, stream);
    }
}

}  // namespace osprey::cuda
