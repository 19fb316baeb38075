// The mid-batch MoE projections (see moe_mid.h for the contract and the outline).
//
// Kernels:
//   gather_kernel: sorted row p = sorted_rows[p] (t * 4 + slot), h[t] -> tile layout (moe_mid_act_index),
//                  zeros past d_model. One thread per 16-byte unit.
//   moe_mid_kernel<mlp1 | mlp2>: persistent, one CTA per SM: kConsumerWarps consumer warps and one
//                  producer warp.
//
// Work split. Every CTA reads expert_offsets and builds the same item table: expert e with n_e routed
// rows has ceil(n_e / kTok) token blocks x ceil(n_out / 128) row tiles, numbered expert-major,
// then row tile, then token block. CTA b takes items [N b / grid, N (b + 1) / grid): each item
// streams 128 rows x n_in of one expert (the last row tile may be shorter), so the weight bytes per
// CTA are equal to within one item, whatever the routing. Items of one expert with several token
// blocks follow each other, so the repeated rows come from L2 (typically the same CTA, one item
// later).
//
// Variants (template <kTok, kMul>, moe_mid.h): kTok routed rows per item (accumulators: kTok / 8
// n-tiles), kMul k-blocks of 256 inputs per ring stage; the numbers below are for variant 0 <64, 1>.
//
// Pipeline. Per item the producer warp copies the item's scales [rows][n_groups] and biases [rows]
// into one of two item slots (ifull / iempty barriers), then for each k-block of 256 inputs fills a
// ring stage (full / empty barriers, kStages deep) with
//   - weights: one cp.async.bulk per weight row (32 lanes issue them), 8 groups x 16 B = 128 B per
//     row (fewer in the last k-block when n_in is not a multiple of 256), stage layout [128][128 B];
//   - activations: one cp.async.bulk of the item's [n rows][512 B] (the tile layout keeps each
//     expert's rows contiguous inside a k-block), L2 evict_last: every row tile of the expert reads
//     them again.
// mlp2's producer issues its first weight copies before waiting for mlp1 (griddepcontrol.wait),
// so its ring starts filling while mlp1 drains.
// The row copies read 128 B every 1440 B (20b / 120b rows): scattered over DRAM pages. Unless
// $OSPREY_MOE_MID_PREFETCH=0, the producer first asks L2 for the item's whole row range (one
// contiguous run of 128 rows x n_in / 2 bytes, ~184 KB; 132 SMs keep ~24 MB of L2 busy with it) with
// one cp.async.bulk.prefetch.L2, so that HBM is read in order and the row copies hit L2. Which is
// faster is for the H200 to say (bench_moe_decode ... mid, with and without the variable).
//
// Compute. Consumer warp w owns rows 16w..16w+15 of the item (idle if the item has fewer rows) and
// every token of it: acc[n-tile][4] for up to kTok / 8 n-tiles, summed over the whole K in one
// fixed order (no split-K, deterministic). Per k-step (128 inputs = 4 MXFP4 groups), lane (g, c):
//   - 2 ld.shared.v4 (rows g and g + 8 of group c: 32 weights each) + 2 scale bytes;
//   - decode to 4 x 2 BF16x2 per quad i (moe_fp4.cuh: and, imad, and, mul.bf16x2 per pair);
//   - per n-tile: 1 ld.shared.v4 of B (token g of the n-tile, the quad-i unit of group c, already
//     in the pair order of the decode) and 2 mma.sync m16n8k16.
// Instruction budget per KB of weights (one warp k-step, 16 rows x 128 inputs), nt = n-tiles:
//   decode ~136 (8 words x 17) + ~12 loads/scales/addressing + nt x (4 ld.shared + 8 mma + ~4)
//   = ~150 + 16 nt warp-instructions: nt = 1..2 (20b batch 64-128, 120b batch 128) ~170-180 per KB.
// The H200 issues 4 warp-instructions per clock per SM (integer ALU ops at half that); at 55% of
// 4.64 TB/s an SM must retire ~11 B/clock (1.755 GHz), i.e. ~370 issue slots per KB: ~45-50% of
// the issue rate with ~80 ALU ops per KB (~2 per clock needed: 40 clocks of the 93). Shared memory
// per KB of weights: 1 KB written by the bulk copies + 1 KB of A reads (2-way bank conflict: the
// rows are 128 B apart, ~2 KB of wavefronts) + nt x 2 KB of B reads: ~7 KB at nt = 2, ~60% of the
// 128 B/clock at 11 B/clock of weights. Expected (not measured): 55-65% of 4.64 TB/s at 20b
// batch 32-128 and 120b batch 64-128; lower at 120b batch 16 (~60% of a k-block's stage holds
// activations nobody needs, and few rows per expert); skewed experts with 64+ routed rows become
// mma / shared-memory bound on their own items only.
//
// FP4 decode cost: at 9-128 tokens the lever is reuse, not a cheaper decode: each weight is decoded
// once per item and feeds nt n-tiles (moe_decode decodes it for 8 token columns at most). Cheaper
// per-nibble schemes considered: an 8-entry prmt lookup gives the magnitude bytes in 2 ops per 4
// nibbles but the sign and the second byte of each BF16 cost 2 more per pair (no gain over and /
// imad / and); adding the E8M0 scale to the exponent field instead of mul.bf16x2 breaks the FP4
// subnormal 0.5 and zero; scaling each group's partial sum instead needs the 4 lanes of an mma on
// one group and 4 FFMA per n-tile per group (a loss from nt = 2). FP8 (e4m3) weights and
// activations would halve the decode but change the numerics (the W4A8 work of issue 13).
//
// scripts/emulate_moe_mid.sh runs this file's device code on the CPU (tests/kernels/emu): the parts
// under #ifndef OSPREY_CUDA_EMULATION are what the emulation replaces (PTX, launches).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/moe_fp4.cuh"
#include "kernels/cuda/moe_mid.h"
#include "kernels/cuda/moe_route.h"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kTopK = 4;
constexpr int kConsumerWarps = 8;
constexpr int kWarps = kConsumerWarps + 1;
constexpr int kProducerWarp = kConsumerWarps;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileRows = 16 * kConsumerWarps;  // weight rows per item (one m-tile per warp)
constexpr int kKb = 256;                        // inputs per k-block of the tile layout (moe_mid_act_index)
constexpr int kKbGroups = kKb / 32;
constexpr int kActRowBytes = kKb * 2;  // one activation row of a k-block
constexpr int kRingBytes = 192 * 1024;
constexpr int kMaxPerLane = (kMoeMaxExperts + 31) / 32;

// A variant (MoeMidArgs::variant, $OSPREY_MOE_MID_VARIANT): kTok routed rows per item, kMul k-blocks
// of 256 inputs per ring stage (weight row copies of 128 kMul bytes).
template <int kTok, int kMul>
struct Cfg {
    static constexpr int kNt = kTok / 8;                                 // n-tiles per item
    static constexpr int kStageGroups = kKbGroups * kMul;                // MXFP4 groups per stage and row
    static constexpr int kWRowBytes = kStageGroups * 16;                 // one weight row of a stage
    static constexpr int kStageW = kTileRows * kWRowBytes;               // 16 KB per k-block
    static constexpr int kActBlockBytes = kTok * kActRowBytes;           // one k-block of the activation tile
    static constexpr int kStageBytes = kStageW + kMul * kActBlockBytes;  // 48 KB for <64, 1>
    static constexpr int kStages = kRingBytes / kStageBytes < 8 ? kRingBytes / kStageBytes : 8;
    static_assert(kTok % 8 == 0 && kTok >= 8 && kTok <= 128, "token block: whole n-tiles");
    static_assert(kMul == 1 || kMul == 2, "stage: one or two k-blocks");
    static_assert(kStages >= 2, "ring too shallow");
};
// The variants, by index: 0 <64, 1> (default), 1 <32, 2>, 2 <16, 1>, 3 <16, 2>.
constexpr int kVariants = 4;

enum class Proj { mlp1, mlp2 };

struct Params {
    const uint8_t* blocks;       // [n_experts, n_out, n_groups, 16]
    const uint8_t* scales;       // [n_experts, n_out, n_groups]
    const __nv_bfloat16* bias;   // [n_experts, n_out]
    const int32_t* offsets;      // [n_experts + 1]
    const int32_t* sorted_rows;  // [n_rows]
    const uint8_t* act;          // activation tiles [n_kb][n_rows][512 B] (moe_mid_act_index)
    __nv_bfloat16* u;            // mlp1: u tiles (moe_mid_act_index, n_out / 2 columns)
    float* y;                    // mlp2: [n_rows, n_out] by routed row t * 4 + slot
    int n_rows, n_experts, n_in, n_out, n_groups, n_kb, n_mt;
    int item_bytes;   // one item slot: scales [128][n_groups] (to 128 B), then biases [128]
    int bias_offset;  // of the biases inside an item slot
    int prefetch;     // 1: prefetch each item's weight rows into L2 when it starts (see below)
    float alpha, limit;
};

struct Table {
    int start[kMoeMaxExperts + 1];   // first item of expert e (non-decreasing); start[n_experts] = total
    int offset[kMoeMaxExperts + 1];  // expert_offsets
};

struct Item {
    int e, mt, p0, n, rows;  // expert, row tile, first sorted row, routed rows (1..kTok), weight rows
};

// Fills t for the whole CTA (ends with __syncthreads).
template <int kTokBlock>
__device__ void build_table(const Params& p, Table& t) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (warp == 0) {
        const int per = (p.n_experts + 31) / 32;
        int items[kMaxPerLane], sum = 0;
#pragma unroll
        for (int k = 0; k < kMaxPerLane; ++k) {
            const int e = lane * per + k;
            items[k] = 0;
            if (k < per && e < p.n_experts) {
                const int o0 = p.offsets[e], o1 = p.offsets[e + 1];
                t.offset[e] = o0;
                items[k] = (o1 - o0 + kTokBlock - 1) / kTokBlock * p.n_mt;
                sum += items[k];
            }
        }
        int incl = sum;
        for (int d = 1; d < 32; d *= 2) {
            const int v = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += v;
        }
        int run = incl - sum;
#pragma unroll
        for (int k = 0; k < kMaxPerLane; ++k) {
            const int e = lane * per + k;
            if (k < per && e < p.n_experts) t.start[e] = run, run += items[k];
        }
        if (lane == 31) t.start[p.n_experts] = incl, t.offset[p.n_experts] = p.offsets[p.n_experts];
    }
    __syncthreads();
}

template <int kTokBlock>
__device__ Item item_at(const Params& p, const Table& t, int idx) {
    int lo = 0, hi = p.n_experts - 1;  // the last expert whose first item is <= idx (it has items)
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (t.start[mid] <= idx) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Item it;
    it.e = lo;
    const int count = t.offset[lo + 1] - t.offset[lo];
    const int n_tb = (count + kTokBlock - 1) / kTokBlock;
    const int local = idx - t.start[lo];
    it.mt = local / n_tb;
    const int tb = local - it.mt * n_tb;
    it.p0 = t.offset[lo] + tb * kTokBlock;
    it.n = min(kTokBlock, count - tb * kTokBlock);
    it.rows = min(kTileRows, p.n_out - it.mt * kTileRows);
    return it;
}

// One k-step (4 groups from g0) of a consumer lane: rows r0 and r0 + 8 of the stage, every n-tile.
// kPartial: the k-step runs past n_groups (lanes c with group >= n_groups use zero weights and zero
// activations: the tile padding is never read as a number).
// w: the stage's weights [128 rows][C::kWRowBytes]; act: the k-block's activation rows [kTok][512 B];
// s2: the k-step within the stage (0 .. 2 kMul - 1).
template <class C, bool kPartial>
__device__ __forceinline__ void mid_step(const uint8_t* w, const uint8_t* act, const uint8_t* sc, int n_groups, int r0,
                                         int s2, int g0, int p0, int nt, float (&acc)[C::kNt][4]) {
    constexpr int kNt = C::kNt, kWRowBytes = C::kWRowBytes;
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int group = g0 + c;
    const bool valid = !kPartial || group < n_groups;
    uint4 wa = make_uint4(0u, 0u, 0u, 0u), wb = wa;
    uint32_t sa = 0u, sb = 0u;
    if (valid) {
        wa = ld_shared16(w + r0 * kWRowBytes + (s2 * 4 + c) * 16);
        wb = ld_shared16(w + (r0 + 8) * kWRowBytes + (s2 * 4 + c) * 16);
        sa = sc[r0 * n_groups + group];
        sb = sc[(r0 + 8) * n_groups + group];
    }
    const uint32_t sa2 = (sa + kScaleExponentBias) * 0x00800080u;
    const uint32_t sb2 = (sb + kScaleExponentBias) * 0x00800080u;
    const uint32_t wav[4] = {wa.x, wa.y, wa.z, wa.w};
    const uint32_t wbv[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint32_t ra[4], rb[4];
        decode_fp4x8(wav[i], sa2, ra);
        decode_fp4x8(wbv[i], sb2, rb);
#pragma unroll
        for (int n = 0; n < kNt; ++n) {
            if (n < nt) {                  // uniform across the warp
                const int tr = n * 8 + g;  // token row of the item
                const int unit = ((s2 & 1) * 16 + i * 4 + c) ^ (((p0 + tr) & 1) << 2);
                uint4 x = ld_shared16(act + tr * kActRowBytes + unit * 16);
                if (kPartial && !valid) x = make_uint4(0u, 0u, 0u, 0u);
                // A: a0 = (row g, pair 0), a1 = (row g + 8, pair 0), a2 = (row g, pair 1), a3 = (row g + 8, pair 1).
                mma_bf16(acc[n], ra[0], rb[0], ra[1], rb[1], x.x, x.y);
                mma_bf16(acc[n], ra[2], rb[2], ra[3], rb[3], x.z, x.w);
            }
        }
    }
}

// mlp1: u of rows (fa, fa + 8) (gate / up interleaved: unit fa / 2 pairs lanes g and g ^ 1) for every
// valid token; mlp2: y of the routed rows.
template <Proj kProj, int kNt>
__device__ void epilogue(const Params& p, const Item& it, int r0, const float (&acc)[kNt][4], float bias_a,
                         float bias_b) {
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int fa = it.mt * kTileRows + r0, fb = fa + 8;  // weight rows of expert it.e
    const int nt = (it.n + 7) / 8;
#pragma unroll
    for (int n = 0; n < kNt; ++n) {
        if (n >= nt) break;  // uniform
        const float va0 = acc[n][0] * kUnscale + bias_a, va1 = acc[n][1] * kUnscale + bias_a;
        const float vb0 = acc[n][2] * kUnscale + bias_b, vb1 = acc[n][3] * kUnscale + bias_b;
        if constexpr (kProj == Proj::mlp1) {
            const bool even = (g & 1) == 0;
            const float a_other = __shfl_xor_sync(0xffffffffu, even ? va1 : va0, 4);
            const float b_other = __shfl_xor_sync(0xffffffffu, even ? vb1 : vb0, 4);
            const int tok = n * 8 + 2 * c + (even ? 0 : 1);
            if (tok < it.n) {
                const float ua = even ? swiglu(va0, a_other, p.alpha, p.limit) : swiglu(a_other, va1, p.alpha, p.limit);
                const float ub = even ? swiglu(vb0, b_other, p.alpha, p.limit) : swiglu(b_other, vb1, p.alpha, p.limit);
                const int row = it.p0 + tok;
                p.u[moe_mid_act_index(row, fa >> 1, p.n_rows)] = __float2bfloat16_rn(ua);
                p.u[moe_mid_act_index(row, fb >> 1, p.n_rows)] = __float2bfloat16_rn(ub);
            }
        } else {
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const int tok = n * 8 + 2 * c + k;
                if (tok < it.n) {
                    float* y = p.y + size_t(p.sorted_rows[it.p0 + tok]) * p.n_out;
                    y[fa] = k ? va1 : va0;
                    y[fb] = k ? vb1 : vb0;
                }
            }
        }
    }
}

template <Proj kProj, int kTok, int kMul>
__global__ void __launch_bounds__(kThreads, 1) moe_mid_kernel(const Params p) {
    using C = Cfg<kTok, kMul>;
    constexpr int kStages = C::kStages, kStageBytes = C::kStageBytes, kStageW = C::kStageW;
    extern __shared__ __align__(128) uint8_t smem[];  // [kStages][kStageBytes] ring, then [2][item_bytes]
    __shared__ Table table;
    __shared__ mbar_t full[kStages], empty[kStages];  // the k-block ring
    __shared__ mbar_t ifull[2], iempty[2];            // the item slots (scales, biases)
    if constexpr (kProj == Proj::mlp1) {
        griddep_wait();               // the grouping and the gathered activations are complete
        griddep_launch_dependents();  // mlp2 may launch now (it starts streaming weights when it lands)
    }
    // mlp2 reads expert_offsets before its wait: complete before mlp1 passed its own wait.
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], kConsumerWarps);
        for (int s = 0; s < 2; ++s) mbar_init(&ifull[s], 1), mbar_init(&iempty[s], kConsumerWarps);
        mbar_init_fence();
    }
    build_table<kTok>(p, table);  // ends with __syncthreads
    const int n_items = table.start[p.n_experts];
    const int first = int(int64_t(n_items) * blockIdx.x / gridDim.x);
    const int last = int(int64_t(n_items) * (blockIdx.x + 1) / gridDim.x);
    uint8_t* slots = smem + size_t(kStages) * kStageBytes;

    if (warp == kProducerWarp) {
        const uint64_t w_policy = evict_first_policy(), a_policy = evict_last_policy();
        bool waited = kProj == Proj::mlp1;
        int k = 0;  // stages filled so far
        for (int idx = first, ii = 0; idx < last; ++idx, ++ii) {
            const Item it = item_at<kTok>(p, table, idx);
            const size_t row0 = size_t(it.e) * p.n_out + size_t(it.mt) * kTileRows;
            const int is = ii & 1;
            if (ii >= 2) mbar_wait(&iempty[is], uint32_t((ii >> 1) - 1) & 1u);
            uint8_t* slot = slots + size_t(is) * p.item_bytes;
            if (lane == 0) {
                if (p.prefetch)  // the item's rows are one contiguous run: let L2 fetch it in order
                    bulk_prefetch_l2(p.blocks + row0 * p.n_groups * 16, uint32_t(it.rows * p.n_groups * 16));
                const uint32_t sc_bytes = uint32_t(it.rows * p.n_groups), b_bytes = uint32_t(it.rows * 2);
                mbar_arrive_expect_tx(&ifull[is], sc_bytes + b_bytes);
                bulk_copy(slot, p.scales + row0 * p.n_groups, sc_bytes, &ifull[is], w_policy);
                bulk_copy(slot + p.bias_offset, p.bias + row0, b_bytes, &ifull[is], w_policy);
            }
            const int n_stages = (p.n_kb + kMul - 1) / kMul;
            for (int b = 0; b < n_stages; ++b, ++k) {
                const int s = k % kStages;
                if (k >= kStages) mbar_wait(&empty[s], uint32_t(k / kStages - 1) & 1u);
                const int gw = min(C::kStageGroups, p.n_groups - b * C::kStageGroups);
                const int n_blocks = min(kMul, p.n_kb - b * kMul);  // activation k-blocks of the stage
                uint8_t* st = smem + size_t(s) * kStageBytes;
                if (lane == 0)
                    mbar_arrive_expect_tx(&full[s], uint32_t(it.rows * gw * 16 + n_blocks * it.n * kActRowBytes));
                __syncwarp();
                for (int r = lane; r < it.rows; r += 32)
                    bulk_copy(st + r * C::kWRowBytes,
                              p.blocks + ((row0 + r) * p.n_groups + size_t(b) * C::kStageGroups) * 16,
                              uint32_t(gw * 16), &full[s], w_policy);
                if (lane == 0) {
                    if (!waited) griddep_wait(), waited = true;  // mlp2: u is mlp1's until now
                    for (int m = 0; m < n_blocks; ++m)
                        bulk_copy(st + kStageW + m * C::kActBlockBytes,
                                  p.act + (size_t(b * kMul + m) * p.n_rows + it.p0) * kActRowBytes,
                                  uint32_t(it.n * kActRowBytes), &full[s], a_policy);
                }
            }
        }
        return;
    }

    // Consumers.
    if constexpr (kProj == Proj::mlp2) griddep_wait();  // y may still be read by earlier kernels until now
    const int g = lane / 4;
    const int r0 = warp * 16 + g;  // this lane's weight rows of an item: r0 and r0 + 8
    int k = 0;
    for (int idx = first, ii = 0; idx < last; ++idx, ++ii) {
        const Item it = item_at<kTok>(p, table, idx);
        const int is = ii & 1;
        mbar_wait(&ifull[is], uint32_t(ii >> 1) & 1u);
        const uint8_t* sc = slots + size_t(is) * p.item_bytes;  // [rows][n_groups]
        const bool active = warp * 16 < it.rows;                // uniform
        const int nt = (it.n + 7) / 8;
        float acc[C::kNt][4];
#pragma unroll
        for (int n = 0; n < C::kNt; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
        const int n_stages = (p.n_kb + kMul - 1) / kMul;
        for (int b = 0; b < n_stages; ++b, ++k) {
            const int s = k % kStages;
            mbar_wait(&full[s], uint32_t(k / kStages) & 1u);
            if (active) {
                const uint8_t* st = smem + size_t(s) * kStageBytes;
#pragma unroll
                for (int s2 = 0; s2 < 2 * kMul; ++s2) {
                    const int g0 = b * C::kStageGroups + s2 * 4;
                    const uint8_t* act = st + kStageW + (s2 / 2) * C::kActBlockBytes;
                    if (g0 < p.n_groups) {  // uniform
                        if (g0 + 4 <= p.n_groups) {
                            mid_step<C, false>(st, act, sc, p.n_groups, r0, s2, g0, it.p0, nt, acc);
                        } else {
                            mid_step<C, true>(st, act, sc, p.n_groups, r0, s2, g0, it.p0, nt, acc);
                        }
                    }
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[s]);  // this warp's reads of the stage are done
        }
        if (active) {
            const __nv_bfloat16* bias = reinterpret_cast<const __nv_bfloat16*>(sc + p.bias_offset);
            epilogue<kProj, C::kNt>(p, it, r0, acc, __bfloat162float(bias[r0]), __bfloat162float(bias[r0 + 8]));
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&iempty[is]);  // this warp is done with the item's scales and biases
    }
}

// h rows in sorted order into the tile layout: one thread per 16-byte unit (kb, p, unit).
__global__ void gather_kernel(uint4* x, const __nv_bfloat16* h, const int32_t* sorted_rows, int n_rows, int n_kb,
                              int d_model) {
    griddep_wait();  // sorted_rows (moe_group_by_expert) and h are complete; x may be read until now
    const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id >= int64_t(n_kb) * n_rows * 32) return;
    const int phys = int(id % 32);
    const int p = int(id / 32 % n_rows);
    const int b = int(id / 32 / n_rows);
    const int unit = phys ^ ((p & 1) << 2);
    const int s = unit / 16, i = (unit / 4) % 4, c = unit % 4;
    const int j0 = b * kKb + (s * 4 + c) * 32 + 8 * i;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (j0 < d_model) {
        const int t = sorted_rows[p] / kTopK;
        const uint4 q = ld_act16(h + size_t(t) * d_model + j0);
        // (e0 e1)(e2 e3)(e4 e5)(e6 e7) -> (e0 e4)(e1 e5)(e2 e6)(e3 e7)
        v.x = __byte_perm(q.x, q.z, 0x5410), v.y = __byte_perm(q.x, q.z, 0x7632);
        v.z = __byte_perm(q.y, q.w, 0x5410), v.w = __byte_perm(q.y, q.w, 0x7632);
    }
    x[id] = v;
}

size_t align256(size_t n) {
    return (n + 255) / 256 * 256;
}
int n_kblocks(int n_in) {
    return (n_in + kKb - 1) / kKb;
}

// Workspace: u tiles at 0, then the gathered h tiles (both for n_rows = 4 n_tokens rows).
struct Layout {
    size_t u, x, total;
};
Layout layout(int n_tokens, int d_model, int d_ff) {
    const size_t rows = size_t(n_tokens) * kTopK;
    Layout l{};
    l.u = 0;
    l.x = align256(size_t(n_kblocks(d_ff)) * rows * kActRowBytes);
    l.total = l.x + align256(size_t(n_kblocks(d_model)) * rows * kActRowBytes);
    return l;
}

bool aligned16(const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

bool shape_ok(int n_experts, int d_model, int d_ff, int top_k) {
    return top_k == kTopK && n_experts >= kTopK && n_experts <= kMoeMaxExperts && d_model > 0 && d_model % 32 == 0 &&
           d_ff > 0 && d_ff % 32 == 0 && d_model <= 3072 && d_ff <= 3072;
}

void check_args(const MoeMidArgs& a) {
    OSPREY_CHECK(a.n_tokens >= 0 && a.n_tokens <= a.max_tokens, "moe_mid: n_tokens = ", a.n_tokens,
                 " must be in [0, max_tokens = ", a.max_tokens, "]");
    OSPREY_CHECK(a.top_k == kTopK, "moe_mid: top_k = ", a.top_k, ", only ", kTopK, " is supported");
    OSPREY_CHECK(a.variant >= -1 && a.variant < kVariants, "moe_mid: variant ", a.variant, " (-1 or 0..", kVariants - 1,
                 ")");
    OSPREY_CHECK(a.n_experts >= kTopK && a.n_experts <= kMoeMaxExperts, "moe_mid: n_experts = ", a.n_experts,
                 " must be in [", kTopK, ", ", kMoeMaxExperts, "]");
    OSPREY_CHECK(
        a.d_model > 0 && a.d_model % 32 == 0 && a.d_ff > 0 && a.d_ff % 32 == 0 && a.d_model <= 3072 && a.d_ff <= 3072,
        "moe_mid: d_model = ", a.d_model, " and d_ff = ", a.d_ff,
        " must be positive multiples of 32 (the MXFP4 group), at most 3072 (an item's scales)");
    if (a.n_tokens == 0) return;
    OSPREY_CHECK(a.y && a.h && a.workspace && a.expert_offsets && a.sorted_rows, "moe_mid: null pointer");
    for (const Mxfp4Experts* w : {&a.mlp1, &a.mlp2}) {
        OSPREY_CHECK(w->blocks && w->scales && w->bias, "moe_mid: null expert weights");
        OSPREY_CHECK(aligned16(w->blocks) && aligned16(w->scales) && aligned16(w->bias),
                     "moe_mid: expert blocks, scales and biases must be 16-byte aligned (bulk copies)");
    }
    OSPREY_CHECK(aligned16(a.h), "moe_mid: h must be 16-byte aligned");
    OSPREY_CHECK(reinterpret_cast<uintptr_t>(a.workspace) % 256 == 0, "moe_mid: workspace must be 256-byte aligned");
}

// A variant's two kernels and the ring bytes of its dynamic shared memory.
struct Variant {
    void (*mlp1)(Params);
    void (*mlp2)(Params);
    size_t ring_bytes;
};
template <int kTok, int kMul>
Variant variant_of() {
    return {moe_mid_kernel<Proj::mlp1, kTok, kMul>, moe_mid_kernel<Proj::mlp2, kTok, kMul>,
            size_t(Cfg<kTok, kMul>::kStages) * Cfg<kTok, kMul>::kStageBytes};
}
const Variant& variant(int v) {
    static const Variant table[kVariants] = {variant_of<64, 1>(), variant_of<32, 2>(), variant_of<16, 1>(),
                                             variant_of<16, 2>()};
    return table[v];
}

struct Plan {
    Params p1, p2;
    uint4* x;
    int n_rows, n_kb1;
    Variant v;
    size_t smem1, smem2;
};

Params params_for(const Mxfp4Experts& w, int n_in, int n_out, const MoeMidArgs& a) {
    Params p{};
    p.blocks = w.blocks, p.scales = w.scales;
    p.bias = reinterpret_cast<const __nv_bfloat16*>(w.bias);
    p.offsets = a.expert_offsets, p.sorted_rows = a.sorted_rows;
    p.n_rows = a.n_tokens * kTopK, p.n_experts = a.n_experts;
    p.n_in = n_in, p.n_out = n_out, p.n_groups = n_in / 32;
    p.n_kb = n_kblocks(n_in), p.n_mt = (n_out + kTileRows - 1) / kTileRows;
    p.bias_offset = (kTileRows * p.n_groups + 127) / 128 * 128;
    p.item_bytes = p.bias_offset + kTileRows * 2;
    p.alpha = a.swiglu_alpha, p.limit = a.swiglu_limit;
    p.prefetch = a.l2_prefetch ? 1 : 0;
    return p;
}

Plan plan(const MoeMidArgs& a, int v) {
    const Layout l = layout(a.n_tokens, a.d_model, a.d_ff);
    uint8_t* ws = static_cast<uint8_t*>(a.workspace);
    Plan pl{};
    pl.n_rows = a.n_tokens * kTopK;
    pl.n_kb1 = n_kblocks(a.d_model);
    pl.x = reinterpret_cast<uint4*>(ws + l.x);
    pl.p1 = params_for(a.mlp1, a.d_model, 2 * a.d_ff, a);
    pl.p1.act = ws + l.x;
    pl.p1.u = reinterpret_cast<__nv_bfloat16*>(ws + l.u);
    pl.p2 = params_for(a.mlp2, a.d_ff, a.d_model, a);
    pl.p2.act = ws + l.u;
    pl.p2.y = a.y;
    pl.v = variant(v);
    pl.smem1 = pl.v.ring_bytes + 2 * size_t(pl.p1.item_bytes);
    pl.smem2 = pl.v.ring_bytes + 2 * size_t(pl.p2.item_bytes);
    return pl;
}

#ifndef OSPREY_CUDA_EMULATION
int max_ctas() {
    static const int n = sm_count();
    return n;
}

size_t smem_limit() {
    static const size_t n = [] {
        int device = 0, max_optin = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        size_t static_bytes = 0;
        for (int v = 0; v < kVariants; ++v)
            for (auto kernel : {variant(v).mlp1, variant(v).mlp2}) {
                cudaFuncAttributes attr{};
                CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
                static_bytes = std::max(static_bytes, attr.sharedSizeBytes);
            }
        return size_t(max_optin) - static_bytes;
    }();
    return n;
}

void configure() {
    thread_local const bool done = [] {  // per thread: the attribute is per device
        for (int v = 0; v < kVariants; ++v)
            for (auto kernel : {variant(v).mlp1, variant(v).mlp2}) {
                CUDA_CHECK(
                    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_limit())));
                CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                int(cudaSharedmemCarveoutMaxShared)));
            }
        return true;
    }();
    (void)done;
}

void launch_mid(void (*kernel)(Params), const Params& p, size_t smem, bool pdl, cudaStream_t stream) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(max_ctas());
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p));
}
#endif  // OSPREY_CUDA_EMULATION

}  // namespace

#ifndef OSPREY_CUDA_EMULATION
int moe_mid_default_variant() {
    static const int v = [] {
        const char* env = std::getenv("OSPREY_MOE_MID_VARIANT");
        if (!env || !*env) return 0;
        const int n = std::atoi(env);
        OSPREY_CHECK(n >= 0 && n < kVariants && std::string(env) == std::to_string(n), "$OSPREY_MOE_MID_VARIANT = '",
                     env, "': a variant 0..", kVariants - 1);
        return n;
    }();
    return v;
}

bool moe_mid_l2_prefetch_default() {
    static const bool on = [] {
        const char* env = std::getenv("OSPREY_MOE_MID_PREFETCH");
        return !(env && std::string(env) == "0");
    }();
    return on;
}

bool moe_mid_supports(int n_experts, int d_model, int d_ff, int top_k) {
    return shape_ok(n_experts, d_model, d_ff, top_k);
}

size_t moe_mid_workspace_bytes(int max_tokens, int d_model, int d_ff) {
    OSPREY_CHECK(max_tokens >= 0 && d_model > 0 && d_ff > 0, "moe_mid_workspace_bytes: bad shape");
    configure();
    return std::max<size_t>(256, layout(max_tokens, d_model, d_ff).total);
}

void moe_mid(const MoeMidArgs& a, cudaStream_t stream) {
    check_args(a);
    if (a.n_tokens == 0) return;
    const Plan pl = plan(a, a.variant >= 0 ? a.variant : moe_mid_default_variant());
    OSPREY_CHECK(pl.smem1 <= smem_limit() && pl.smem2 <= smem_limit(), "moe_mid: d_model = ", a.d_model,
                 ", d_ff = ", a.d_ff, " need ", pl.smem1, " / ", pl.smem2, " bytes of shared memory, the device has ",
                 smem_limit());
    configure();
    const bool pdl = a.pdl && pdl_enabled();
    const int64_t units = int64_t(pl.n_kb1) * pl.n_rows * 32;
    launch(gather_kernel, dim3(unsigned((units + 255) / 256)), dim3(256), 0, stream, pl.x,
           reinterpret_cast<const __nv_bfloat16*>(a.h), a.sorted_rows, pl.n_rows, pl.n_kb1, a.d_model);
    launch_mid(pl.v.mlp1, pl.p1, pl.smem1, pdl, stream);
    launch_mid(pl.v.mlp2, pl.p2, pl.smem2, pdl, stream);
}
#endif  // OSPREY_CUDA_EMULATION

}  // namespace osprey::cuda
