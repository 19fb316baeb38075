// Grouped expert GEMMs for matrix experts (FP8 block-scaled W8A8, or BF16) on Hopper warpgroup MMA
// (sm_90a): moe_matrix() of moe_mlp_matrix.h.
//
// Roles and schedule: those of the MXFP4 GEMMs (moe_mlp_wgmma.cu, moe_mlp_w4a8.cu; moe_gemm_sm90.cuh):
// a persistent CTA of one producer warpgroup and kConsumerWGs = 2 consumer warpgroups (setmaxnreg moves
// the registers to the consumers); a tile is (expert, kBN routed rows, kBM weight rows), tiles numbered
// expert-major then n-tile then m-tile (moe_tile_at), CTA b takes b, b + grid, ...; kStages stages on
// full/empty mbarriers.
//
// Stage = 128 bytes of every operand row: k = 128 E4M3 (one weight scale block, one activation scale
// block) or k = 64 BF16. Both operands are K-major with the 128-byte swizzle (chunk c of row r at
// c ^ (r % 8)), read by wgmma through desc_k_sw128; A (the M side) = kBM weight rows of the expert,
// B (the N side) = kBN routed rows (mlp1: the tokens sorted_rows[i] / top_k, gathered from x; mlp2:
// consecutive rows of u in sorted order). The weights need no decode, so the producer's 128 threads
// copy both tiles with 16-byte cp.async (thread t: chunk t % 8 of rows t / 8 + 16 j; the sm_90 TMA
// cannot gather mlp1's scattered rows, and the weights share the same path), zero-filling the chunks
// past the end of a row (K = 2880 = 22.5 x 128: the last FP8 stage holds 64 real k and 64 zeros on
// both sides, so nothing is truncated and nothing spurious is added) and the rows past n_out (a
// partial m-tile) or past the tile's routed rows; FP8 stages also carry the kBN activation scales of
// their k-block (one 4-byte cp.async per routed row, zero past the tile). cp.async.mbarrier.arrive.noinc
// signals the stage.
//
// Consumers, per tile: the accumulators start from the bias (FP32, unscaled: the weights are real
// values). Consumer warpgroup cw owns weight rows [64 kMBlocks cw, + 64 kMBlocks) of the tile as
// kMBlocks m64 blocks; a warpgroup whose rows all lie past n_out only hands the stages back.
//   BF16: per stage 4 k16 steps x kMBlocks wgmma m64nNk16 (SS) accumulating into the FP32
//     accumulators, one commit, wait_group 1: the previous stage's MMAs are complete, so that stage
//     goes back to the producer (one group always queued, as the W4A16 SS consumers).
//   FP8 (W8A8): per stage 4 k32 steps x kMBlocks wgmma m64nNk32 e4m3 (SS) into a partial accumulator
//     set (the first step with scale-d 0 through an output-only wrapper: no zeroing, no earlier value
//     kept alive), one commit, then the promotion acc = fma(part · wmul, xs(routed row), acc) with wmul =
//     the weight block multiplier of the m-block's 128-row band at this k-block (kBM is a multiple of
//     128 and tiles start at multiples of kBM, so an m64 block lies in one band: one multiplier per
//     m-block and stage, read from global memory before the stage's barrier wait) and xs from the
//     stage's scales; the stage is released after its promotion. With two partial sets (kFp8Overlap:
//     variant 2) consecutive k-blocks alternate between them: after issuing block kt into set
//     kt % 2, wait_group 1 completes block kt - 1 only, which is promoted and released while the tensor
//     cores run kt (after the last block, wait_group 0 and its promotion); the k-loop is unrolled by two
//     so that both sets stay registers. With one set (variants 1, 3: two sets spill there), wait_group 0
//     before each promotion, so a warpgroup's MMAs stop during it and only the other warpgroup's cover
//     it. Either way each k-block's promotion is the same arithmetic in the same order.
// Epilogues (as W4A8's): mlp1 the clamped SwiGLU on the gate/up row pairs (lanes 4 apart) into u, bf16,
// natural columns; mlp2 y per routed row (f32, row sorted_rows[i]).
//
// Numerics. BF16: exact products, FP32 accumulation in the tensor core's order, u rounded to BF16.
// FP8: the weights are the checkpoint's E4M3 codes and multipliers exactly; the activations carry
// E4M3's rounding (moe_w4a8_quantize, natural order: amax / 448 per row and 128-k block, IEEE division,
// round to nearest even); the tensor core sums each k32 step's products with about 13 fraction bits
// of the largest term, a 128-k block at a time, then FP32 promotion; u is rounded to BF16 before its
// quantisation. kernels/cpu/w8a8_matmul.h is the CPU reference of this arithmetic.
//
// Variants (Variants below, $OSPREY_MOE_MATRIX_VARIANT): v0 256 x 128 tiles (kMBlocks 2, m64n128),
// 4 stages (49 KB each: A 32 KB, B 16 KB, scales); v1 128 x 128, 6 stages; v2 128 x 64 (m64n64), 8
// stages, for few routed rows per expert (decode, 120b below ~96 rows per expert); v3 256 x 64, 5
// stages. Shared memory 197-201 KB.
// Tests: tests/kernels/test_moe_matrix.cu (GPU, against the CPU references), scripts/emulate_moe_matrix.sh
// (this file's device code on the CPU emulation, wgmma groups completing at their wait or their commit).
#ifndef OSPREY_CUDA_EMULATION
#include "kernels/cuda/moe_mlp_matrix.h"
#include "kernels/cuda/mbarrier.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_mlp_w4a8.h"
#include "kernels/cuda/runtime.h"
#endif

#include <tuple>

#include "kernels/cuda/moe_gemm_sm90.cuh"

namespace osprey::cuda::matrix_gemm {

constexpr int kConsumerWGs = 2;
constexpr int kRowBytes = 128;  // bytes of every operand row per stage: 128 E4M3 k or 64 BF16 k
constexpr int kThreads = 128 * (1 + kConsumerWGs);
constexpr int kConsumerWarps = 4 * kConsumerWGs;
constexpr int kMaxExperts = 256;
// Registers per thread after setmaxnreg (the 384 x 168 allotted at launch), the same for every variant: the
// producer keeps 80 (it computes up to 24 chunk addresses per stage; ptxas spills 36-184 bytes at 40-72
// registers, 0-4 at 80) and the consumers 208 (at most 128 accumulators, or FP8's 64 + 2 x 32 with the
// two partial sets); FP8's 128 x 128 tiles with two sets would hold 64 + 2 x 64 (they spilled at 24/240: 5x
// slower on the H200, docs/fp8.md; removed).
template <int kMBlocks_, int kBN_, int kStages_, bool kFp8Overlap_>
struct Config {
    static constexpr int kMBlocks = kMBlocks_;                // wgmma m64 blocks per consumer warpgroup
    static constexpr int kBM = 64 * kMBlocks * kConsumerWGs;  // weight rows per tile (a multiple of 128)
    static constexpr int kBN = kBN_;                          // routed rows per tile (wgmma n)
    static constexpr int kStages = kStages_;
    static constexpr bool kFp8Overlap = kFp8Overlap_;         // FP8: two partial sets (promotion under the MMAs)
    static constexpr int kProducerRegs = 80, kConsumerRegs = 208;  // setmaxnreg (comment above)
    static constexpr int kAcc = kBN / 2;                      // accumulator registers per m-block
    static constexpr int kAStageBytes = kBM * kRowBytes;
    static constexpr int kBStageBytes = kBN * kRowBytes;
    static constexpr int kSStageBytes = kBN * 4;              // FP8: the stage's activation scales
    static constexpr int kStageBytes = (kAStageBytes + kBStageBytes + kSStageBytes + 1023) / 1024 * 1024;
    static_assert(kMBlocks == 1 || kMBlocks == 2);
    static_assert(kBN == 64 || kBN == 128);  // the SS wrappers of moe_gemm_sm90.cuh
    static_assert(kAStageBytes % 1024 == 0 && kBStageBytes % 1024 == 0);
    static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 384 * 168);
};

// FP8 keeps the partial accumulators beside the main ones (kMBlocks kBN / 2 registers per set), so it takes
// only the tiles with kMBlocks · kBN <= 128 (fp8_fits); BF16 takes every one.
// Two partial sets (kFp8Overlap) where ptxas keeps them without spilling in the k-loop at the default
// registers: variant 2 (64 + 2 x 32); variants 1 and 3 (64 + 2 x 64, 2 x (32 + 2 x 32)) spill 30-100
// LDL/STL per two k-blocks there, so they keep one set. Variant 2 with one set measured 3-4% slower
// than with two at 20b 1024 and 8192 tokens, level at 120b 1024 (H200, 2026-12-02, docs/fp8.md).
using Variants = std::tuple<Config<2, 128, 4, false>,                 // 0: 256 x 128 tiles (BF16 only; BF16's default from 96 routed rows per expert)
                            Config<1, 128, 6, false>,                 // 1: 128 x 128 tiles (FP8's default from 96 routed rows per expert)
                            Config<1, 64, 8, true>,                   // 2: 128 x 64 tiles (the default below 96 routed rows per expert)
                            Config<2, 64, 5, false>>;                 // 3: 256 x 64 tiles
constexpr int kVariants = int(std::tuple_size_v<Variants>);
template <int kVariant>
using Variant = std::tuple_element_t<kVariant, Variants>;
template <class Cfg>
constexpr bool fp8_fits = Cfg::kMBlocks * Cfg::kBN <= 128;

enum class Proj { mlp1, mlp2 };

struct Params {
    const uint8_t* w;             // [n_experts, n_out, row_bytes]: E4M3 codes or BF16
    const float* wscale;          // FP8: [n_experts, nb_out, n_kt] weight block multipliers
    const __nv_bfloat16* bias;    // [n_experts, n_out]
    const uint8_t* x;             // B rows [rows, row_bytes]: mlp1 tokens (gathered), mlp2 sorted rows
    const float* xs;              // FP8: [rows, n_kt] activation scales
    void* out;                    // mlp1: u [n_rows, n_out / 2] bf16 natural columns; mlp2: y [n_rows, n_out] f32
    const int32_t* offsets;       // [n_experts + 1]
    const int32_t* sorted_rows;   // [n_rows]
    int n_experts, top_k, n_in, n_out;
    int row_bytes;                // n_in x the element size
    int n_kt;                     // ceil(row_bytes / 128): stages per tile (FP8: the weight's k-blocks)
    int nb_out;                   // ceil(n_out / 128): the weight scale grid's rows per expert
    int m_tiles;
    float alpha, limit;
};

template <class Cfg>
constexpr size_t smem_bytes() {
    return 1024 + size_t(Cfg::kStages) * Cfg::kStageBytes;
}

template <class Cfg, bool kFp8, Proj kProj>
__global__ void __launch_bounds__(kThreads, 1) moe_matrix_kernel(const Params p) {
    constexpr int kMBlocks = Cfg::kMBlocks, kBM = Cfg::kBM, kBN = Cfg::kBN, kStages = Cfg::kStages;
    constexpr int kStageBytes = Cfg::kStageBytes, kAStageBytes = Cfg::kAStageBytes;
    constexpr int kBStageBytes = Cfg::kBStageBytes;
    pdl_enter();

    __shared__ mbar_t full[kStages], empty[kStages];
    __shared__ int tile_start[kMaxExperts + 1];
    uint8_t* const raw = dynamic_smem();
    uint8_t* const smem = raw + (1024 - smem_u32(raw) % 1024) % 1024;  // operand tiles must be 1024-aligned
    const int tid = threadIdx.x;

    if (tid < 32) {
        moe_count_tiles<kBN>(p, tile_start, tid);
        if (tid == 0) {
            for (int s = 0; s < kStages; ++s) {
                mbar_init(&full[s], 128);             // one cp.async arrival per producer thread
                mbar_init(&empty[s], kConsumerWarps);  // one arrival per consumer warp
            }
            mbar_init_fence();
        }
    }
    __syncthreads();
    const int n_tiles = tile_start[p.n_experts];
    const int wg = tid / 128;

    if (wg == 0) {
        // ---- producer: chunk c of A rows r0 + 16 j and of B rows r0 + 16 j; FP8: the scale of routed row tid ----
        setmaxnreg_dec<Cfg::kProducerRegs>();
        const int c = tid % 8, r0 = tid / 8;
        constexpr uint32_t kInvalid = 0xFFFFFFFFu;
        int it = 0;
        for (int t = blockIdx.x; t < n_tiles; t += gridDim.x) {
            const MoeTile tile = moe_tile_at<kBN, kBM>(p, tile_start, t);
            const int rows_w = min(kBM, p.n_out - tile.f0);
            // Weight row f0 + r0 of the expert; row r0 + 16 j is 16 j rows further.
            const uint8_t* const a_src = p.w + (size_t(tile.expert) * p.n_out + size_t(tile.f0 + r0)) * p.row_bytes;
            uint32_t x_row[kBN / 16];  // B source row of tile row r0 + 16 j, or kInvalid
#pragma unroll
            for (int j = 0; j < kBN / 16; ++j) {
                const int n = r0 + 16 * j;
                x_row[j] = kInvalid;
                if (n < tile.n_rows) {
                    const int sorted = tile.row0 + n;
                    x_row[j] = uint32_t(kProj == Proj::mlp1 ? p.sorted_rows[sorted] / p.top_k : sorted);
                }
            }
            uint32_t s_row = kInvalid;  // FP8: the scale row of routed row tid (kBN <= 128)
            if (kFp8 && tid < tile.n_rows) {
                const int sorted = tile.row0 + tid;
                s_row = uint32_t(kProj == Proj::mlp1 ? p.sorted_rows[sorted] / p.top_k : sorted);
            }
            for (int kt = 0; kt < p.n_kt; ++kt, ++it) {
                const int stage = it % kStages;
                mbar_wait(&empty[stage], ((it / kStages) & 1) ^ 1);
                uint8_t* const as = smem + stage * kStageBytes;
                uint8_t* const bs = as + kAStageBytes;
                const int k_byte = kt * kRowBytes + c * 16;
                const bool k_in = k_byte < p.row_bytes;  // chunks past the row's end (a partial last block): zeros
#pragma unroll
                for (int j = 0; j < kBM / 16; ++j) {
                    const int m = r0 + 16 * j;
                    const bool ok = m < rows_w && k_in;
                    cp_async16_zfill(as + m * kRowBytes + ((c ^ (m & 7)) << 4),
                                     ok ? a_src + size_t(16 * j) * p.row_bytes + k_byte : p.w, ok);
                }
#pragma unroll
                for (int j = 0; j < kBN / 16; ++j) {
                    const int n = r0 + 16 * j;
                    const bool ok = x_row[j] != kInvalid && k_in;
                    cp_async16_zfill(bs + n * kRowBytes + ((c ^ (n & 7)) << 4),
                                     p.x + (ok ? size_t(x_row[j]) * p.row_bytes + size_t(k_byte) : 0), ok);
                }
                if constexpr (kFp8) {
                    if (tid < kBN) {
                        const bool ok = s_row != kInvalid;
                        cp_async4_zfill(bs + kBStageBytes + 4 * tid, p.xs + (ok ? size_t(s_row) * p.n_kt + kt : 0), ok);
                    }
                }
                cp_async_mbar_arrive_noinc(&full[stage]);
            }
        }
        cp_async_wait_all();
        return;
    }

    // ---- consumers ----
    setmaxnreg_inc<Cfg::kConsumerRegs>();
    const int cw = wg - 1;
    const int wt = tid % 128;
    const int warp = wt / 32, lane = wt % 32;
    const int g = lane / 4, q = lane % 4;
    int it = 0;
    float acc[kMBlocks][Cfg::kAcc];
    // FP8: the partial sums of one k-block (two sets used alternately with kFp8Overlap) and the weight
    // block multipliers of each set's k-block.
    constexpr int kSets = kFp8 ? (Cfg::kFp8Overlap ? 2 : 1) : 1;
    float part[kSets][kFp8 ? kMBlocks : 1][kFp8 ? Cfg::kAcc : 1];
    float wmul[kSets][kMBlocks];
    const uint32_t a_off = uint32_t(64 * kMBlocks * cw * kRowBytes);  // this warpgroup's rows of the A tile

    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const MoeTile tile = moe_tile_at<kBN, kBM>(p, tile_start, t);
        const int e = tile.expert;
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb) {
            const int fa = tile.f0 + 64 * (kMBlocks * cw + mb) + 16 * warp + g;
            const bool ok = fa < p.n_out;  // n_out % 64 == 0: rows fa and fa + 8 are both valid or not
            const float ba = ok ? __bfloat162float(p.bias[size_t(e) * p.n_out + fa]) : 0.0f;
            const float bb = ok ? __bfloat162float(p.bias[size_t(e) * p.n_out + fa + 8]) : 0.0f;
#pragma unroll
            for (int i = 0; i < kBN / 8; ++i) {
                acc[mb][4 * i + 0] = ba, acc[mb][4 * i + 1] = ba;
                acc[mb][4 * i + 2] = bb, acc[mb][4 * i + 3] = bb;
            }
        }
        // A warpgroup whose rows all lie past n_out (a partial m-tile) only hands the stages back (a loop of
        // its own: a branch inside the MMA loop below makes ptxas serialise the wgmma, C7518).
        if (tile.f0 + 64 * kMBlocks * cw >= p.n_out) {  // uniform over the warpgroup
            for (int kt = 0; kt < p.n_kt; ++kt, ++it) {
                mbar_wait(&full[it % kStages], (it / kStages) & 1);
                __syncwarp();
                if (lane == 0) mbar_arrive(&empty[it % kStages]);
            }
            continue;
        }

        if constexpr (kFp8) {
            // k-block kt into one partial set, promoted into acc once its group is complete. kt_issue loads
            // the block's weight multipliers (before the barrier wait: the load's latency hides behind it),
            // waits for the stage and issues its 4 k32 steps x kMBlocks (scale-d 0 on the first: no zeroing),
            // one commit group; kt_promote adds the complete set (acc = fma(part · wmul, xs, acc)) and hands
            // the stage back. The ring position (stage, phase) advances by one per block issued.
            const float* wsrc[kMBlocks];  // the weight multipliers of each m-block's 128-row band, by k-block
            bool w_ok[kMBlocks];
#pragma unroll
            for (int mb = 0; mb < kMBlocks; ++mb) {
                const int f = tile.f0 + 64 * (kMBlocks * cw + mb);
                w_ok[mb] = f < p.n_out;
                wsrc[mb] = p.wscale + (size_t(e) * p.nb_out + size_t(f / 128)) * p.n_kt;
            }
            int stage = it % kStages;
            uint32_t phase = uint32_t(it / kStages) & 1u;
            auto kt_issue = [&](float (&ps)[kMBlocks][Cfg::kAcc], float (&wm)[kMBlocks], int kt) {
#pragma unroll
                for (int mb = 0; mb < kMBlocks; ++mb) wm[mb] = w_ok[mb] ? __ldg(wsrc[mb] + kt) : 0.0f;
                mbar_wait(&full[stage], phase);
                fence_proxy_async();
                const uint32_t stage_addr = smem_u32(smem + stage * kStageBytes);
                const uint32_t a_addr = stage_addr + a_off, b_addr = stage_addr + uint32_t(kAStageBytes);
                wgmma_fence();
#pragma unroll
                for (int mb = 0; mb < kMBlocks; ++mb)
                    wgmma_m64nNk32_e4m3_ss_set<kBN>(ps[mb], desc_k_sw128(a_addr + mb * 64 * kRowBytes), desc_k_sw128(b_addr));
#pragma unroll
                for (int s = 1; s < 4; ++s)
#pragma unroll
                    for (int mb = 0; mb < kMBlocks; ++mb)
                        wgmma_m64nNk32_e4m3_ss<kBN>(ps[mb], desc_k_sw128(a_addr + mb * 64 * kRowBytes + 32 * s),
                                                    desc_k_sw128(b_addr + 32 * s), 1);
                wgmma_commit();
                if (++stage == kStages) stage = 0, phase ^= 1u;
            };
            // The stage of the block issued `back` blocks ago (1 or 2).
            auto stage_back = [&](int back) { return stage >= back ? stage - back : stage - back + kStages; };
            auto kt_promote = [&](float (&ps)[kMBlocks][Cfg::kAcc], const float (&wm)[kMBlocks], int st) {
#pragma unroll
                for (int mb = 0; mb < kMBlocks; ++mb) fence_operands(ps[mb]);
                // ps[mb][4i + j]: weight row fa (j < 2) or fa + 8, tile row 8i + 2q + j % 2.
                const float* ss = reinterpret_cast<const float*>(smem + st * kStageBytes + kAStageBytes + kBStageBytes);
                // Two sets: the scales in chunks of kXsChunk column groups, a __syncwarp between chunks (ptxas
                // would otherwise load all kBN / 4 of them up front, more registers than the two sets leave).
                constexpr int kXsChunk = Cfg::kFp8Overlap ? 4 : kBN / 8;
#pragma unroll
                for (int i0 = 0; i0 < kBN / 8; i0 += kXsChunk) {
                    if (i0 > 0) __syncwarp();
#pragma unroll
                    for (int i = i0; i < i0 + kXsChunk; ++i) {
                        const float2 xs = *reinterpret_cast<const float2*>(ss + 8 * i + 2 * q);
#pragma unroll
                        for (int mb = 0; mb < kMBlocks; ++mb) {
                            acc[mb][4 * i + 0] = fmaf(ps[mb][4 * i + 0] * wm[mb], xs.x, acc[mb][4 * i + 0]);
                            acc[mb][4 * i + 1] = fmaf(ps[mb][4 * i + 1] * wm[mb], xs.y, acc[mb][4 * i + 1]);
                            acc[mb][4 * i + 2] = fmaf(ps[mb][4 * i + 2] * wm[mb], xs.x, acc[mb][4 * i + 2]);
                            acc[mb][4 * i + 3] = fmaf(ps[mb][4 * i + 3] * wm[mb], xs.y, acc[mb][4 * i + 3]);
                        }
                    }
                }
                __syncwarp();
                if (lane == 0) mbar_arrive(&empty[st]);
            };
            if constexpr (Cfg::kFp8Overlap) {
                // k-block kt in set kt % 2 (the loop is unrolled by two so that the sets are registers): after
                // issuing kt, wait_group 1 leaves kt's group in flight and completes kt - 1's, which is
                // promoted (and its stage released) while the tensor cores run kt.
                kt_issue(part[0], wmul[0], 0);
                int kt = 1;
                for (; kt + 1 < p.n_kt; kt += 2) {
                    kt_issue(part[1], wmul[1], kt);
                    wgmma_wait<1>();
                    kt_promote(part[0], wmul[0], stage_back(2));
                    kt_issue(part[0], wmul[0], kt + 1);
                    wgmma_wait<1>();
                    kt_promote(part[1], wmul[1], stage_back(2));
                }
                // kt - 1 (even, set 0) is the last block issued; kt = n_kt - 1 or n_kt.
                if (kt < p.n_kt) {
                    kt_issue(part[1], wmul[1], kt);
                    wgmma_wait<1>();
                    kt_promote(part[0], wmul[0], stage_back(2));
                    wgmma_wait<0>();
                    kt_promote(part[1], wmul[1], stage_back(1));
                } else {
                    wgmma_wait<0>();
                    kt_promote(part[0], wmul[0], stage_back(1));
                }
            } else {
                // One set: the warpgroup's tensor-core work stops during each promotion.
                for (int kt = 0; kt < p.n_kt; ++kt) {
                    kt_issue(part[0], wmul[0], kt);
                    wgmma_wait<0>();
                    kt_promote(part[0], wmul[0], stage_back(1));
                }
            }
            it += p.n_kt;
        } else {
            for (int kt = 0; kt < p.n_kt; ++kt, ++it) {
                const int stage = it % kStages;
                mbar_wait(&full[stage], (it / kStages) & 1);
                fence_proxy_async();
                const uint32_t stage_addr = smem_u32(smem + stage * kStageBytes);
                const uint32_t a_addr = stage_addr + a_off, b_addr = stage_addr + uint32_t(kAStageBytes);
                wgmma_fence();
#pragma unroll
                for (int mb = 0; mb < kMBlocks; ++mb) fence_operands(acc[mb]);
#pragma unroll
                for (int s = 0; s < 4; ++s)
#pragma unroll
                    for (int mb = 0; mb < kMBlocks; ++mb)
                        wgmma_m64nNk16_ss<kBN>(acc[mb], desc_k_sw128(a_addr + mb * 64 * kRowBytes + 32 * s),
                                               desc_k_sw128(b_addr + 32 * s));
                wgmma_commit();
                wgmma_wait<1>();  // the previous stage's MMAs are complete: release it
#pragma unroll
                for (int mb = 0; mb < kMBlocks; ++mb) fence_operands(acc[mb]);
                if (kt > 0) {
                    __syncwarp();
                    if (lane == 0) mbar_arrive(&empty[(it - 1) % kStages]);
                }
            }
            wgmma_wait<0>();
#pragma unroll
            for (int mb = 0; mb < kMBlocks; ++mb) fence_operands(acc[mb]);
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[(it - 1) % kStages]);
        }

        // Epilogue. acc[mb][4i + j]: weight row fa (j < 2) or fa + 8, tile row 8i + 2q + j % 2.
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb) {
            const int fa = tile.f0 + 64 * (kMBlocks * cw + mb) + 16 * warp + g, fb = fa + 8;
            if (fa >= p.n_out) continue;  // uniform over the warpgroup (n_out % 64 == 0)
            if constexpr (kProj == Proj::mlp1) {
                // Rows 2j (gate) and 2j + 1 (up) of unit j sit in lanes 4 apart: the even lane keeps
                // routed row 2q, the odd lane 2q + 1, after swapping the other half with its partner.
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

}  // namespace osprey::cuda::matrix_gemm

#ifndef OSPREY_CUDA_EMULATION
namespace osprey::cuda {

namespace {

namespace mm = matrix_gemm;

template <int... kV>
constexpr bool all_fit(std::integer_sequence<int, kV...>) {
    return ((mm::smem_bytes<mm::Variant<kV>>() <= size_t(kMoeGemmMaxSmemBytes)) && ...);
}
static_assert(all_fit(std::make_integer_sequence<int, mm::kVariants>{}));

template <typename F>
void with_variant(int variant, F&& f) {
    [&]<int... kV>(std::integer_sequence<int, kV...>) {
        dispatch_int<kV...>("OSPREY_MOE_MATRIX_VARIANT", variant,
                            [&]<int kVariant>() { f.template operator()<mm::Variant<kVariant>>(); });
    }(std::make_integer_sequence<int, mm::kVariants>{});
}

template <class Cfg, bool kFp8, mm::Proj kProj>
void launch_gemm(const mm::Params& p, int n_rows, cudaStream_t stream) {
    auto kernel = mm::moe_matrix_kernel<Cfg, kFp8, kProj>;
    const size_t smem = mm::smem_bytes<Cfg>();
    // Once per thread and kernel (each rank of a parallel layout drives its GPU from its own thread).
    thread_local const int n_sms = moe_gemm_prepare_device(reinterpret_cast<const void*>(kernel));
    // Upper bound of the tile count: Σ_e ceil(rows_e / kBN) <= rows / kBN + active experts, times m-tiles.
    const int64_t max_tiles = (int64_t(n_rows) / Cfg::kBN + std::min(p.n_experts, n_rows)) * p.m_tiles;
    const int grid = int(std::min<int64_t>(n_sms, max_tiles));
    cuda::launch(kernel, dim3(grid), dim3(mm::kThreads), smem, stream, p);
    CUDA_CHECK(cudaGetLastError());
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }
int n_kb(int n) { return (n + 127) / 128; }

// $OSPREY_MOE_MATRIX_VARIANT, read once: -1 when unset.
int env_variant() {
    static const int variant = [] {
        const char* v = std::getenv("OSPREY_MOE_MATRIX_VARIANT");
        if (v == nullptr || *v == '\0') return -1;
        char* end = nullptr;
        const long n = std::strtol(v, &end, 10);
        OSPREY_CHECK(*end == '\0' && n >= 0 && n < mm::kVariants, "OSPREY_MOE_MATRIX_VARIANT = '", v,
                     "': expected 0..", mm::kVariants - 1);
        return int(n);
    }();
    return variant;
}

}  // namespace

const char* matrix_format_name(MatrixFormat f) { return f == MatrixFormat::fp8 ? "fp8" : "bf16"; }

int moe_matrix_variants() { return mm::kVariants; }

bool moe_matrix_variant_takes(MatrixFormat format, int variant) {
    if (variant < 0 || variant >= mm::kVariants) return false;
    bool ok = true;
    with_variant(variant, [&]<class Cfg>() { ok = format == MatrixFormat::bf16 || mm::fp8_fits<Cfg>; });
    return ok;
}

int moe_matrix_variant_for(MatrixFormat format, int n_tokens, int top_k, int n_experts) {
    if (env_variant() >= 0) return env_variant();
    // Not yet measured: 64-row token tiles below 96 routed rows per expert (decode, 120b at 1024 tokens),
    // where 128-row tiles would be mostly empty; else the largest tile the format takes.
    if (int64_t(n_tokens) * top_k < int64_t(96) * n_experts) return 2;
    return format == MatrixFormat::fp8 ? 1 : 0;
}

bool moe_matrix_supports(int d_model, int d_ff) {
    return d_model > 0 && d_ff > 0 && d_model % 64 == 0 && d_ff % 64 == 0;
}

size_t moe_matrix_workspace_bytes(MatrixFormat format, int n_tokens, int top_k, int d_model, int d_ff) {
    if (format != MatrixFormat::fp8) return 0;
    const size_t rows = size_t(n_tokens) * top_k;
    return align256(size_t(n_tokens) * d_model) + align256(size_t(n_tokens) * n_kb(d_model) * 4) +
           align256(rows * d_ff) + align256(rows * n_kb(d_ff) * 4);
}

void moe_matrix(const MoeMatrixArgs& a, cudaStream_t stream) {
    OSPREY_CHECK(moe_matrix_supports(a.d_model, a.d_ff), "moe matrix experts: unsupported widths d_model = ",
                 a.d_model, ", d_ff = ", a.d_ff, " (multiples of 64)");
    OSPREY_CHECK(a.n_experts > 0 && a.n_experts <= mm::kMaxExperts, "moe matrix experts: n_experts = ", a.n_experts);
    const bool fp8 = a.format == MatrixFormat::fp8;
    OSPREY_CHECK(a.y && a.u && a.x && a.expert_offsets && a.sorted_rows && a.mlp1.w && a.mlp1.bias && a.mlp2.w &&
                     a.mlp2.bias && (!fp8 || (a.workspace && a.mlp1.scale && a.mlp2.scale)),
                 "moe matrix experts (", matrix_format_name(a.format), "): null argument");
    OSPREY_CHECK(a.n_tokens >= 0 && a.top_k > 0, "moe matrix experts: n_tokens = ", a.n_tokens, ", top_k = ", a.top_k);
    const int n_rows = a.n_tokens * a.top_k;
    if (n_rows == 0) return;
    const int variant = a.variant >= 0 ? a.variant : moe_matrix_variant_for(a.format, a.n_tokens, a.top_k, a.n_experts);
    OSPREY_CHECK(moe_matrix_variant_takes(a.format, variant), "moe matrix experts: variant ", variant, " does not take ",
                 matrix_format_name(a.format), " weights (0..", mm::kVariants - 1, ": FP8 takes tiles of at most 128 x 128 or 256 x 64)");
    const int elem = fp8 ? 1 : 2;
    const uint8_t* x1 = reinterpret_cast<const uint8_t*>(a.x);
    const uint8_t* x2 = reinterpret_cast<const uint8_t*>(a.u);
    const float *xs1 = nullptr, *xs2 = nullptr;
    uint8_t *xq = nullptr, *uq = nullptr;
    float *xs = nullptr, *us = nullptr;
    if (fp8) {
        uint8_t* base = static_cast<uint8_t*>(a.workspace);
        xq = base;
        base += align256(size_t(a.n_tokens) * a.d_model);
        xs = reinterpret_cast<float*>(base);
        base += align256(size_t(a.n_tokens) * n_kb(a.d_model) * 4);
        uq = base;
        base += align256(size_t(n_rows) * a.d_ff);
        us = reinterpret_cast<float*>(base);
        x1 = xq, xs1 = xs, x2 = uq, xs2 = us;
        moe_w4a8_quantize(xq, xs, a.x, a.n_tokens, a.d_model, stream, /*mma_order=*/false);
    }
    with_variant(variant, [&]<class Cfg>() {
        const mm::Params p1{static_cast<const uint8_t*>(a.mlp1.w), a.mlp1.scale,
                            reinterpret_cast<const __nv_bfloat16*>(a.mlp1.bias), x1, xs1, a.u, a.expert_offsets,
                            a.sorted_rows, a.n_experts, a.top_k, a.d_model, 2 * a.d_ff, a.d_model * elem,
                            n_kb(a.d_model * elem), n_kb(2 * a.d_ff), (2 * a.d_ff + Cfg::kBM - 1) / Cfg::kBM,
                            a.swiglu_alpha, a.swiglu_limit};
        if constexpr (mm::fp8_fits<Cfg>) {
            if (fp8) return launch_gemm<Cfg, true, mm::Proj::mlp1>(p1, n_rows, stream);
        }
        launch_gemm<Cfg, false, mm::Proj::mlp1>(p1, n_rows, stream);
    });
    if (fp8) moe_w4a8_quantize(uq, us, a.u, n_rows, a.d_ff, stream, /*mma_order=*/false);
    with_variant(variant, [&]<class Cfg>() {
        const mm::Params p2{static_cast<const uint8_t*>(a.mlp2.w), a.mlp2.scale,
                            reinterpret_cast<const __nv_bfloat16*>(a.mlp2.bias), x2, xs2, a.y, a.expert_offsets,
                            a.sorted_rows, a.n_experts, a.top_k, a.d_ff, a.d_model, a.d_ff * elem,
                            n_kb(a.d_ff * elem), n_kb(a.d_model), (a.d_model + Cfg::kBM - 1) / Cfg::kBM,
                            a.swiglu_alpha, a.swiglu_limit};
        if constexpr (mm::fp8_fits<Cfg>) {
            if (fp8) return launch_gemm<Cfg, true, mm::Proj::mlp2>(p2, n_rows, stream);
        }
        launch_gemm<Cfg, false, mm::Proj::mlp2>(p2, n_rows, stream);
    });
}

}  // namespace osprey::cuda
#endif  // OSPREY_CUDA_EMULATION
