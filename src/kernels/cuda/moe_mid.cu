// The mid-batch MoE projections (see moe_mid.h for the contract and the outline).
//
// Kernels: moe_mid_kernel<mlp1 | mlp2, kMt, kNt>: persistent, one CTA per SM of kConsumerWarps = 8
// warps and no producer warp (a ninth warp would cap every thread at 168 registers, the register
// file being split over the 4 schedulers; with 8, x and the accumulators fit: 233-242 registers for
// <2, 3>, no spills with nvcc 13.0); mlp1 reads h itself (through sorted_rows): no gather launch.
//
// Work split. A chunk is kRows = 16 kMt consecutive weight rows of one expert over the whole K:
// one contiguous run of MXFP4 blocks [kRows][n_groups][16 B], one of scales [kRows][n_groups] and
// one of biases [kRows] (as moe_decode's 16-row chunks). An expert with n_e routed rows is cut into
// n_tb = ceil(n_e / kTok) token blocks of balanced sizes (kTok = 8 kNt); an item is (expert, token
// block, chunk), numbered expert-major, then token block, then chunk. Every CTA reads
// expert_offsets, builds the same item table and takes items [N b / grid, N (b + 1) / grid): every
// item streams the same weight bytes, so every SM streams the same bytes (to one chunk) for any
// routing. Experts with more than kTok routed rows are streamed once per token block (20b batch
// 128 has ~16 rows per expert on average; 120b ~4).
//
// Pipeline. Each item's chunk comes with three cp.async.bulk (blocks, scales, biases: ~46 KB + 2.9 KB
// + 64 B at d = 2880, kMt = 2) into a ring of n_stages stages (as many as shared memory holds beside
// the partial sums, up to kMaxStages: 3 at d = 2880, kMt = 2; full mbarriers count the bytes), with
// the L2 evict_first policy (read once). Thread 0 issues the first n_stages at the start (mlp2: before
// it waits for mlp1, weights only); afterwards the last of the 8 warps to finish reading a stage (a
// shared counter, atomicAdd after a CTA fence) issues the copies of the item n_stages later into it.
//
// Compute. The 8 consumer warps split each chunk's K: warp w takes k-steps (128 inputs = 4 MXFP4
// groups) w, w + 8, w + 16 (kMaxSteps = 3: n_in <= 3072). Its activation (B) fragments depend only
// on (token block, k-step), so each warp keeps them in registers, x[kMaxSteps][kNt][4] (uint4:
// 48 registers per 8-token n-tile), loaded from L2 when the token block changes (mlp1: h rows
// through sorted_rows, permuted to the decode's pair order as moe_decode does; mlp2: u tiles, already
// in that order): 1-3 times per CTA and projection, so the only shared-memory reads per weight are
// the weights themselves. Per k-step, lane (g, c) takes group 4 s + c of rows g and g + 8 of each
// m-tile of the chunk (2 ld.shared.v4 + 2 scale bytes per m-tile), decodes them once (moe_fp4.cuh)
// and feeds 2 mma.sync m16n8k16 per quad and n-tile (weights as A, tokens as B). The 8 warps' partial
// sums [kMt][nt][4] meet in a ring of kRedBufs shared buffers; warp (item index mod 8), the item's
// finisher, adds them in warp order (deterministic, no atomics) and runs the epilogue: mlp1 adds b1,
// applies the clamped SwiGLU (gate / up rows are neighbours: lanes g and g ^ 1) and stores u in the
// tile layout (moe_mid_act_index); mlp2 adds b2 and stores y per routed row. The finisher rotates, so
// no warp waits for another's epilogue; only it waits for the 8 partials.
//
// Budget per KB of MXFP4 blocks (one warp k-step on one m-tile: 16 rows x 128 inputs), nt = n-tiles
// of the token block (1 at 20b batch 16 and 120b up to 128, 1-2 at 20b batch 64, 2-3 at 20b 128):
//   bytes: 1 KB blocks + 64 B scales, each read once from HBM (one bulk copy per ~49 KB run; the
//   previous design issued one per 128 B row segment and was bound by that: 9% of 4.64 TB/s) and
//   once from shared memory (2 ld.shared.v4, the 2-way bank conflict of 1440-byte rows: 2 KB of
//   wavefronts); activations come from registers (the old design read nt x 2 KB of B per KB from
//   shared memory).
//   instructions (warp): 4 loads + ~6 scale / address ops + the decode, 8 words x 17 (shift, then
//   per pair and, imad, and, mul.bf16x2) = 136, + 8 nt mma  =>  ~146 + 8 nt per KB; per chunk and warp
//   the reduction adds kMt nt float4 stores and, for the finisher, 8 kMt nt float4 loads + the
//   epilogue (~1-3% spread over the chunk's ~46 KB).
//   Of which ALU-pipe (and, shift) ~72 per KB, FMA-pipe (imad, mul.bf16x2) ~64, tensor 8 nt.
// At 100% of 4.64 TB/s an SM must take 20 B/clock (132 SMs, 1.755 GHz): ~54 clocks per KB, i.e.
// ~216 issue slots (4 schedulers) and ~108 ALU-pipe slots (half rate). Needed: 154-170 issue slots
// (71-79%) and 72 ALU slots (67%). With 8 consumer warps (2 per scheduler) and dependent decode
// chains, the issue rate moe_decode reaches (~1.5 per clock per SM measured by ncu) would give ~40%;
// here each warp's share of a chunk is 2 m-tiles (two independent decode chains) x nt n-tiles of
// mma per k-step, one partial-sum exchange per 32 rows (moe_decode: per 16) and no activation loads,
// so more instruction-level parallelism: at ~2 instructions per clock per SM, 77-85 clocks per KB,
// i.e. 13 B/clock: ~65%; at moe_decode's 1.5: ~50%. Expected, 20b (bench_moe_decode's bytes: 374 MB
// at 16 tokens, 424 MB at 64 and 128), mlp1 + mlp2 per layer against narrow's measured figures:
//   16 tokens (nt = 1):        ~125-160 µs   (narrow 249, auto 181)
//   64 tokens (nt = 1-2):      ~140-180 µs   (narrow 274)
//   128 tokens (nt = 2-3, ~1% of experts over 24 rows at uniform routing: two blocks):
//                              ~150-190 µs   (narrow 284)
// plus ~5 µs per call of fixed cost (two launches, the first chunks' latency, 1-3 activation loads
// per CTA); 120b alike per byte (nt = 1). Not measured: bench_moe_decode ... mid on the H200 says.
//
// FP4 decode cost: each weight is decoded once per token block and feeds nt n-tiles. Cheaper
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
constexpr int kWarps = kConsumerWarps;  // no producer warp: the last warp done with a stage refills it
constexpr int kThreads = 32 * kWarps;
constexpr int kKb = 256;  // inputs per k-block of the u tile layout (moe_mid_act_index)
constexpr int kActRowBytes = kKb * 2;
constexpr int kGroupsPerStep = 4;  // MXFP4 groups per k-step: group 4 s + c for lane quad c
constexpr int kMaxSteps = 3;       // k-steps per consumer warp: n_in <= 3072 = 24 k-steps of 128
constexpr int kMaxStages = 8;      // ring depth at most (small shapes)
constexpr int kRedBufs = 3;        // partial-sum buffers in flight
constexpr int kMaxPerLane = (kMoeMaxExperts + 31) / 32;
// Dynamic shared memory the plan may use: the H100/H200 opt-in limit (227 KB) less the kernels'
// static shared memory (the item table and the barriers: 2304 bytes with nvcc 13.0); moe_mid()
// checks it against the device.
constexpr int kSmemBudget = 232448 - 3072;

// A variant (MoeMidArgs::variant, $OSPREY_MOE_MID_VARIANT): kMt m-tiles of 16 weight rows per chunk
// (one bulk copy of 16 kMt rows x n_in / 2 bytes), kNt n-tiles of 8 routed rows per token block.
template <int kMt, int kNt>
struct Cfg {
    static constexpr int kRows = 16 * kMt;                               // weight rows per chunk
    static constexpr int kTok = 8 * kNt;                                 // routed rows per token block at most
    static constexpr int kRedFloats = kConsumerWarps * kMt * kNt * 128;  // [warp][kMt kNt][32 lanes][4]
    static_assert(kMt >= 1 && kMt <= 2 && kNt >= 1 && kNt <= 3, "registers: x and the accumulators");
};
// The variants, by index: 0 <2, 3> (default), 1 <1, 3>, 2 <2, 2>.
constexpr int kVariants = 3;
static_assert(kVariants == kMoeMidVariants);

enum class Proj { mlp1, mlp2 };

struct Params {
    const uint8_t* blocks;       // [n_experts, n_out, n_groups, 16]
    const uint8_t* scales;       // [n_experts, n_out, n_groups]
    const __nv_bfloat16* bias;   // [n_experts, n_out]
    const int32_t* offsets;      // [n_experts + 1]
    const int32_t* sorted_rows;  // [n_rows]
    const __nv_bfloat16* act;    // mlp1: h [n_rows / 4, n_in]; mlp2: u tiles (moe_mid_act_index, n_rows rows)
    __nv_bfloat16* u;            // mlp1: u tiles (moe_mid_act_index, n_out / 2 columns)
    float* y;                    // mlp2: [n_rows, n_out] by routed row t * 4 + slot
    int n_rows, n_experts, n_in, n_out, n_groups, n_ks, n_chunks;
    int stage_bytes;  // one ring stage: a chunk's blocks, scales, biases (128-byte multiple)
    int n_stages;     // ring depth, 2..kMaxStages
    float alpha, limit;
};

struct Table {
    int start[kMoeMaxExperts + 1];   // first item of expert e (non-decreasing); start[n_experts] = total
    int offset[kMoeMaxExperts + 1];  // expert_offsets
};

struct Item {
    int e, tb, chunk, p0, n;  // expert, token block, chunk, first sorted row, routed rows (1..kTok)
};

// Fills t for the whole CTA (ends with __syncthreads).
template <int kTok>
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
                items[k] = (o1 - o0 + kTok - 1) / kTok * p.n_chunks;
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

// Item idx: the expert's token blocks have balanced sizes (they differ by one at most, <= kTok).
template <int kTok>
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
    const int n_tb = (count + kTok - 1) / kTok;
    const int local = idx - t.start[lo];
    it.tb = local / p.n_chunks;
    it.chunk = local - it.tb * p.n_chunks;
    const int r0 = count * it.tb / n_tb, r1 = count * (it.tb + 1) / n_tb;
    it.p0 = t.offset[lo] + r0;
    it.n = r1 - r0;
    return it;
}

// The B fragments of this warp's k-steps (warp + 8 j) for the item's token block: x[j][n][i] is
// the unit of token row 8 n + g (lane g), group 4 s + c (lane c), inputs 8 i .. 8 i + 7 of the group
// in the decode's pair order (e0 e4)(e1 e5)(e2 e6)(e3 e7); zero past the block, past n_groups.
template <Proj kProj, int kNt>
__device__ void load_b(const Params& p, const Item& it, uint4 (&x)[kMaxSteps][kNt][4]) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
#pragma unroll
    for (int n = 0; n < kNt; ++n) {
        const int tr = n * 8 + g;
        const bool row_ok = tr < it.n;
        const int pr = it.p0 + tr;
        const __nv_bfloat16* hrow = nullptr;
        if constexpr (kProj == Proj::mlp1) {
            if (row_ok) hrow = p.act + size_t(p.sorted_rows[pr] / kTopK) * p.n_in;
        }
#pragma unroll
        for (int j = 0; j < kMaxSteps; ++j) {
            const int group = (warp + kConsumerWarps * j) * kGroupsPerStep + c;
            const bool ok = row_ok && group < p.n_groups;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                uint4 v = make_uint4(0u, 0u, 0u, 0u);
                if (ok) {
                    const int j0 = group * 32 + 8 * i;
                    if constexpr (kProj == Proj::mlp1) {
                        const uint4 q = ld_act16(hrow + j0);
                        v.x = __byte_perm(q.x, q.z, 0x5410), v.y = __byte_perm(q.x, q.z, 0x7632);
                        v.z = __byte_perm(q.y, q.w, 0x5410), v.w = __byte_perm(q.y, q.w, 0x7632);
                    } else {
                        v = ld_act16(p.act + moe_mid_act_index(pr, j0, p.n_rows));
                    }
                }
                x[j][n][i] = v;
            }
        }
    }
}

// One chunk's share of this warp: its k-steps over the kMt m-tiles of the stage, nt = kNtUsed
// n-tiles. blk: [kRows][n_groups][16 B]; sc: [kRows][n_groups].
template <int kMt, int kNt, int kNtUsed>
__device__ __forceinline__ void chunk_math(const uint8_t* blk, const uint8_t* sc, const Params& p,
                                           const uint4 (&x)[kMaxSteps][kNt][4], float (&part)[kMt][kNt][4]) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
#pragma unroll
    for (int j = 0; j < kMaxSteps; ++j) {
        const int ks = warp + kConsumerWarps * j;
        if (ks >= p.n_ks) break;  // uniform
        const int group = ks * kGroupsPerStep + c;
        uint4 wa[kMt], wb[kMt];
        uint32_t sa[kMt], sb[kMt];
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
            const int ra = mt * 16 + g;
            if (group < p.n_groups) {
                wa[mt] = ld_shared16(blk + (ra * p.n_groups + group) * 16);
                wb[mt] = ld_shared16(blk + ((ra + 8) * p.n_groups + group) * 16);
                sa[mt] = (sc[ra * p.n_groups + group] + kScaleExponentBias) * 0x00800080u;
                sb[mt] = (sc[(ra + 8) * p.n_groups + group] + kScaleExponentBias) * 0x00800080u;
            } else {  // past the last group of the rows: zero weights (the B fragments are zero too)
                wa[mt] = wb[mt] = make_uint4(0u, 0u, 0u, 0u);
                sa[mt] = sb[mt] = kScaleExponentBias * 0x00800080u;
            }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int mt = 0; mt < kMt; ++mt) {
                const uint32_t wav[4] = {wa[mt].x, wa[mt].y, wa[mt].z, wa[mt].w};
                const uint32_t wbv[4] = {wb[mt].x, wb[mt].y, wb[mt].z, wb[mt].w};
                uint32_t ra[4], rb[4];
                decode_fp4x8(wav[i], sa[mt], ra);
                decode_fp4x8(wbv[i], sb[mt], rb);
#pragma unroll
                for (int n = 0; n < kNtUsed; ++n) {
                    // A: a0 = (row g, pair 0), a1 = (row g + 8, pair 0), a2 = (row g, pair 1), a3 = (row g + 8, pair
                    // 1).
                    mma_bf16(part[mt][n], ra[0], rb[0], ra[1], rb[1], x[j][n][i].x, x[j][n][i].y);
                    mma_bf16(part[mt][n], ra[2], rb[2], ra[3], rb[3], x[j][n][i].z, x[j][n][i].w);
                }
            }
        }
    }
}

// The finisher's epilogue of one m-tile and n-tile. mlp1: u of rows (fa, fa + 8) (gate / up
// interleaved: unit fa / 2 pairs lanes g and g ^ 1) for every valid token; mlp2: y of the routed rows.
template <Proj kProj>
__device__ void epilogue(const Params& p, const Item& it, int fa, int n, const float (&acc)[4], float bias_a,
                         float bias_b) {
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int fb = fa + 8;
    const float va0 = acc[0] * kUnscale + bias_a, va1 = acc[1] * kUnscale + bias_a;
    const float vb0 = acc[2] * kUnscale + bias_b, vb1 = acc[3] * kUnscale + bias_b;
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

// Starts the copies of item idx's chunk (blocks, scales, biases: one contiguous run each) into stage s.
template <int kMt, int kNt>
__device__ void issue_chunk(const Params& p, const Table& t, int idx, uint8_t* stage, mbar_t* full, uint64_t policy) {
    using C = Cfg<kMt, kNt>;
    const Item it = item_at<C::kTok>(p, t, idx);
    const size_t row = size_t(it.e) * p.n_out + size_t(it.chunk) * C::kRows;
    const uint32_t blk_bytes = uint32_t(C::kRows * p.n_groups * 16), sc_bytes = uint32_t(C::kRows * p.n_groups);
    constexpr uint32_t kBiasBytes = C::kRows * 2;
    mbar_arrive_expect_tx(full, blk_bytes + sc_bytes + kBiasBytes);
    bulk_copy(stage, p.blocks + row * p.n_groups * 16, blk_bytes, full, policy);
    bulk_copy(stage + blk_bytes, p.scales + row * p.n_groups, sc_bytes, full, policy);
    bulk_copy(stage + blk_bytes + sc_bytes, p.bias + row, kBiasBytes, full, policy);
}

template <Proj kProj, int kMt, int kNt>
__global__ void __launch_bounds__(kThreads, 1) moe_mid_kernel(const Params p) {
    using C = Cfg<kMt, kNt>;
    constexpr int kRows = C::kRows;
    extern __shared__ __align__(128) uint8_t smem[];  // [n_stages][stage_bytes] ring, then [kRedBufs][kRedFloats]
    __shared__ Table table;
    __shared__ mbar_t full[kMaxStages];                         // the chunk ring
    __shared__ uint32_t released[kMaxStages];                   // warps done with a stage, cumulative
    __shared__ mbar_t red_full[kRedBufs], red_empty[kRedBufs];  // the partial-sum ring
    if constexpr (kProj == Proj::mlp1) {
        griddep_wait();               // the grouping (and h) are complete; u may be read until now
        griddep_launch_dependents();  // mlp2 may launch now (it starts streaming weights when it lands)
    }
    // mlp2 reads expert_offsets before its wait: complete before mlp1 passed its own wait.
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < p.n_stages; ++s) mbar_init(&full[s], 1), released[s] = 0;
        for (int b = 0; b < kRedBufs; ++b) mbar_init(&red_full[b], kConsumerWarps), mbar_init(&red_empty[b], 1);
        mbar_init_fence();
    }
    build_table<C::kTok>(p, table);  // ends with __syncthreads
    const int n_items = table.start[p.n_experts];
    const int first = int(int64_t(n_items) * blockIdx.x / gridDim.x);
    const int last = int(int64_t(n_items) * (blockIdx.x + 1) / gridDim.x);
    const uint32_t blk_bytes = uint32_t(kRows * p.n_groups * 16), sc_bytes = uint32_t(kRows * p.n_groups);
    const uint64_t policy = evict_first_policy();  // the weights are read once
    if (threadIdx.x == 0)  // the first n_stages chunks (mlp2: weights only, before it waits for mlp1)
        for (int i = 0; i < p.n_stages && first + i < last; ++i)
            issue_chunk<kMt, kNt>(p, table, first + i, smem + size_t(i) * p.stage_bytes, &full[i], policy);

    if constexpr (kProj == Proj::mlp2) griddep_wait();  // u is mlp1's, y may be read by earlier kernels until now
    const int g = lane / 4;
    float* red_base = reinterpret_cast<float*>(smem + size_t(p.n_stages) * p.stage_bytes);
    uint4 x[kMaxSteps][kNt][4];
    int cur_e = -1, cur_tb = -1;  // the token block whose B fragments x holds
    for (int idx = first, i = 0; idx < last; ++idx, ++i) {
        const Item it = item_at<C::kTok>(p, table, idx);
        if (it.e != cur_e || it.tb != cur_tb) load_b<kProj, kNt>(p, it, x), cur_e = it.e, cur_tb = it.tb;
        const int nt = (it.n + 7) / 8;
        const bool finisher = i % kConsumerWarps == warp;  // this warp sums the item and runs its epilogue
        const int s = i % p.n_stages;
        mbar_wait(&full[s], uint32_t(i / p.n_stages) & 1u);
        const uint8_t* blk = smem + size_t(s) * p.stage_bytes;  // [kRows][n_groups][16 B]
        const uint8_t* sc = blk + blk_bytes;                    // [kRows][n_groups]
        float bias[kMt][2] = {};                                // read before the stage is released
        if (finisher) {
            const __nv_bfloat16* b = reinterpret_cast<const __nv_bfloat16*>(sc + sc_bytes);  // [kRows]
#pragma unroll
            for (int mt = 0; mt < kMt; ++mt)
                bias[mt][0] = __bfloat162float(b[mt * 16 + g]), bias[mt][1] = __bfloat162float(b[mt * 16 + g + 8]);
        }
        float part[kMt][kNt][4];
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
            for (int n = 0; n < kNt; ++n) part[mt][n][0] = part[mt][n][1] = part[mt][n][2] = part[mt][n][3] = 0.0f;
        if (nt == 1) {
            chunk_math<kMt, kNt, 1>(blk, sc, p, x, part);
        } else if (kNt >= 2 && nt == 2) {
            chunk_math<kMt, kNt, (kNt >= 2 ? 2 : 1)>(blk, sc, p, x, part);
        } else {
            chunk_math<kMt, kNt, kNt>(blk, sc, p, x, part);
        }
        // The last warp done with the stage refills it with item i + n_stages.
        __syncwarp();
        if (lane == 0) {
            __threadfence_block();  // this warp's reads of the stage are complete before it counts
            if (atomicAdd(&released[s], 1u) % kConsumerWarps == kConsumerWarps - 1) {
                __threadfence_block();
                if (idx + p.n_stages < last)
                    issue_chunk<kMt, kNt>(p, table, idx + p.n_stages, smem + size_t(s) * p.stage_bytes, &full[s],
                                          policy);
            }
        }

        // Partial sums through a ring of kRedBufs buffers ([warp][mt * kNt + n][lane] float4): a warp
        // hands its partial over and goes on to the next item; only the finisher waits for all eight.
        const int b = i % kRedBufs, round = i / kRedBufs;
        float* red = red_base + b * C::kRedFloats;
        if (round > 0) mbar_wait(&red_empty[b], uint32_t(round - 1) & 1u);  // the previous finisher has read it
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
            for (int n = 0; n < kNt; ++n)
                if (n < nt)
                    *reinterpret_cast<float4*>(red + ((warp * kMt + mt) * kNt + n) * 128 + lane * 4) =
                        make_float4(part[mt][n][0], part[mt][n][1], part[mt][n][2], part[mt][n][3]);
        __syncwarp();
        if (lane == 0) mbar_arrive(&red_full[b]);
        if (finisher) {
            mbar_wait(&red_full[b], uint32_t(round) & 1u);
            float acc[kMt][kNt][4];
#pragma unroll
            for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
                for (int n = 0; n < kNt; ++n) {
                    acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.0f;
                    if (n < nt)
                        for (int w = 0; w < kConsumerWarps; ++w) {  // in warp order: deterministic
                            const float4 v =
                                *reinterpret_cast<const float4*>(red + ((w * kMt + mt) * kNt + n) * 128 + lane * 4);
                            acc[mt][n][0] += v.x, acc[mt][n][1] += v.y, acc[mt][n][2] += v.z, acc[mt][n][3] += v.w;
                        }
                }
            __syncwarp();
            if (lane == 0) mbar_arrive(&red_empty[b]);
#pragma unroll
            for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
                for (int n = 0; n < kNt; ++n)
                    if (n < nt)  // uniform
                        epilogue<kProj>(p, it, it.chunk * kRows + mt * 16 + g, n, acc[mt][n], bias[mt][0], bias[mt][1]);
        }
    }
}

size_t align256(size_t n) {
    return (n + 255) / 256 * 256;
}
int n_kblocks(int n_in) {
    return (n_in + kKb - 1) / kKb;
}

// Workspace: the u tiles (n_rows = 4 n_tokens rows), nothing else.
size_t workspace_total(int n_tokens, int d_ff) {
    return align256(size_t(n_kblocks(d_ff)) * size_t(n_tokens) * kTopK * kActRowBytes);
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
        " must be positive multiples of 32 (the MXFP4 group), at most 3072 (3 k-steps of 128 per consumer warp)");
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

// A variant's two kernels, its chunk rows, token block and the bytes of one partial-sum buffer.
struct Variant {
    void (*mlp1)(Params);
    void (*mlp2)(Params);
    int rows, tok;
    int red_bytes;
};
template <int kMt, int kNt>
Variant variant_of() {
    using C = Cfg<kMt, kNt>;
    return {moe_mid_kernel<Proj::mlp1, kMt, kNt>, moe_mid_kernel<Proj::mlp2, kMt, kNt>, C::kRows, C::kTok,
            int(C::kRedFloats * sizeof(float))};
}
const Variant& variant(int v) {
    static const Variant table[kVariants] = {variant_of<2, 3>(), variant_of<1, 3>(), variant_of<2, 2>()};
    return table[v];
}

struct Plan {
    Params p1, p2;
    Variant v;
    size_t smem1, smem2;
};

// One projection's parameters; the ring takes what shared memory leaves beside the partial sums.
Params params_for(const Mxfp4Experts& w, int n_in, int n_out, const MoeMidArgs& a, const Variant& v) {
    Params p{};
    p.blocks = w.blocks, p.scales = w.scales;
    p.bias = reinterpret_cast<const __nv_bfloat16*>(w.bias);
    p.offsets = a.expert_offsets, p.sorted_rows = a.sorted_rows;
    p.n_rows = a.n_tokens * kTopK, p.n_experts = a.n_experts;
    p.n_in = n_in, p.n_out = n_out, p.n_groups = n_in / 32;
    p.n_ks = (p.n_groups + kGroupsPerStep - 1) / kGroupsPerStep;
    p.n_chunks = n_out / v.rows;  // n_out is a multiple of 32 (check_args)
    p.stage_bytes = (v.rows * p.n_groups * 17 + v.rows * 2 + 127) / 128 * 128;
    p.n_stages = std::min(kMaxStages, (kSmemBudget - kRedBufs * v.red_bytes) / p.stage_bytes);
    p.alpha = a.swiglu_alpha, p.limit = a.swiglu_limit;
    return p;
}

Plan plan(const MoeMidArgs& a, int v) {
    uint8_t* ws = static_cast<uint8_t*>(a.workspace);
    Plan pl{};
    pl.v = variant(v);
    pl.p1 = params_for(a.mlp1, a.d_model, 2 * a.d_ff, a, pl.v);
    pl.p1.act = reinterpret_cast<const __nv_bfloat16*>(a.h);
    pl.p1.u = reinterpret_cast<__nv_bfloat16*>(ws);
    pl.p2 = params_for(a.mlp2, a.d_ff, a.d_model, a, pl.v);
    pl.p2.act = reinterpret_cast<const __nv_bfloat16*>(ws);
    pl.p2.y = a.y;
    OSPREY_CHECK(pl.p1.n_stages >= 2 && pl.p2.n_stages >= 2, "moe_mid: d_model = ", a.d_model, ", d_ff = ", a.d_ff,
                 ": fewer than two ring stages fit in shared memory");
    pl.smem1 = size_t(pl.p1.n_stages) * pl.p1.stage_bytes + size_t(kRedBufs) * pl.v.red_bytes;
    pl.smem2 = size_t(pl.p2.n_stages) * pl.p2.stage_bytes + size_t(kRedBufs) * pl.v.red_bytes;
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

bool moe_mid_supports(int n_experts, int d_model, int d_ff, int top_k) {
    return shape_ok(n_experts, d_model, d_ff, top_k);
}

size_t moe_mid_workspace_bytes(int max_tokens, int d_model, int d_ff) {
    OSPREY_CHECK(max_tokens >= 0 && d_model > 0 && d_ff > 0, "moe_mid_workspace_bytes: bad shape");
    configure();
    return std::max<size_t>(256, workspace_total(max_tokens, d_ff));
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
    launch_mid(pl.v.mlp1, pl.p1, pl.smem1, pdl, stream);
    launch_mid(pl.v.mlp2, pl.p2, pl.smem2, pdl, stream);
}
#endif  // OSPREY_CUDA_EMULATION

}  // namespace osprey::cuda
