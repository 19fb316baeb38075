// The decode MoE block in two launches (see moe_decode.h for the design and its bandwidth reasoning).
//
// Both kernels share one skeleton, templated on the projection:
//   1. route: every CTA recomputes top-4 + softmax of the T tokens (one warp per token, exactly as
//      moe_route.cu) and the sorted list of distinct active experts ("slots" a = 0..n_active-1).
//   2. work split: a unit is (slot a, m-tile of 16 weight rows); a unit has n_ks k-steps of 128
//      inputs (4 MXFP4 groups). The S = n_active * n_mtiles * n_ks steps, unit-major, are cut into
//      one contiguous range per warp of the grid: [S * gw / NW, S * (gw + 1) / NW). The grid is
//      sized so that NW <= S for any routing (S >= 4 experts' worth), so no range is empty.
//   3. weight stream: each lane keeps kPipe k-steps of raw weights in registers (ring buf[]), the
//      load of step f + kPipe issued right after step f is consumed.
//   4. activations: mlp1 stages h (all T tokens), mlp2 stages u of the (at most n_staged) experts
//      its CTA's range touches, both in the lane-permuted fragment order:
//          stage[step][quad i][lane = 4 * column + c][4 words], word w of quad i = elements
//          (8i + w, 8i + w + 4) of group 4 * step + c (BF16 pair, lower element in the low half).
//      mlp1 permutes h while staging; mlp1 writes u in moe_u_column order, which is that order.
//   5. a unit completed inside one warp goes straight to the epilogue; otherwise each warp writes
//      its partial accumulators (a "piece") to scratch, and the last to arrive (atomic counter per
//      unit) adds all pieces in warp order, runs the epilogue and resets the counter.
//   6. epilogues: mlp1 adds b1, applies the clamped SwiGLU and stores u (BF16); mlp2 adds b2, stores
//      y per routed row, and the last of the n_active units of an m-tile to arrive sums
//      out[t] = Σ_slot w · y[t, slot] in slot order (as moe_combine) and resets that counter.
// mlp2 is launched with programmatic dependent launch: its routing and first weight loads run while
// mlp1 drains; griddepcontrol.wait precedes every read of u and every write.
//
// scripts/emulate_moe_decode.sh runs this file's device code on the CPU (tests/kernels/emu): the
// parts under #ifndef OSPREY_CUDA_EMULATION are what the emulation replaces (PTX, launches).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/moe_decode.h"
#include "kernels/cuda/moe_route.h"
#include "kernels/cuda/moe_topk.cuh"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kMaxTokens = kMoeDecodeMaxTokens;
constexpr int kTopK = 4;
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kCtasPerSm = 2;
constexpr int kPipe = 4;                        // k-steps of weights in flight per lane
constexpr int kGroupsPerStep = 4;               // MXFP4 groups per k-step: group 4 s + c for lane quad c
constexpr int kStepBytes = 4 * 32 * 16;         // staged activations per k-step (4 quads x 32 lanes x 16 B)
constexpr int kMaxActive = kTopK * kMaxTokens;  // distinct experts of a batch at most
constexpr int kPieceFloats = 4 * 32;            // one warp's 16 x 8 accumulators
constexpr int kMaxPerLane = kMoeMaxExperts / 32;
// Decoded weights are FP4 · 2^(scale - 159): the BF16 multiplier 2^(scale - 33) has exponent field
// scale + 94 (valid for scale <= 160); the accumulators are multiplied back by 2^32.
constexpr uint32_t kScaleExponentBias = 127 - 33;
constexpr float kUnscale = 4294967296.0f;  // 2^32
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
    float* out;                 // mlp2: [T, n_out]
    float* pieces;              // [warps of the grid, 2, kPieceFloats] split-unit partial sums
    int* unit_count;            // [kMaxActive * n_mtiles] arrivals per unit (zero between calls)
    int* tile_count;            // mlp2: [n_mtiles] arrivals per output m-tile (zero between calls)
    int n_tokens, n_experts, n_in, n_out, n_groups, n_ks, n_mtiles;
    int n_staged;  // mlp2: expert buffers of staged u per CTA
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

#ifndef OSPREY_CUDA_EMULATION
__device__ __forceinline__ void griddep_wait() {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void griddep_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;\n" ::);
}

// Streaming 16-byte load of data read once (weights): not kept in L1.
__device__ __forceinline__ uint4 ldg_stream(const uint8_t* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
#endif  // OSPREY_CUDA_EMULATION

// Nibbles j and j + 4 of w (elements 8i + j, 8i + j + 4 of the group) as one BF16x2 of FP4 · 2^-126:
// with the two nibbles isolated at bits [3:0] and [19:16] (mul 4160 = 2^12 + 2^6) or [7:4] and
// [23:20] (mul 260 = 2^8 + 2^2), the product holds each nibble twice without carries; the mask keeps
// the sign from the high copy (bit 15) and e1 e0 m from the low copy (bits 8:6), in both halves.
__device__ __forceinline__ uint32_t fp4_pair(uint32_t isolated, uint32_t mul) {
    return (isolated * mul) & 0x81C081C0u;
}

// The 8 nibbles of w as 4 BF16x2 pairs (elements (0,4), (1,5), (2,6), (3,7)) times scale2.
__device__ __forceinline__ void decode_fp4x8(uint32_t w, uint32_t scale2, uint32_t (&r)[4]) {
    const uint32_t hi = w >> 8;
    r[0] = bf16x2_mul(fp4_pair(w & 0x000F000Fu, 4160u), scale2);
    r[1] = bf16x2_mul(fp4_pair(w & 0x00F000F0u, 260u), scale2);
    r[2] = bf16x2_mul(fp4_pair(hi & 0x000F000Fu, 4160u), scale2);
    r[3] = bf16x2_mul(fp4_pair(hi & 0x00F000F0u, 260u), scale2);
}

// One k-step: 8 mma over the lane's 32 elements of rows g and g + 8 (A) and the staged activations
// b = stage[step][quad][lane] (B). Two accumulator sets halve the mma dependency chain.
__device__ __forceinline__ void compute_step(const Chunk& ch, const uint4* b, float (&acc0)[4], float (&acc1)[4]) {
    const uint32_t sa = (ch.sa + kScaleExponentBias) * 0x00800080u;
    const uint32_t sb = (ch.sb + kScaleExponentBias) * 0x00800080u;
    const uint32_t wa[4] = {ch.wa.x, ch.wa.y, ch.wa.z, ch.wa.w};
    const uint32_t wb[4] = {ch.wb.x, ch.wb.y, ch.wb.z, ch.wb.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint32_t ra[4], rb[4];
        decode_fp4x8(wa[i], sa, ra);
        decode_fp4x8(wb[i], sb, rb);
        const uint4 x = b[i * 32];
        // A: a0 = (row g, k 2c..2c+1), a1 = (row g+8, same k), a2 = (row g, k 2c+8..2c+9), a3 = (row g+8).
        mma_bf16(acc0, ra[0], rb[0], ra[1], rb[1], x.x, x.y);
        mma_bf16(acc1, ra[2], rb[2], ra[3], rb[3], x.z, x.w);
    }
}

// Fills rt for the whole CTA (ends with __syncthreads). Bit-identical to moe_route_topk.
__device__ void route(const Params& p, Routing& rt) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (warp < p.n_tokens) {
        const int t = warp;
        warp_route_topk<kTopK, kMaxPerLane>(p.router + size_t(t) * p.n_experts, nullptr, p.n_experts,
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

// The position of a lane's weights in the flattened step list, advanced one k-step at a time.
struct StepCursor {
    int slot, mtile, step;

    __device__ void init(int64_t f, const Params& p) {
        const int64_t unit = f / p.n_ks;
        step = int(f - unit * p.n_ks);
        slot = int(unit / p.n_mtiles);
        mtile = int(unit - int64_t(slot) * p.n_mtiles);
    }
    __device__ void next_unit(const Params& p) {
        step = 0;
        if (++mtile == p.n_mtiles) mtile = 0, ++slot;
    }
};

struct WeightStream {
    StepCursor at;
    const uint8_t* blk;  // row g's group c of the current unit (k-step 0)
    const uint8_t* sc;   // row g's scale of group c (k-step 0)
    size_t blk8, sc8;    // offsets of row g + 8

    __device__ void seek_row(const Params& p, const Routing& rt, int g, int c) {
        if (at.slot >= rt.n_active) return;  // past the last unit: never loaded
        const size_t row = size_t(rt.active[at.slot]) * p.n_out + at.mtile * 16 + g;
        blk = p.blocks + (row * p.n_groups + c) * 16;
        sc = p.scales + row * p.n_groups + c;
    }
    __device__ void load(Chunk& ch, const Params& p, int c) const {
        if (kGroupsPerStep * at.step + c < p.n_groups) {
            ch.wa = ldg_stream(blk + at.step * (kGroupsPerStep * 16));
            ch.wb = ldg_stream(blk + blk8 + at.step * (kGroupsPerStep * 16));
            ch.sa = __ldg(sc + at.step * kGroupsPerStep);
            ch.sb = __ldg(sc + sc8 + at.step * kGroupsPerStep);
        } else {  // past the last group of the row: zero weights (the staged activations are zero too)
            ch.wa = ch.wb = make_uint4(0u, 0u, 0u, 0u);
            ch.sa = ch.sb = 0u;
        }
    }
    __device__ void advance(const Params& p, const Routing& rt, int g, int c) {
        if (++at.step == p.n_ks) {
            at.next_unit(p);
            seek_row(p, rt, g, c);
        }
    }
};

__device__ __forceinline__ float swiglu(float gate, float up, float alpha, float limit) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    return gate / (1.0f + __expf(-alpha * gate)) * (up + 1.0f);
}

// Warp-level split bookkeeping of one kernel launch.
struct Split {
    int64_t S;  // steps
    int n_warps, n_ks;
    __device__ int64_t first_step(int w) const { return S * w / n_warps; }
    // The warp whose range holds step f (ranges are non-empty: n_warps <= S).
    __device__ int warp_of(int64_t f) const { return int(((f + 1) * n_warps - 1) / S); }
    // Piece slot of unit u in warp w's scratch: 0 when u is the warp's first unit, else 1 (its last).
    __device__ int piece_slot(int w, int64_t u) const { return u == first_step(w) / n_ks ? 0 : 1; }
};

// Completes unit u's accumulators acc over its k-steps [s_begin, s_end) of this warp. Returns true
// (with acc = the whole unit's sum) when this warp must run the epilogue.
__device__ bool complete_unit(const Params& p, const Split& sp, int gw, int64_t u, int s_begin, int s_end,
                              float (&acc)[4]) {
    if (s_begin == 0 && s_end == p.n_ks) return true;
    const int lane = threadIdx.x % 32;
    float* mine = p.pieces + (size_t(gw) * 2 + sp.piece_slot(gw, u)) * kPieceFloats;
#pragma unroll
    for (int j = 0; j < 4; ++j) __stcg(mine + j * 32 + lane, acc[j]);
    __threadfence();
    __syncwarp();
    const int w_first = sp.warp_of(u * p.n_ks), w_last = sp.warp_of((u + 1) * p.n_ks - 1);
    int arrived = 0;
    if (lane == 0) arrived = atomicAdd(p.unit_count + u, 1);
    arrived = __shfl_sync(0xffffffffu, arrived, 0);
    if (arrived != w_last - w_first) return false;  // another piece is still missing
    __threadfence();
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j] = 0.0f;
    for (int w = w_first; w <= w_last; ++w) {  // in k order, whoever arrived last
        const float* piece = p.pieces + (size_t(w) * 2 + sp.piece_slot(w, u)) * kPieceFloats;
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[j] += __ldcg(piece + j * 32 + lane);
    }
    if (lane == 0) p.unit_count[u] = 0;  // every arrival of this launch is in: ready for the next call
    return true;
}

// acc: rows (mt * 16 + g, + 8) x columns (2c, 2c + 1) of active slot a, scaled by 2^-32.
__device__ void epilogue_mlp1(const Params& p, const Routing& rt, int a, int mt, const float (&acc)[4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int e = rt.active[a];
    const int fa = mt * 16 + g, fb = fa + 8;  // weight rows of expert e
    const float bias_a = __bfloat162float(p.bias[size_t(e) * p.n_out + fa]);
    const float bias_b = __bfloat162float(p.bias[size_t(e) * p.n_out + fb]);
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

__device__ void epilogue_mlp2(const Params& p, const Routing& rt, int a, int mt, const float (&acc)[4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int e = rt.active[a];
    const int fa = mt * 16 + g, fb = fa + 8;
    const float bias_a = __bfloat162float(p.bias[size_t(e) * p.n_out + fa]);
    const float bias_b = __bfloat162float(p.bias[size_t(e) * p.n_out + fb]);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int n = 2 * c + k;  // column = n-th token routed to e
        if (n < rt.count[a]) {
            float* y = p.y + size_t(rt.col_row[a][n]) * p.n_out;
            __stcg(y + fa, acc[k] * kUnscale + bias_a);
            __stcg(y + fb, acc[2 + k] * kUnscale + bias_b);
        }
    }
    __threadfence();
    __syncwarp();
    int arrived = 0;
    if (lane == 0) arrived = atomicAdd(p.tile_count + mt, 1);
    arrived = __shfl_sync(0xffffffffu, arrived, 0);
    if (arrived != rt.n_active - 1) return;  // other experts' rows of this tile still missing
    __threadfence();
    for (int i = lane; i < p.n_tokens * 16; i += 32) {  // out = Σ_slot w · y, slot order
        const int t = i / 16, r = mt * 16 + i % 16;
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < kTopK; ++k) sum += rt.w[t * kTopK + k] * __ldcg(p.y + size_t(t * kTopK + k) * p.n_out + r);
        p.out[size_t(t) * p.n_out + r] = sum;
    }
    if (lane == 0) p.tile_count[mt] = 0;
}

// Stages one activation row (column `col` of the B operand) into `stage` in fragment order; groups
// past n_groups (up to the k-step boundary) are zero. mlp1 rows are in natural order and get
// paired (i, i + 4) here; mlp2 rows (u) are stored paired already.
template <Proj kProj>
__device__ void stage_rows(const Params& p, uint4* stage, int n_cols, const int8_t* col_row) {
    const int n_quads = p.n_ks * kGroupsPerStep * 4;  // 16-byte quads per staged row
    for (int i = threadIdx.x; i < n_cols * n_quads; i += kThreads) {
        const int col = i / n_quads, rem = i - col * n_quads;
        const int group = rem / 4, quad = rem % 4;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (group < p.n_groups) {
            const int src_row = kProj == Proj::mlp1 ? col : col_row[col];
            const uint4 x = *reinterpret_cast<const uint4*>(p.act + size_t(src_row) * p.n_in + group * 32 + quad * 8);
            if constexpr (kProj == Proj::mlp1) {  // (e0 e1)(e2 e3)(e4 e5)(e6 e7) -> (e0 e4)(e1 e5)(e2 e6)(e3 e7)
                v.x = __byte_perm(x.x, x.z, 0x5410), v.y = __byte_perm(x.x, x.z, 0x7632);
                v.z = __byte_perm(x.y, x.w, 0x5410), v.w = __byte_perm(x.y, x.w, 0x7632);
            } else {
                v = x;
            }
        }
        const int step = group / kGroupsPerStep, c = group % kGroupsPerStep;
        stage[(step * 4 + quad) * 32 + col * 4 + c] = v;
    }
}

template <Proj kProj>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) moe_decode_kernel(const Params p) {
    extern __shared__ __align__(16) uint8_t smem[];  // staged activations: [n_staged or 1][n_ks][kStepBytes]
    __shared__ Routing rt;
    if constexpr (kProj == Proj::mlp1) griddep_launch_dependents();  // mlp2 may start its prologue

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
    route(p, rt);  // reads only the router logits (written before mlp1 started)

    Split sp;
    sp.S = int64_t(rt.n_active) * p.n_mtiles * p.n_ks;
    sp.n_warps = gridDim.x * kWarps;
    sp.n_ks = p.n_ks;
    const int gw = blockIdx.x * kWarps + warp;
    const int64_t f0 = sp.first_step(gw), f1 = sp.first_step(gw + 1);

    // First kPipe k-steps of weights in flight before anything else.
    WeightStream ws{};
    ws.blk8 = size_t(8) * p.n_groups * 16, ws.sc8 = size_t(8) * p.n_groups;
    ws.at.init(f0, p);
    ws.seek_row(p, rt, g, c);
    Chunk buf[kPipe];
#pragma unroll
    for (int d = 0; d < kPipe; ++d) {
        if (f0 + d < f1) {
            ws.load(buf[d], p, c);
            ws.advance(p, rt, g, c);
        }
    }

    // Activations.
    int slot_lo = 0;
    if constexpr (kProj == Proj::mlp1) {
        stage_rows<kProj>(p, reinterpret_cast<uint4*>(smem), p.n_tokens, nullptr);
    } else {
        griddep_wait();  // u (and the counters, scratch) belong to mlp1 until it has finished
        const int64_t cta_f0 = sp.first_step(blockIdx.x * kWarps), cta_f1 = sp.first_step((blockIdx.x + 1) * kWarps);
        slot_lo = int(cta_f0 / p.n_ks / p.n_mtiles);
        const int slot_hi = int((cta_f1 - 1) / p.n_ks / p.n_mtiles);
        if (slot_hi - slot_lo + 1 > p.n_staged) __trap();  // the host's bound (moe_decode) is wrong
        for (int a = slot_lo; a <= slot_hi; ++a)
            stage_rows<kProj>(p, reinterpret_cast<uint4*>(smem + size_t(a - slot_lo) * p.n_ks * kStepBytes),
                              rt.count[a], rt.col_row[a]);
    }
    __syncthreads();

    // Main loop: unit by unit; inside a unit, k-steps through the register ring (buf[d] with a
    // compile-time d: the ring position is matched against each unrolled d).
    StepCursor cur;
    cur.init(f0, p);
    int64_t f = f0;
    int ring = 0;
    while (f < f1) {
        const int s_begin = cur.step;
        int left = int(std::min<int64_t>(p.n_ks - s_begin, f1 - f));
        const int buffer = kProj == Proj::mlp1 ? 0 : cur.slot - slot_lo;  // mlp1: h serves every expert
        const uint4* stage = reinterpret_cast<const uint4*>(smem + size_t(buffer) * p.n_ks * kStepBytes) + lane;
        float acc0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int s = s_begin;
        while (left > 0) {
#pragma unroll
            for (int d = 0; d < kPipe; ++d) {
                if (d == ring && left > 0) {
                    compute_step(buf[d], stage + s * 128, acc0, acc1);
                    if (f + kPipe < f1) {
                        ws.load(buf[d], p, c);
                        ws.advance(p, rt, g, c);
                    }
                    ++s, ++f, --left;
                    ring = d + 1 == kPipe ? 0 : d + 1;
                }
            }
        }
        float acc[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[j] = acc0[j] + acc1[j];
        const int64_t u = int64_t(cur.slot) * p.n_mtiles + cur.mtile;
        if (complete_unit(p, sp, gw, u, s_begin, s, acc)) {
            if constexpr (kProj == Proj::mlp1) {
                epilogue_mlp1(p, rt, cur.slot, cur.mtile, acc);
            } else {
                epilogue_mlp2(p, rt, cur.slot, cur.mtile, acc);
            }
        }
        cur.next_unit(p);
    }
}

// Workspace layout (offsets in bytes, each part 256-byte aligned).
struct Layout {
    size_t u, y, pieces, count1, count2, tiles, total;
};

size_t align256(size_t n) {
    return (n + 255) / 256 * 256;
}

// max_ctas: the most CTAs a projection's grid may have (kCtasPerSm per SM).
Layout layout(int n_experts, int d_model, int d_ff, int max_ctas) {
    const int max_active = std::min(n_experts, kMaxActive);
    Layout l{};
    size_t at = 0;
    l.u = at, at += align256(sizeof(bf16) * kMaxTokens * kTopK * d_ff);
    l.y = at, at += align256(sizeof(float) * kMaxTokens * kTopK * d_model);
    l.pieces = at, at += align256(sizeof(float) * size_t(max_ctas) * kWarps * 2 * kPieceFloats);
    l.count1 = at, at += align256(sizeof(int) * size_t(max_active) * (2 * d_ff / 16));
    l.count2 = at, at += align256(sizeof(int) * size_t(max_active) * (d_model / 16));
    l.tiles = at, at += align256(sizeof(int) * size_t(d_model / 16));
    l.total = at;
    return l;
}

// CTAs of a projection: at most max_ctas, and few enough that every warp gets at least one k-step
// when only top_k experts are active (the fewest possible).
int grid_for(int n_mtiles, int n_ks, int max_ctas) {
    const int64_t min_steps = int64_t(kTopK) * n_mtiles * n_ks;
    return int(std::max<int64_t>(1, std::min<int64_t>(max_ctas, min_steps / kWarps)));
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
    if (a.n_tokens == 0) return;
    OSPREY_CHECK(a.out && a.router && a.h && a.workspace, "moe_decode: null pointer");
    for (const Mxfp4Experts* w : {&a.mlp1, &a.mlp2}) {
        OSPREY_CHECK(w->blocks && w->scales && w->bias, "moe_decode: null expert weights");
        OSPREY_CHECK(aligned16(w->blocks), "moe_decode: expert blocks must be 16-byte aligned");
    }
    OSPREY_CHECK(aligned16(a.h), "moe_decode: h must be 16-byte aligned");
    OSPREY_CHECK(reinterpret_cast<uintptr_t>(a.workspace) % 256 == 0, "moe_decode: workspace must be 256-byte aligned");
    // Counters and unit indices are 32-bit.
    OSPREY_CHECK(int64_t(kMaxActive) * (2 * a.d_ff / 16) < (int64_t(1) << 30), "moe_decode: d_ff too large");
}

// The two launches' parameters, grids and dynamic shared memory, for a checked non-empty batch.
struct Plan {
    Params p1, p2;
    int grid1, grid2;
    size_t smem1, smem2;
};

Plan plan(const MoeDecodeArgs& a, int max_ctas) {
    const Layout l = layout(a.n_experts, a.d_model, a.d_ff, max_ctas);
    uint8_t* ws = static_cast<uint8_t*>(a.workspace);
    const int max_active = std::min(a.n_experts, kTopK * a.n_tokens);
    Plan pl{};
    Params& p1 = pl.p1;
    p1.blocks = a.mlp1.blocks, p1.scales = a.mlp1.scales;
    p1.bias = reinterpret_cast<const __nv_bfloat16*>(a.mlp1.bias);
    p1.router = a.router;
    p1.act = reinterpret_cast<const __nv_bfloat16*>(a.h);
    p1.u = reinterpret_cast<__nv_bfloat16*>(ws + l.u);
    p1.pieces = reinterpret_cast<float*>(ws + l.pieces);
    p1.unit_count = reinterpret_cast<int*>(ws + l.count1);
    p1.n_tokens = a.n_tokens, p1.n_experts = a.n_experts;
    p1.n_in = a.d_model, p1.n_out = 2 * a.d_ff, p1.n_groups = a.d_model / 32;
    p1.n_ks = (p1.n_groups + kGroupsPerStep - 1) / kGroupsPerStep;
    p1.n_mtiles = p1.n_out / 16;
    p1.n_staged = 1;
    p1.alpha = a.swiglu_alpha, p1.limit = a.swiglu_limit;

    Params& p2 = pl.p2;
    p2 = p1;
    p2.blocks = a.mlp2.blocks, p2.scales = a.mlp2.scales;
    p2.bias = reinterpret_cast<const __nv_bfloat16*>(a.mlp2.bias);
    p2.act = p1.u;
    p2.u = nullptr;
    p2.y = reinterpret_cast<float*>(ws + l.y);
    p2.out = a.out;
    p2.unit_count = reinterpret_cast<int*>(ws + l.count2);
    p2.tile_count = reinterpret_cast<int*>(ws + l.tiles);
    p2.n_in = a.d_ff, p2.n_out = a.d_model, p2.n_groups = a.d_ff / 32;
    p2.n_ks = (p2.n_groups + kGroupsPerStep - 1) / kGroupsPerStep;
    p2.n_mtiles = p2.n_out / 16;

    pl.grid1 = grid_for(p1.n_mtiles, p1.n_ks, max_ctas);
    pl.grid2 = grid_for(p2.n_mtiles, p2.n_ks, max_ctas);
    // Experts a CTA of mlp2 can touch: its range has at most ceil(S / grid) steps, i.e. at most
    // ceil(steps / n_ks) + 1 units, i.e. at most ceil(units / n_mtiles) + 1 experts.
    const int64_t s_max = int64_t(max_active) * p2.n_mtiles * p2.n_ks;
    const int64_t steps = (s_max + pl.grid2 - 1) / pl.grid2;
    const int64_t units = (steps + p2.n_ks - 1) / p2.n_ks + 1;
    p2.n_staged = int(std::min<int64_t>(max_active, (units + p2.n_mtiles - 1) / p2.n_mtiles + 1));
    pl.smem1 = size_t(p1.n_ks) * kStepBytes;
    pl.smem2 = size_t(p2.n_staged) * p2.n_ks * kStepBytes;
    return pl;
}

#ifndef OSPREY_CUDA_EMULATION
int max_ctas() {
    static const int n = kCtasPerSm * sm_count();
    return n;
}

// Dynamic shared memory a block of either kernel may have: the opt-in limit less the kernels' static
// shared memory (the Routing block and whatever else the compiler placed there; asking for more is
// cudaErrorInvalidValue).
size_t smem_limit() {
    static const size_t n = [] {
        int device = 0, max_optin = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        size_t static_bytes = sizeof(Routing);
        for (auto kernel : {moe_decode_kernel<Proj::mlp1>, moe_decode_kernel<Proj::mlp2>}) {
            cudaFuncAttributes attr{};
            CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
            static_bytes = std::max(static_bytes, attr.sharedSizeBytes);
        }
        return size_t(max_optin) - static_bytes;
    }();
    return n;
}

// Opts both kernels in, once, to all the dynamic shared memory a block may have. Called before any
// graph capture (by moe_decode_workspace_bytes, which the owner calls when it sizes its workspace).
void configure() {
    thread_local const bool done = [] {  // per thread: the attribute is per device (attention_configure)
        for (auto kernel : {moe_decode_kernel<Proj::mlp1>, moe_decode_kernel<Proj::mlp2>})
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_limit())));
        return true;
    }();
    (void)done;
}
#endif  // OSPREY_CUDA_EMULATION

}  // namespace

#ifndef OSPREY_CUDA_EMULATION
size_t moe_decode_workspace_bytes(int n_experts, int d_model, int d_ff) {
    OSPREY_CHECK(n_experts > 0 && d_model > 0 && d_ff > 0, "moe_decode_workspace_bytes: bad shape");
    configure();
    return layout(n_experts, d_model, d_ff, max_ctas()).total;
}

void moe_decode(const MoeDecodeArgs& a, cudaStream_t stream) {
    check_args(a);
    if (a.n_tokens == 0) return;
    const Plan pl = plan(a, max_ctas());
    OSPREY_CHECK(pl.smem1 <= smem_limit() && pl.smem2 <= smem_limit(), "moe_decode: d_model = ", a.d_model,
                 ", d_ff = ", a.d_ff, " need ", pl.smem1, " / ", pl.smem2, " bytes of shared memory, the device has ",
                 smem_limit());
    configure();

    moe_decode_kernel<Proj::mlp1><<<pl.grid1, kThreads, pl.smem1, stream>>>(pl.p1);
    CUDA_CHECK(cudaGetLastError());

    // mlp2 may start (routing, first weight loads) while mlp1 drains; it waits for mlp1 before
    // touching u, the scratch and the counters.
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(pl.grid2);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = pl.smem2;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = a.pdl ? 1 : 0;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, moe_decode_kernel<Proj::mlp2>, pl.p2));
}
#endif  // OSPREY_CUDA_EMULATION

}  // namespace osprey::cuda
