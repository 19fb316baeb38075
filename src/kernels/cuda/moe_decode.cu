// The decode MoE block in two launches (see moe_decode.h for the design and its bandwidth reasoning).
//
// Both kernels share one skeleton, templated on the projection. A CTA is one producer warp and
// kConsumerWarps consumer warps; the grid has one CTA per SM (mlp1 and mlp2 fit side by side):
//   1. route: every CTA recomputes top-4 + softmax of the T tokens (one warp per token, exactly as
//      moe_route.cu) and the sorted list of distinct active experts ("slots" a = 0..n_active-1).
//   2. work split: a chunk is (slot a, m-tile of 16 weight rows, all n_in inputs): 16 consecutive
//      rows of one expert, i.e. one contiguous run of MXFP4 blocks and one of scales. The
//      n_active * n_mtiles chunks, slot-major, are cut into one contiguous range per CTA.
//   3. weight stream: the producer warp's lane 0 copies each chunk (blocks, then scales) into a
//      kStages-deep shared-memory ring with cp.async.bulk (the TMA engine: no registers, no
//      per-lane address arithmetic), completion counted in bytes on the stage's "full" mbarrier;
//      consumers release a stage on its "empty" mbarrier. Up to kStages chunks (~96 KB) per SM are
//      in flight, enough to cover HBM latency at 1/132 of 4.64 TB/s. The ring fills one chunk at a
//      time at the start (kHeadChunks): a CTA's first chunk then does not queue behind every CTA's
//      whole ring.
//   4. compute: consumer warp w takes k-steps w, w + kConsumerWarps, ... of every chunk (a k-step =
//      4 MXFP4 groups of 32 inputs; lane (g, c) owns group 4 s + c of rows g and g + 8) and feeds
//      mma.sync m16n8k16 (M = 16 weight rows, N = 8 tokens). Its activation fragments depend only
//      on (token, k-step), so they are loaded once into registers (mlp1: once per kernel; mlp2:
//      when the chunk's expert changes) in the lane-permuted order
//          word w of quad i = elements (8i + w, 8i + w + 4) of the group (BF16 pair, lower element
//          in the low half); mlp1 permutes h on load; mlp1 writes u in moe_u_column order, which is
//          that order.
//   5. the consumers' partial sums of a chunk meet in shared memory (a ring of kRedBufs buffers with
//      full/empty mbarriers); warp (chunk index mod kConsumerWarps), the chunk's finisher, adds them
//      in warp order and runs the epilogue: deterministic, no split across CTAs, and no warp waits
//      for another's epilogue (the finisher rotates, so its global latency is spread over the ring).
//   6. epilogues (no global reads: the chunk's biases come through the ring): mlp1 adds b1, applies
//      the clamped SwiGLU and stores u (BF16); mlp2 adds b2 and stores y per routed row. The
//      weighted sum over the 4 slots is left to the consumer of the MoE output (rmsnorm's moe_y /
//      moe_w, or moe_combine when the caller asks for `out`); mlp1's CTA 0 stores the weights.
// Programmatic dependent launch: mlp1 waits for its producers, then lets mlp2 launch at once. mlp2's
// CTAs land beside mlp1's (shared memory and registers are sized for two per SM), route and fill
// their rings with mlp2 weights while mlp1 streams; its consumers wait (griddepcontrol.wait) before
// reading u or writing anything.
//
// scripts/emulate_moe_decode.sh runs this file's device code on the CPU (tests/kernels/emu): the
// parts under #ifndef OSPREY_CUDA_EMULATION are what the emulation replaces (PTX, launches).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/moe_decode.h"
#include "kernels/cuda/moe_fp4.cuh"
#include "kernels/cuda/moe_route.h"
#include "kernels/cuda/moe_topk.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/timeline.cuh"

namespace osprey::cuda {
namespace {

constexpr int kMaxTokens = kMoeDecodeMaxTokens;
constexpr int kTopK = 4;
#ifndef OSPREY_MOE_DECODE_WARPS
#define OSPREY_MOE_DECODE_WARPS 8
#endif
constexpr int kConsumerWarps = OSPREY_MOE_DECODE_WARPS;
constexpr int kCtasPerSm = kConsumerWarps <= 8 ? 2 : 1;  // CTAs per SM (max_ctas; registers allowing)
constexpr int kAccPairs = kCtasPerSm == 2 ? 1 : 2;       // registers allowing
constexpr int kWarps = kConsumerWarps + 1;  // + the producer warp
constexpr int kProducerWarp = kConsumerWarps;
constexpr int kThreads = 32 * kWarps;
constexpr int kStages = 4;                      // ring depth (chunks)
#ifndef OSPREY_MOE_DECODE_HEAD
#define OSPREY_MOE_DECODE_HEAD 1
#endif
// Chunks the producer issues at once when its CTA starts; chunk i < kStages past these goes out when
// chunk i - kHeadChunks has landed. With all four at once, every CTA's first chunk queued behind the
// others' (264 CTAs x 4 chunks = 26 MB at one token: the first chunk landed ~3.3 us after routing,
// 7.7 us for the last CTA). H200, 20b, bench_moe_decode 1 / 2 / 4 / 8 tokens: 1 chunk 27.59 / 43.98 /
// 65.47 / 102.23 us, 2 chunks 29.51 / 45.31 / 67.04 / 102.36, 4 chunks 30.56 / 45.78 / 67.04 / 102.14;
// end to end 1k batch 1 531.0 against 516.0 tokens/s, batch 8 unchanged (docs/performance.md).
constexpr int kHeadChunks = OSPREY_MOE_DECODE_HEAD;
constexpr int kRows = 16;                       // weight rows per chunk (one mma m-tile)
constexpr int kGroupsPerStep = 4;               // MXFP4 groups per k-step: group 4 s + c for lane quad c
constexpr int kMaxStepsPerWarp = (24 + kConsumerWarps - 1) / kConsumerWarps;  // activation fragments kept in registers
constexpr int kMaxGroups = kGroupsPerStep * kMaxStepsPerWarp * kConsumerWarps;  // n_in <= 3072
constexpr int kMaxActive = kTopK * kMaxTokens;  // distinct experts of a batch at most
constexpr int kRedFloats = kConsumerWarps * 128;  // one chunk's partial sums, [warp][4][32 lanes]
constexpr int kRedBufs = 3;                       // partial-sum buffers in flight
constexpr int kBiasBytes = kRows * 2;             // a chunk's BF16 biases
constexpr int kMaxPerLane = kMoeMaxExperts / 32;
static_assert(kWarps >= kMaxTokens, "routing: one warp per token");
static_assert(kMaxActive <= 32, "the slot tables are built by one warp");

enum class Proj { mlp1, mlp2 };

struct Params {
    const uint8_t* blocks;      // [n_experts, n_out, n_groups, 16]
    const uint8_t* scales;      // [n_experts, n_out, n_groups]
    const __nv_bfloat16* bias;  // [n_experts, n_out]
    const float* router;        // [T, n_experts]
    const __nv_bfloat16* act;   // mlp1: h [T, n_in]; mlp2: u [kMaxTokens * 4, n_in] (moe_u_column order)
    __nv_bfloat16* u;           // mlp1: [kMaxTokens * 4, n_out / 2] routed row t * 4 + slot
    float* y;                   // mlp2: [kMaxTokens * 4, n_out] per routed row, bias included
    float* w;                   // mlp1: [kMaxTokens * 4] routing weight of routed row t * 4 + slot
    int n_tokens, n_experts, n_in, n_out, n_groups, n_ks, n_mtiles;
    int stage_bytes;            // one ring stage: a chunk's blocks then its scales, 128-byte multiple
    float alpha, limit;
};

struct Routing {
    int ids[kMaxTokens * kTopK];  // chosen experts, largest logit first
    float w[kMaxTokens * kTopK];  // softmax over the chosen logits
    int active[kMaxActive];       // distinct chosen experts, increasing
    int n_active;
    int8_t slot[kMaxActive][kMaxTokens];     // slot of active expert a in token t's top-4, or -1
    int8_t col_row[kMaxActive][kMaxTokens];  // mlp2 columns of expert a: routed rows t * 4 + slot, by t
    int count[kMaxActive];                   // tokens routed to active expert a
};

// One k-step of one lane's weights: the 16-byte groups of rows g and g + 8, and their scales.
struct Chunk {
    uint4 wa, wb;
    uint32_t sa, sb;
};

// One k-step: 8 mma over the lane's 32 elements of rows g and g + 8 (A) and its activation
// fragments x[quad] (B). 2 * kAccPairs accumulator sets keep the mma dependency chains short.
// kWords: the stored bit layout of the weight words (mxfp4_words.h).
template <Mxfp4WordLayout kWords>
__device__ __forceinline__ void compute_step(const Chunk& ch, const uint4 (&x)[4], float (&acc)[2 * kAccPairs][4]) {
    const uint32_t sa = (ch.sa + kScaleExponentBias) * 0x00800080u;
    const uint32_t sb = (ch.sb + kScaleExponentBias) * 0x00800080u;
    const uint32_t wa[4] = {ch.wa.x, ch.wa.y, ch.wa.z, ch.wa.w};
    const uint32_t wb[4] = {ch.wb.x, ch.wb.y, ch.wb.z, ch.wb.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint32_t ra[4], rb[4];
        decode_fp4x8<kWords>(wa[i], sa, ra);
        decode_fp4x8<kWords>(wb[i], sb, rb);
        // A: a0 = (row g, k 2c..2c+1), a1 = (row g+8, same k), a2 = (row g, k 2c+8..2c+9), a3 = (row g+8).
        mma_bf16(acc[(i % kAccPairs) * 2], ra[0], rb[0], ra[1], rb[1], x[i].x, x[i].y);
        mma_bf16(acc[(i % kAccPairs) * 2 + 1], ra[2], rb[2], ra[3], rb[3], x[i].z, x[i].w);
    }
}

// Fills rt for the whole CTA (ends with __syncthreads). Bit-identical to moe_route_topk.
__device__ void route(const Params& p, Routing& rt) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (warp < p.n_tokens) {
        const int t = warp;
        warp_route_topk_fit<kTopK, kMaxPerLane>(p.router + size_t(t) * p.n_experts, nullptr, p.n_experts,
                                                rt.ids + t * kTopK, rt.w + t * kTopK);
    }
    __syncthreads();
    if (warp == 0) {  // distinct experts in increasing order
        const int n_ids = p.n_tokens * kTopK;
        int n = 0;
        for (int base = 0; base < p.n_experts; base += 32) {
            const int e = base + lane;
            bool present = false;
            for (int i = 0; i < n_ids; ++i) present |= rt.ids[i] == e;
            const unsigned m = __ballot_sync(0xffffffffu, present);
            if (present) rt.active[n + __popc(m & ((1u << lane) - 1u))] = e;
            n += __popc(m);
        }
        __syncwarp();
        if (lane < n) {  // n <= kMaxActive <= 32: lane = slot
            const int e = rt.active[lane];
            int count = 0;
            for (int t = 0; t < p.n_tokens; ++t) {
                int slot = -1;
                for (int k = 0; k < kTopK; ++k)
                    if (rt.ids[t * kTopK + k] == e) slot = k;
                rt.slot[lane][t] = int8_t(slot);
                if (slot >= 0) rt.col_row[lane][count++] = int8_t(t * kTopK + slot);
            }
            rt.count[lane] = count;
        }
        if (lane == 0) rt.n_active = n;
    }
    __syncthreads();
}

// acc: rows (mt * 16 + g, + 8) x columns (2c, 2c + 1) of active slot a, scaled by 2^-32; bias_a and
// bias_b: the biases of those two rows (loaded by the caller ahead of time).
__device__ void epilogue_mlp1(const Params& p, const Routing& rt, int a, int mt, const float (&acc)[4],
                              float bias_a, float bias_b) {
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int fa = mt * 16 + g, fb = fa + 8;  // weight rows of expert rt.active[a]
    const float va0 = acc[0] * kUnscale + bias_a, va1 = acc[1] * kUnscale + bias_a;
    const float vb0 = acc[2] * kUnscale + bias_b, vb1 = acc[3] * kUnscale + bias_b;
    // Rows 2j (gate) and 2j + 1 (up) of unit j sit in lanes 4 apart: the even-g lane keeps token
    // 2c, the odd-g lane token 2c + 1, after swapping the other column with its partner.
    const bool even = (g & 1) == 0;
    const float a_other = __shfl_xor_sync(0xffffffffu, even ? va1 : va0, 4);
    const float b_other = __shfl_xor_sync(0xffffffffu, even ? vb1 : vb0, 4);
    const int t = 2 * c + (even ? 0 : 1);
    if (t >= p.n_tokens) return;
    const int slot = rt.slot[a][t];
    if (slot < 0) return;
    const float ua = even ? swiglu(va0, a_other, p.alpha, p.limit) : swiglu(a_other, va1, p.alpha, p.limit);
    const float ub = even ? swiglu(vb0, b_other, p.alpha, p.limit) : swiglu(b_other, vb1, p.alpha, p.limit);
    __nv_bfloat16* row = p.u + size_t(t * kTopK + slot) * (p.n_out / 2);
    row[moe_u_column(fa >> 1)] = __float2bfloat16_rn(ua);
    row[moe_u_column(fb >> 1)] = __float2bfloat16_rn(ub);
}

__device__ void epilogue_mlp2(const Params& p, const Routing& rt, int a, int mt, const float (&acc)[4],
                              float bias_a, float bias_b) {
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int fa = mt * 16 + g, fb = fa + 8;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int n = 2 * c + k;  // column = n-th token routed to expert rt.active[a]
        if (n < rt.count[a]) {
            float* y = p.y + size_t(rt.col_row[a][n]) * p.n_out;
            y[fa] = acc[k] * kUnscale + bias_a;
            y[fb] = acc[2 + k] * kUnscale + bias_b;
        }
    }
}

// This consumer lane's activation fragments for its k-steps (warp + kConsumerWarps * j): column g
// of the B operand is token g (mlp1, h in natural order, paired here) or the g-th routed row of
// active expert a (mlp2, u stored paired). Columns past the batch and groups past n_groups are zero.
template <Proj kProj>
__device__ void load_activations(const Params& p, const Routing& rt, int a, uint4 (&x)[kMaxStepsPerWarp][4]) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
    int src_row = -1;
    if constexpr (kProj == Proj::mlp1) {
        src_row = g < p.n_tokens ? g : -1;
    } else {
        src_row = g < rt.count[a] ? rt.col_row[a][g] : -1;
    }
#pragma unroll
    for (int j = 0; j < kMaxStepsPerWarp; ++j) {
        const int group = (warp + kConsumerWarps * j) * kGroupsPerStep + c;
        const bool valid = src_row >= 0 && group < p.n_groups;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (valid) {
                const uint4 q = ld_act16(p.act + size_t(src_row) * p.n_in + group * 32 + i * 8);
                if constexpr (kProj == Proj::mlp1) {  // (e0 e1)(e2 e3)(e4 e5)(e6 e7) -> (e0 e4)(e1 e5)(e2 e6)(e3 e7)
                    v.x = __byte_perm(q.x, q.z, 0x5410), v.y = __byte_perm(q.x, q.z, 0x7632);
                    v.z = __byte_perm(q.y, q.w, 0x5410), v.w = __byte_perm(q.y, q.w, 0x7632);
                } else {
                    v = q;
                }
            }
            x[j][i] = v;
        }
    }
}

template <Proj kProj, Mxfp4WordLayout kWords>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) moe_decode_kernel(const Params p) {
    extern __shared__ __align__(128) uint8_t smem[];  // [kStages][stage_bytes] ring, then [kRedBufs][kRedFloats]
    __shared__ Routing rt;
    __shared__ mbar_t full[kStages], empty[kStages];      // the weight ring
    __shared__ mbar_t red_full[kRedBufs], red_empty[kRedBufs];  // the partial-sum ring
    OSPREY_TL_ENTER();
    if constexpr (kProj == Proj::mlp1) {
        griddep_wait();               // the router logits (and every earlier kernel) are complete
        OSPREY_TL_WAITED();
        griddep_launch_dependents();  // mlp2 may land beside us now and prefetch its weights
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], kConsumerWarps);
        for (int b = 0; b < kRedBufs; ++b) mbar_init(&red_full[b], kConsumerWarps), mbar_init(&red_empty[b], 1);
        mbar_init_fence();
    }
    route(p, rt);  // reads only the router logits (complete before mlp1 passed its wait); ends with __syncthreads
    if (kProj == Proj::mlp1 && blockIdx.x == 0 && threadIdx.x < p.n_tokens * kTopK) p.w[threadIdx.x] = rt.w[threadIdx.x];

    const int64_t n_chunks = int64_t(rt.n_active) * p.n_mtiles;
    const int64_t first = n_chunks * blockIdx.x / gridDim.x;
    const int n_mine = int(n_chunks * (blockIdx.x + 1) / gridDim.x - first);
    // The chunks are consecutive, so (slot, m-tile) is stepped rather than divided out per chunk (a
    // 64-bit division is a ~70-instruction routine, paid by every consumer warp for every chunk; the
    // H200 measured 20b 8 tokens 105.8 against 111.9 us with it, 1 token 33.1 against 34.3).
    struct Cursor {
        int a, mt;
    };
    const Cursor start{int(first / p.n_mtiles), int(first % p.n_mtiles)};
    auto advance = [&](Cursor& cur) {
        if (++cur.mt == p.n_mtiles) cur.mt = 0, ++cur.a;
    };
    const uint32_t blk_bytes = uint32_t(kRows * p.n_groups * 16), sc_bytes = uint32_t(kRows * p.n_groups);

    if (warp == kProducerWarp) {
        if (lane != 0) return;
        const uint64_t policy = evict_first_policy();
        Cursor cur = start;
        for (int i = 0; i < n_mine; ++i, advance(cur)) {
            const int s = i % kStages;
            if (i >= kStages) {
                mbar_wait_sleep(&empty[s], uint32_t(i / kStages - 1) & 1u);  // consumers are done with it
            } else if (i >= kHeadChunks) {
                mbar_wait_sleep(&full[i - kHeadChunks], 0u);  // staggered start (first lap: phase 0)
            }
            const size_t row = size_t(rt.active[cur.a]) * p.n_out + size_t(cur.mt) * kRows;
            uint8_t* dst = smem + size_t(s) * p.stage_bytes;
            mbar_arrive_expect_tx(&full[s], blk_bytes + sc_bytes + kBiasBytes);
            bulk_copy(dst, p.blocks + row * p.n_groups * 16, blk_bytes, &full[s], policy);
            bulk_copy(dst + blk_bytes, p.scales + row * p.n_groups, sc_bytes, &full[s], policy);
            bulk_copy(dst + blk_bytes + sc_bytes, p.bias + row, kBiasBytes, &full[s], policy);
        }
        OSPREY_TL_EXIT(p.blocks, kProj == Proj::mlp1 ? kTlMoeMlp1 : kTlMoeMlp2);
        return;
    }

    // Consumers.
    const int g = lane / 4, c = lane % 4;
    if constexpr (kProj == Proj::mlp2) griddep_wait();  // u, y, out and the counters belong to mlp1 until now
    if constexpr (kProj == Proj::mlp2) OSPREY_TL_WAITED();
    uint4 x[kMaxStepsPerWarp][4];
    int x_slot = -1;
    if constexpr (kProj == Proj::mlp1) load_activations<kProj>(p, rt, 0, x);
    float* red_base = reinterpret_cast<float*>(smem + size_t(kStages) * p.stage_bytes);
    Cursor cur = start;
    for (int i = 0; i < n_mine; ++i, advance(cur)) {
        const int s = i % kStages;
        const int a = cur.a, mt = cur.mt;
        if constexpr (kProj == Proj::mlp2) {
            if (a != x_slot) load_activations<kProj>(p, rt, a, x), x_slot = a;
        }
        const bool finisher = i % kConsumerWarps == warp;  // this warp sums the chunk and runs its epilogue
        mbar_wait_sleep(&full[s], uint32_t(i / kStages) & 1u);
        const uint8_t* blk = smem + size_t(s) * p.stage_bytes;  // [16 rows][n_groups][16 B]
        const uint8_t* sc = blk + blk_bytes;                    // [16 rows][n_groups]
        float bias_a = 0.0f, bias_b = 0.0f;                     // read before the stage is released
        if (finisher) {
            const __nv_bfloat16* bias = reinterpret_cast<const __nv_bfloat16*>(sc + sc_bytes);  // [16 rows]
            bias_a = __bfloat162float(bias[g]);
            bias_b = __bfloat162float(bias[g + 8]);
        }
        float part[2 * kAccPairs][4] = {};
#pragma unroll
        for (int j = 0; j < kMaxStepsPerWarp; ++j) {
            const int step = warp + kConsumerWarps * j;
            if (step < p.n_ks) {  // uniform across the warp
                const int group = step * kGroupsPerStep + c;
                Chunk ch;
                if (group < p.n_groups) {
                    ch.wa = ld_shared16(blk + (g * p.n_groups + group) * 16);
                    ch.wb = ld_shared16(blk + ((g + 8) * p.n_groups + group) * 16);
                    ch.sa = sc[g * p.n_groups + group];
                    ch.sb = sc[(g + 8) * p.n_groups + group];
                } else {  // past the last group of the rows: zero weights (the activations are zero too)
                    ch.wa = ch.wb = make_uint4(0u, 0u, 0u, 0u);
                    ch.sa = ch.sb = 0u;
                }
                compute_step<kWords>(ch, x[j], part);
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);  // this warp's reads of the stage are done

        // Partial sums through a ring of kRedBufs buffers: a warp hands its partial over and goes on
        // to the next chunk; only the finisher waits for all eight, so one warp's epilogue (global
        // loads and stores, mlp2's arrival counter) does not hold the others back.
        const int b = i % kRedBufs, round = i / kRedBufs;
        float* red = red_base + b * kRedFloats;
        if (round > 0) mbar_wait_sleep(&red_empty[b], uint32_t(round - 1) & 1u);  // the previous finisher has read it
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float sum = part[0][j] + part[1][j];
            if constexpr (kAccPairs == 2) sum += part[2][j] + part[3][j];
            red[warp * 128 + j * 32 + lane] = sum;
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&red_full[b]);
        if (finisher) {
            mbar_wait_sleep(&red_full[b], uint32_t(round) & 1u);
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int w = 0; w < kConsumerWarps; ++w)  // in warp order: deterministic
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[j] += red[w * 128 + j * 32 + lane];
            __syncwarp();
            if (lane == 0) mbar_arrive(&red_empty[b]);
            if constexpr (kProj == Proj::mlp1) {
                epilogue_mlp1(p, rt, a, mt, acc, bias_a, bias_b);
            } else {
                epilogue_mlp2(p, rt, a, mt, acc, bias_a, bias_b);
            }
        }
    }
    OSPREY_TL_EXIT(p.blocks, kProj == Proj::mlp1 ? kTlMoeMlp1 : kTlMoeMlp2);
}

// Workspace layout (offsets in bytes, each part 256-byte aligned).
struct Layout {
    size_t u, y, w, total;
};

size_t align256(size_t n) {
    return (n + 255) / 256 * 256;
}

Layout layout(int d_model, int d_ff) {
    Layout l{};
    size_t at = 0;
    l.u = at, at += align256(sizeof(bf16) * kMaxTokens * kTopK * d_ff);
    l.y = at, at += align256(sizeof(float) * kMaxTokens * kTopK * d_model);
    l.w = at, at += align256(sizeof(float) * kMaxTokens * kTopK);
    l.total = at;
    return l;
}

bool aligned16(const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

void check_args(const MoeDecodeArgs& a) {
    OSPREY_CHECK(a.n_tokens >= 0 && a.n_tokens <= kMaxTokens, "moe_decode: n_tokens = ", a.n_tokens, " must be in [0, ",
                 kMaxTokens, "] (larger batches: MoeStep)");
    OSPREY_CHECK(a.top_k == kTopK, "moe_decode: top_k = ", a.top_k, ", only ", kTopK, " is supported");
    OSPREY_CHECK(a.n_experts >= kTopK && a.n_experts <= kMoeMaxExperts, "moe_decode: n_experts = ", a.n_experts,
                 " must be in [", kTopK, ", ", kMoeMaxExperts, "]");
    OSPREY_CHECK(a.d_model > 0 && a.d_model % 32 == 0 && a.d_ff > 0 && a.d_ff % 32 == 0,
                 "moe_decode: d_model = ", a.d_model, " and d_ff = ", a.d_ff,
                 " must be positive multiples of 32 (the MXFP4 group)");
    OSPREY_CHECK(a.d_model <= 32 * kMaxGroups && a.d_ff <= 32 * kMaxGroups, "moe_decode: d_model = ", a.d_model,
                 " and d_ff = ", a.d_ff, " must be at most ", 32 * kMaxGroups,
                 " (the activation fragments a consumer warp keeps in registers)");
    if (a.n_tokens == 0) return;
    OSPREY_CHECK(a.router && a.h && a.workspace, "moe_decode: null pointer");
    for (const Mxfp4Experts* w : {&a.mlp1, &a.mlp2}) {
        OSPREY_CHECK(w->blocks && w->scales && w->bias, "moe_decode: null expert weights");
        OSPREY_CHECK(aligned16(w->blocks) && aligned16(w->scales) && aligned16(w->bias),
                     "moe_decode: expert blocks, scales and biases must be 16-byte aligned (bulk copies)");
    }
    OSPREY_CHECK(aligned16(a.h), "moe_decode: h must be 16-byte aligned");
    OSPREY_CHECK(reinterpret_cast<uintptr_t>(a.workspace) % 256 == 0, "moe_decode: workspace must be 256-byte aligned");
}

// The two launches' parameters, grids and dynamic shared memory, for a checked non-empty batch.
struct Plan {
    Params p1, p2;
    int grid1, grid2;
    size_t smem1, smem2;
};

int stage_bytes_for(int n_groups) {
    return (kRows * n_groups * 17 + kBiasBytes + 127) / 128 * 128;
}

// max_ctas: CTAs per projection (max_ctas()). Fewer when the fewest possible chunks (top_k
// experts' m-tiles) are fewer, so that no CTA is idle for any routing.
Plan plan(const MoeDecodeArgs& a, int max_ctas) {
    const Layout l = layout(a.d_model, a.d_ff);
    uint8_t* ws = static_cast<uint8_t*>(a.workspace);
    Plan pl{};
    Params& p1 = pl.p1;
    p1.blocks = a.mlp1.blocks, p1.scales = a.mlp1.scales;
    p1.bias = reinterpret_cast<const __nv_bfloat16*>(a.mlp1.bias);
    p1.router = a.router;
    p1.act = reinterpret_cast<const __nv_bfloat16*>(a.h);
    p1.u = reinterpret_cast<__nv_bfloat16*>(ws + l.u);
    p1.w = reinterpret_cast<float*>(ws + l.w);
    p1.n_tokens = a.n_tokens, p1.n_experts = a.n_experts;
    p1.n_in = a.d_model, p1.n_out = 2 * a.d_ff, p1.n_groups = a.d_model / 32;
    p1.n_ks = (p1.n_groups + kGroupsPerStep - 1) / kGroupsPerStep;
    p1.n_mtiles = p1.n_out / kRows;
    p1.stage_bytes = stage_bytes_for(p1.n_groups);
    p1.alpha = a.swiglu_alpha, p1.limit = a.swiglu_limit;

    Params& p2 = pl.p2;
    p2 = p1;
    p2.blocks = a.mlp2.blocks, p2.scales = a.mlp2.scales;
    p2.bias = reinterpret_cast<const __nv_bfloat16*>(a.mlp2.bias);
    p2.act = p1.u;
    p2.u = nullptr;
    p2.y = reinterpret_cast<float*>(ws + l.y);
    p2.w = nullptr;
    p2.n_in = a.d_ff, p2.n_out = a.d_model, p2.n_groups = a.d_ff / 32;
    p2.n_ks = (p2.n_groups + kGroupsPerStep - 1) / kGroupsPerStep;
    p2.n_mtiles = p2.n_out / kRows;
    p2.stage_bytes = stage_bytes_for(p2.n_groups);

    pl.grid1 = std::max(1, std::min(max_ctas, kTopK * p1.n_mtiles));
    pl.grid2 = std::max(1, std::min(max_ctas, kTopK * p2.n_mtiles));
    pl.smem1 = size_t(kStages) * p1.stage_bytes + kRedBufs * kRedFloats * sizeof(float);
    pl.smem2 = size_t(kStages) * p2.stage_bytes + kRedBufs * kRedFloats * sizeof(float);
    return pl;
}

#ifndef OSPREY_CUDA_EMULATION
// Every instantiation (projection x stored word layout), for the attributes set once.
constexpr void (*kKernels[])(Params) = {
    moe_decode_kernel<Proj::mlp1, Mxfp4WordLayout::published>, moe_decode_kernel<Proj::mlp2, Mxfp4WordLayout::published>,
    moe_decode_kernel<Proj::mlp1, Mxfp4WordLayout::decode>, moe_decode_kernel<Proj::mlp2, Mxfp4WordLayout::decode>};

// kCtasPerSm CTAs per SM and projection (moe_decode.h: 20b, 8 tokens, 111.6 against 145.7 us with one per
// SM; end to end 20b batch 8 1968 against 1658 tokens/s, batch 1 493 against 488, H200 2026-12-02);
// $OSPREY_MOE_DECODE_CTAS_PER_SM=1 gives the one-per-SM grids (A/B knob, read once).
int max_ctas() {
    static const int n = [] {
        const char* e = std::getenv("OSPREY_MOE_DECODE_CTAS_PER_SM");
        return sm_count() * (e && std::string_view(e) == "1" ? 1 : kCtasPerSm);
    }();
    return n;
}

// Dynamic shared memory a block of either kernel may have: the opt-in limit less the kernels' static
// shared memory (the Routing block and the barriers; asking for more is cudaErrorInvalidValue).
size_t smem_limit() {
    static const size_t n = [] {
        int device = 0, max_optin = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        size_t static_bytes = sizeof(Routing);
        for (auto kernel : kKernels) {
            cudaFuncAttributes attr{};
            CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
            static_bytes = std::max(static_bytes, attr.sharedSizeBytes);
        }
        return size_t(max_optin) - static_bytes;
    }();
    return n;
}

// Opts both kernels in, once, to all the dynamic shared memory a block may have, with the largest
// shared-memory carveout so that an mlp1 and an mlp2 CTA fit on one SM. Called before any graph
// capture (by moe_decode_workspace_bytes, which the owner calls when it sizes its workspace).
void configure() {
    thread_local const bool done = [] {  // per thread: the attribute is per device (attention_configure)
        for (auto kernel : kKernels) {
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_limit())));
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            int(cudaSharedmemCarveoutMaxShared)));
        }
        return true;
    }();
    (void)done;
}

void launch_kernel(void (*kernel)(Params), const Params& p, int grid, size_t smem, bool pdl, cudaStream_t stream) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(grid);
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
size_t moe_decode_workspace_bytes(int n_experts, int d_model, int d_ff) {
    OSPREY_CHECK(n_experts > 0 && d_model > 0 && d_ff > 0, "moe_decode_workspace_bytes: bad shape");
    configure();
    return layout(d_model, d_ff).total;
}

void moe_decode(const MoeDecodeArgs& a, cudaStream_t stream) {
    check_args(a);
    if (a.n_tokens == 0) return;
    const Plan pl = plan(a, max_ctas());
    OSPREY_CHECK(pl.smem1 <= smem_limit() && pl.smem2 <= smem_limit(), "moe_decode: d_model = ", a.d_model,
                 ", d_ff = ", a.d_ff, " need ", pl.smem1, " / ", pl.smem2, " bytes of shared memory, the device has ",
                 smem_limit());
    configure();
    // Both with programmatic dependent launch (when enabled): mlp1 waits for the kernels before it
    // (griddepcontrol.wait) before it reads anything; mlp2 streams its weights while mlp1 runs and
    // waits for it before it touches u, the counters or its outputs.
    const bool pdl = a.pdl && pdl_enabled();
    const bool dec = a.words == Mxfp4WordLayout::decode;
    launch_kernel(dec ? moe_decode_kernel<Proj::mlp1, Mxfp4WordLayout::decode>
                      : moe_decode_kernel<Proj::mlp1, Mxfp4WordLayout::published>,
                  pl.p1, pl.grid1, pl.smem1, pdl, stream);
    launch_kernel(dec ? moe_decode_kernel<Proj::mlp2, Mxfp4WordLayout::decode>
                      : moe_decode_kernel<Proj::mlp2, Mxfp4WordLayout::published>,
                  pl.p2, pl.grid2, pl.smem2, pdl, stream);
    if (a.out) {
        moe_combine({.out = a.out, .y = pl.p2.y, .expert_weights = pl.p1.w, .n_tokens = a.n_tokens,
                     .d_model = a.d_model, .top_k = kTopK, .mode = MoeCombineMode::overwrite},
                    stream);
    }
}

namespace {
__global__ void decode_layout_kernel(const uint4* src, uint4* dst, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const uint4 v = src[i];
        dst[i] = make_uint4(mxfp4_word_to_decode_layout(v.x), mxfp4_word_to_decode_layout(v.y),
                            mxfp4_word_to_decode_layout(v.z), mxfp4_word_to_decode_layout(v.w));
    }
}
}  // namespace

void mxfp4_to_decode_layout(const uint8_t* src, uint8_t* dst, size_t bytes, cudaStream_t stream) {
    OSPREY_CHECK(bytes % 16 == 0 && aligned16(src) && aligned16(dst), "mxfp4_to_decode_layout: ", bytes,
                 " bytes must be a multiple of 16 and both pointers 16-byte aligned");
    if (bytes == 0) return;
    const size_t n = bytes / 16;
    const int grid = int(std::min<size_t>((n + 255) / 256, size_t(sm_count()) * 8));
    decode_layout_kernel<<<grid, 256, 0, stream>>>(reinterpret_cast<const uint4*>(src), reinterpret_cast<uint4*>(dst),
                                                  n);
    CUDA_CHECK(cudaGetLastError());
}

MoeDecodeOutputs moe_decode_outputs(void* workspace, int d_model, int d_ff) {
    const Layout l = layout(d_model, d_ff);
    const uint8_t* ws = static_cast<const uint8_t*>(workspace);
    return {reinterpret_cast<const float*>(ws + l.y), reinterpret_cast<const float*>(ws + l.w)};
}
#endif  // OSPREY_CUDA_EMULATION

}  // namespace osprey::cuda
