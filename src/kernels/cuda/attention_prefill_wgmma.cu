#include "kernels/cuda/attention_prefill_wgmma.h"

#include <cuda_bf16.h>

#include <cmath>
#include <climits>
#include <cstdint>

#include "kernels/cuda/attention_kv.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/kv_fp8.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/wgmma.cuh"

namespace osprey::cuda {
namespace {

// The CTA: warpgroup 0 produces (loads Q, then K/V tiles), warpgroups 1..kConsumers consume: each owns
// 64 query rows = 8 tokens x the group's 8 heads. Row r of a consumer is token r / 8 of its 8 (the
// item's token 8 * wg + r / 8) and head g * 8 + r % 8; so in the wgmma fragments warp w's rows r and
// r + 8 (r = lane / 4) are tokens 2w and 2w + 1 of the consumer, head lane / 4, as in the mma.sync
// kernel (attention_prefill.cu). What varies between variants (attention.h, kAttnWgmmaVariants) is
// compile-time: Cfg<V>.
constexpr int kD = kAttnHeadDim;  // 64: one 128-byte swizzled row per Q/K/V row
constexpr int kWgThreads = 128;
constexpr int kRowBytes = kD * 2;  // 128
// log2(e) / sqrt(head_dim): scores are kept unscaled (raw q·k) and scaled inside exp2.
constexpr float kScaleLog2 = 1.4426950408889634f * 0.125f;
constexpr float kScale = 0.125f;  // 1 / sqrt(64)
static_assert(kD == 64 && kAttnGroup == 8);

template <int V>
struct Cfg {
    static constexpr AttnWgmmaVariant kVariant = kAttnWgmmaVariants[V];
    static constexpr int kConsumers = kVariant.consumers;
    static constexpr int kRows = kConsumers * 64;     // query rows per CTA
    static constexpr int kBlockN = kVariant.block_n;  // keys per K/V tile
    static constexpr int kStages = kVariant.stages;   // K/V tiles in the ring (>= 3: the producer
                                                      // signals tile i - 1 after issuing tile i)
    static constexpr bool kPersistent = kVariant.persistent;
    static constexpr int kQBufs = kPersistent ? 2 : 1;  // Q of the next unit loads while this one runs
    static constexpr int kProducerRegs = kVariant.producer_regs, kConsumerRegs = kVariant.consumer_regs;
    static constexpr bool kPolyExp = kVariant.poly_exp;
    static constexpr bool kWaitPv = kVariant.wait_pv;
    static constexpr int kThreads = kWgThreads * (1 + kConsumers);
    static constexpr int kQBytes = kRows * kRowBytes;       // 16 KB per 2 consumers
    static constexpr int kTileBytes = kBlockN * kRowBytes;  // 16 KB per K or V tile of 128 keys
    static constexpr int kBarriers = 2 * kStages + 2 * kQBufs;
    static constexpr int kSmemBytes =
        1024 /* alignment slack */ + kQBufs * kQBytes + 2 * kStages * kTileBytes + 8 * kBarriers;
    static_assert(kRows / kAttnGroup == wgmma_prefill_tokens(V));
    static_assert(kConsumers >= 2 && kConsumers <= 3 && (kBlockN == 64 || kBlockN == 128) && kStages >= 3);
    static_assert(kSmemBytes <= 227 * 1024, "more than the opt-in shared memory of one Hopper block");
    // Registers per thread at launch (one CTA per SM, allocated in units of 8): setmaxnreg.inc only takes
    // what the CTA's own warps released, so the budgets must fit in what it was launched with (168 x
    // 384 threads, 128 x 512), or the consumers' inc waits forever. ptxas -v reports this launch count.
    static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
    static_assert(kProducerRegs == 0 || (kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0 && kProducerRegs >= 24 &&
                                         kConsumerRegs <= 256 &&
                                         kProducerRegs + kConsumers * kConsumerRegs <= (1 + kConsumers) * kLaunchRegs),
                  "setmaxnreg budgets exceed the registers the CTA is launched with");
};

struct Smem {
    uint8_t* q;         // [kQBufs][kRows][128 B] swizzled
    uint8_t* k;         // [kStages][kBlockN][128 B] swizzled
    uint8_t* v;         // [kStages][kBlockN][128 B] swizzled
    uint64_t* full;     // [kStages] tile landed (kWgThreads producer arrivals)
    uint64_t* empty;    // [kStages] tile consumed (kConsumers * kWgThreads arrivals)
    uint64_t* q_full;   // [kQBufs] Q landed (kWgThreads producer arrivals)
    uint64_t* q_empty;  // [kQBufs] Q read by the unit's last S (kConsumers * kWgThreads arrivals)
};

// The u-th (item, KV head) unit of this CTA, as an index into n_items x n_kv_heads (KV head slowest:
// CTAs running together share one head's K/V in L2; items in reverse plan order: a slice's last items
// have the most keys, so the longest units start first). Without persistence the grid has a CTA per
// unit and u = 0. Persistent CTAs take a round of gridDim.x units per u, in snake order (odd rounds
// reversed), so that the per-CTA sums of the descending unit costs balance.
__device__ __forceinline__ int attention_wgmma_unit(int u) {
    const int n = int(gridDim.x), c = int(blockIdx.x);
    return u * n + ((u & 1) ? n - 1 - c : c);
}

// Producer: thread t copies 16-byte chunk t % 8 of rows t / 8, t / 8 + 16, ... (a warp covers 4 whole
// 128-byte rows per instruction), into the swizzled position. A tile's rows past the item's keys are
// zero-filled (V must be finite there: P is 0 but 0 · NaN is not). Completion is signalled one tile
// late: wait for tile n - 1's copies, make them visible to the async proxy (wgmma), then arrive. The
// ring position n runs on across the units of a persistent CTA, as does the consumers'.
template <class C>
__device__ void attention_wgmma_produce(const AttnArgs& a, const AttnItem* items, int n_items, const Smem& sm) {
    if constexpr (C::kProducerRegs > 0) sm90::reg_dealloc<C::kProducerRegs>();
    const int t = threadIdx.x % kWgThreads;
    const int c = t % 8, sub = t / 8;
    const __nv_bfloat16* qkv = reinterpret_cast<const __nv_bfloat16*>(a.qkv);
    const int n_units = n_items * a.n_kv_heads;
    int n = 0;        // K/V tiles issued by this CTA (all units): the ring position
    int q_prev = -1;  // Q buffer whose copies joined tile n - 1's group (-1: none)
    auto signal_previous = [&] {
        sm90::fence_proxy_async();
        if (q_prev >= 0) sm90::mbar_arrive(&sm.q_full[q_prev]);
        sm90::mbar_arrive(&sm.full[(n - 1) % C::kStages]);
    };
    for (int u = 0;; ++u) {
        const int w = attention_wgmma_unit(u);
        if (w >= n_units) break;
        const int g = w / n_items;
        const AttnItem it = items[n_items - 1 - w % n_items];
        const int n_tiles = (it.key_end - it.key_begin + C::kBlockN - 1) / C::kBlockN;  // >= 1
        const int qb = u % C::kQBufs;
        sm90::mbar_wait(&sm.q_empty[qb], ((u / C::kQBufs) & 1) ^ 1);  // the buffer's previous Q is read
        uint8_t* q = sm.q + qb * C::kQBytes;
#pragma unroll
        for (int i = 0; i < C::kRows / 16; ++i) {
            const int r = sub + 16 * i, tok = r / kAttnGroup, h = r % kAttnGroup;
            const bool valid = tok < it.n_q;
            const size_t off = valid ? size_t(it.q_token + tok) * a.ld_qkv + (g * kAttnGroup + h) * kD + c * 8 : 0;
            cp_async16(q + sm90::sw128_offset(r, c * 8), qkv + off, valid);
        }
        for (int i = 0; i < n_tiles; ++i, ++n) {
            const int s = n % C::kStages;
            sm90::mbar_wait(&sm.empty[s], ((n / C::kStages) & 1) ^ 1);
            const int kt = it.key_begin + i * C::kBlockN;
#pragma unroll 4
            for (int rr = 0; rr < C::kBlockN / 16; ++rr) {
                const int key = sub + 16 * rr, j = kt + key;
                const bool valid = j < it.key_end;
                const uint32_t dst = s * C::kTileBytes + sm90::sw128_offset(key, c * 8);
                if (a.cache8.on()) {
                    // FP8 cache: dequantised to bf16 here (plain loads and stores, complete before the
                    // fence of signal_previous, which covers them as it covers the cp.async copies).
                    uint4 kx = make_uint4(0, 0, 0, 0), vx = kx;
                    if (valid) {
                        const uint8_t *kp, *vp;
                        const float *ksp, *vsp;
                        attention_kv_rows_fp8(a, it, g, j, kp, vp, ksp, vsp);
                        kx = kv_fp8x8_to_bf16x8(*reinterpret_cast<const uint2*>(kp + c * 8), *ksp);
                        vx = kv_fp8x8_to_bf16x8(*reinterpret_cast<const uint2*>(vp + c * 8), *vsp);
                    }
                    *reinterpret_cast<uint4*>(sm.k + dst) = kx;
                    *reinterpret_cast<uint4*>(sm.v + dst) = vx;
                    continue;
                }
                const __nv_bfloat16 *kp = qkv, *vp = qkv;
                if (valid) attention_kv_rows(a, it, g, j, kp, vp);
                cp_async16(sm.k + dst, kp + (valid ? c * 8 : 0), valid);
                cp_async16(sm.v + dst, vp + (valid ? c * 8 : 0), valid);
            }
            cp_async_commit();
            if (n > 0) {
                cp_async_wait<1>();
                signal_previous();
            }
            q_prev = i == 0 ? qb : -1;  // Q was in the unit's first group
        }
    }
    cp_async_wait<0>();
    if (n > 0) signal_previous();
}

// O += P · V for one tile: kBlockN / 16 k-steps of 16 keys, P from registers, V MN-major (rows of
// 128 B per key, 8-key groups 1024 B apart, a k-step = 2048 B).
template <class C>
__device__ __forceinline__ void attention_wgmma_pv(float (&o)[32], const uint32_t (&p)[C::kBlockN / 16][4],
                                                   uint64_t v_desc) {
#pragma unroll
    for (int kk = 0; kk < C::kBlockN / 16; ++kk)
        sm90::wgmma_m64n64k16_rs_mn(o, p[kk], v_desc + uint64_t(kk * 16 * kRowBytes / 16), true);
}

// Online-softmax state of a thread's two fragment rows (x = 0: row r, 1: row r + 8).
struct SoftmaxRows {
    float m[2] = {-INFINITY, -INFINITY};  // running max of the raw scores q·k
    float l[2] = {0.f, 0.f};              // this thread's part of the sum of exp(kScale · (s - m))
    int pos[2];                           // query positions
    bool live[2];                         // token inside the item
};

// 2^x on the FMA/ALU pipes, for the share of the softmax's exponentials taken off the MUFU unit
// (head_dim 64 does as many exp2 per tile as its MMAs take cycles): x = j + f with j = round(x) and
// |f| <= 1/2, 2^f by a cubic fitted for relative error (< 7.5e-5, against P's bf16 rounding of 2^-9),
// and j added to the exponent field. The integer j comes from the low mantissa bits of x + 1.5 · 2^23.
// x < -125 (masked keys: -inf) gives 0.
__device__ __forceinline__ float attention_exp2_poly(float x) {
    const float xc = fmaxf(x, -125.f);
    const float t = xc + 12582912.f;
    const float f = xc - (t - 12582912.f);
    const float p = fmaf(fmaf(fmaf(0.0551716487f, f, 0.242611215f), f, 0.693260997f), f, 0.999928068f);
    const float r = __uint_as_float(__float_as_uint(p) + (__float_as_uint(t) << 23));
    return x < -125.f ? 0.f : r;
}

// Masks S (raw scores of tile kt, accumulator layout) if kMask, updates the running max and sums,
// writes P = exp(kScale · (s - m)) as bf16 A fragments (k-step n8 / 2, rows r / r + 8) and returns the
// factor corr by which the accumulated O must be rescaled.
template <class C, bool kMask>
__device__ __forceinline__ void attention_wgmma_softmax(float (&s)[C::kBlockN / 2], uint32_t (&pn)[C::kBlockN / 16][4],
                                                        float (&corr)[2], SoftmaxRows& r, const AttnArgs& a, int kt,
                                                        int lane) {
    constexpr int kN8 = C::kBlockN / 8;
    if constexpr (kMask) {
        // Visible keys of each row: [lo, hi] (an empty range for tokens past the item's end).
        int lo[2], hi[2];
        for (int x = 0; x < 2; ++x) {
            hi[x] = r.live[x] ? r.pos[x] : INT_MIN / 2;
            lo[x] = a.window ? r.pos[x] - a.window + 1 : INT_MIN / 2;
        }
#pragma unroll
        for (int n8 = 0; n8 < kN8; ++n8) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int x = e / 2, j = kt + n8 * 8 + 2 * (lane % 4) + e % 2;
                s[4 * n8 + e] = j >= lo[x] && j <= hi[x] ? s[4 * n8 + e] : -INFINITY;
            }
        }
    }
    float mx[2] = {r.m[0], r.m[1]};
#pragma unroll
    for (int n8 = 0; n8 < kN8; ++n8) {
        mx[0] = fmaxf(mx[0], fmaxf(s[4 * n8], s[4 * n8 + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[4 * n8 + 2], s[4 * n8 + 3]));
    }
    float base[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));  // a row lives in the 4 lanes of a quad
        mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
        base[x] = mx[x] == -INFINITY ? 0.f : mx[x] * kScaleLog2;  // rows with nothing yet stay at 0
        corr[x] = sm90::exp2_approx(r.m[x] * kScaleLog2 - base[x]);
        r.m[x] = mx[x];
    }
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int n8 = 0; n8 < kN8; ++n8) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float x = fmaf(s[4 * n8 + e], kScaleLog2, -base[e / 2]);
            if constexpr (C::kPolyExp)
                s[4 * n8 + e] = n8 % 4 == 3 ? attention_exp2_poly(x) : sm90::exp2_approx(x);  // 1 in 4 on FMA
            else
                s[4 * n8 + e] = sm90::exp2_approx(x);
            sum[e / 2] += s[4 * n8 + e];
        }
        pn[n8 / 2][(n8 % 2) * 2 + 0] = pack_bf16(s[4 * n8], s[4 * n8 + 1]);
        pn[n8 / 2][(n8 % 2) * 2 + 1] = pack_bf16(s[4 * n8 + 2], s[4 * n8 + 3]);
    }
    r.l[0] = r.l[0] * corr[0] + sum[0];
    r.l[1] = r.l[1] * corr[1] + sum[1];
}

// S = Q · Kᵀ for one tile: 4 k-steps of 16 dims, both operands K-major (+32 bytes per k-step).
template <class C>
__device__ __forceinline__ void attention_wgmma_qk(float (&s)[C::kBlockN / 2], uint64_t q_desc, uint64_t k_desc) {
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
        if constexpr (C::kBlockN == 128)
            sm90::wgmma_m64n128k16_ss(s, q_desc + uint64_t(ks * 32 / 16), k_desc + uint64_t(ks * 32 / 16), ks > 0);
        else
            sm90::wgmma_m64n64k16_ss(s, q_desc + uint64_t(ks * 32 / 16), k_desc + uint64_t(ks * 32 / 16), ks > 0);
    }
}

// The consumers take turns issuing their MMAs: consumer wg waits on named barrier 1 + wg and passes
// the turn to the next one's barrier (a ring; the last consumer passes to consumer 0).
template <class C>
__device__ __forceinline__ void attention_wgmma_turn_wait(int wg) {
    sm90::named_bar_sync(1 + wg, 2 * kWgThreads);
}
template <class C>
__device__ __forceinline__ void attention_wgmma_turn_pass(int wg) {
    sm90::named_bar_arrive(1 + (wg + 1) % C::kConsumers, 2 * kWgThreads);
}

// What a consumer needs to run one unit's tiles.
struct UnitRun {
    AttnItem it;
    int n_tiles;
    int n0;                           // ring position of the unit's first tile
    bool last;                        // the CTA's last unit: the last consumer passes no turn after its last tile
    uint64_t q_desc, k_desc, v_desc;  // stage 0's K/V tiles; stage st is + st * kTileBytes / 16
};

// One tile i >= 1 of a consumer: in its turn, issue S_i = Q·K_iᵀ and O += P_{i-1}·V_{i-1} (the PV of
// the previous tile: FA3's intra-warpgroup overlap), pass the turn, then the softmax of S_i while the
// other consumers' MMAs run; after the PV completes, release tile i - 1 and rescale O.
template <class C, bool kMask>
__device__ __forceinline__ void attention_wgmma_step(int i, int wg, const AttnArgs& a, const UnitRun& u, const Smem& sm,
                                                     int lane, float (&o)[32], uint32_t (&p)[C::kBlockN / 16][4],
                                                     SoftmaxRows& r) {
    constexpr int kK = C::kBlockN / 16;
    const int n = u.n0 + i, st = n % C::kStages, prev = (n - 1) % C::kStages;
    sm90::mbar_wait(&sm.full[st], (n / C::kStages) & 1);
    attention_wgmma_turn_wait<C>(wg);
    // O's rescale and P's copy must be done before wgmma.fence, not scheduled between it and the MMAs.
    sm90::fence_regs(o);
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) sm90::fence_regs(p[kk]);
    sm90::wgmma_fence();
    float s[C::kBlockN / 2];  // fresh per tile: nothing defines the (ignored) inputs of the first k-step
    attention_wgmma_qk<C>(s, u.q_desc, u.k_desc + uint64_t(st * C::kTileBytes / 16));
    sm90::wgmma_commit();
    attention_wgmma_pv<C>(o, p, u.v_desc + uint64_t(prev * C::kTileBytes / 16));
    sm90::wgmma_commit();
    // The last consumer skips its very last pass so that every turn barrier ends balanced.
    if (!(wg == C::kConsumers - 1 && u.last && i == u.n_tiles - 1)) attention_wgmma_turn_pass<C>(wg);
    float corr[2];
    if constexpr (C::kWaitPv) {
        // Both MMAs done before the softmax: P_{i-1} is dead, so P_i goes straight into p (32 registers
        // fewer; the other consumers' MMAs still overlap this softmax).
        sm90::wgmma_wait<0>();
        sm90::fence_regs(s);
        sm90::fence_regs(o);
#pragma unroll
        for (int kk = 0; kk < kK; ++kk) sm90::fence_regs(p[kk]);
        sm90::mbar_arrive(&sm.empty[prev]);
        attention_wgmma_softmax<C, kMask>(s, p, corr, r, a, u.it.key_begin + i * C::kBlockN, lane);
    } else {
        sm90::wgmma_wait<1>();  // S_i done, the PV may still run
        sm90::fence_regs(s);
        uint32_t pn[kK][4];
        attention_wgmma_softmax<C, kMask>(s, pn, corr, r, a, u.it.key_begin + i * C::kBlockN, lane);
        sm90::wgmma_wait<0>();
        sm90::fence_regs(o);
#pragma unroll
        for (int kk = 0; kk < kK; ++kk) sm90::fence_regs(p[kk]);  // P_{i-1} stays live (unclobbered) until here
        sm90::mbar_arrive(&sm.empty[prev]);
#pragma unroll
        for (int kk = 0; kk < kK; ++kk)
#pragma unroll
            for (int e = 0; e < 4; ++e) p[kk][e] = pn[kk][e];
    }
#pragma unroll
    for (int n8 = 0; n8 < kD / 8; ++n8) {
        o[4 * n8] *= corr[0], o[4 * n8 + 1] *= corr[0];
        o[4 * n8 + 2] *= corr[1], o[4 * n8 + 3] *= corr[1];
    }
}

// One unit of consumer wg: tile 0 (S and softmax only), tiles 1.. (attention_wgmma_step), the last
// tile's PV, then the sink and the normalised output. No wgmma sits under a branch: ptxas would
// serialise them.
template <class C>
__device__ __forceinline__ void attention_wgmma_consume_unit(const AttnArgs& a, const UnitRun& u, int g, int qb,
                                                             int q_parity, int wg, const Smem& sm) {
    constexpr int kK = C::kBlockN / 16;
    const int t = threadIdx.x % kWgThreads, warp = t / kWarpSize, lane = t % kWarpSize;
    const int tok0 = wg * 8 + 2 * warp;  // item-relative token of fragment row r (row r + 8: tok0 + 1)
    const AttnItem& it = u.it;
    SoftmaxRows r;
    for (int x = 0; x < 2; ++x) r.pos[x] = it.pos0 + tok0 + x, r.live[x] = tok0 + x < it.n_q;

    float o[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) o[e] = 0.f;
    uint32_t p[kK][4];
    {
        const int st = u.n0 % C::kStages;
        sm90::mbar_wait(&sm.q_full[qb], q_parity);
        sm90::mbar_wait(&sm.full[st], (u.n0 / C::kStages) & 1);
        attention_wgmma_turn_wait<C>(wg);
        sm90::wgmma_fence();
        float s[C::kBlockN / 2];
        attention_wgmma_qk<C>(s, u.q_desc, u.k_desc + uint64_t(st * C::kTileBytes / 16));
        sm90::wgmma_commit();
        if (!(wg == C::kConsumers - 1 && u.last && u.n_tiles == 1)) attention_wgmma_turn_pass<C>(wg);
        sm90::wgmma_wait<0>();
        sm90::fence_regs(s);
        float corr[2];  // O is still zero
        attention_wgmma_softmax<C, true>(s, p, corr, r, a, it.key_begin, lane);
    }
    // Tiles [1, n_tiles) in three runs: masked ones at the window's lower edge, whole ones, masked ones
    // on the causal diagonal (and past the item's last key). Separate loops, not a branch inside one:
    // a branch that rewrites S on one path makes ptxas serialise the wgmmas (C7513).
    const int kb = it.key_begin, n_tiles = u.n_tiles;
    const int lead =
        a.window ? min(n_tiles, max(1, (it.pos0 + it.n_q - a.window - kb + C::kBlockN - 1) / C::kBlockN)) : 1;
    const int diag = it.pos0 - kb - C::kBlockN + 1;  // tile i is whole on the right iff i * kBlockN <= diag
    const int whole_end = max(lead, min(n_tiles, diag >= 0 ? diag / C::kBlockN + 1 : 0));
    for (int i = 1; i < lead; ++i) attention_wgmma_step<C, true>(i, wg, a, u, sm, lane, o, p, r);
    for (int i = lead; i < whole_end; ++i) attention_wgmma_step<C, false>(i, wg, a, u, sm, lane, o, p, r);
    for (int i = whole_end; i < n_tiles; ++i) attention_wgmma_step<C, true>(i, wg, a, u, sm, lane, o, p, r);
    sm90::mbar_arrive(&sm.q_empty[qb]);  // the unit's last S has completed: Q may be overwritten

    const int last_st = (u.n0 + n_tiles - 1) % C::kStages;
    sm90::fence_regs(o);
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) sm90::fence_regs(p[kk]);
    sm90::wgmma_fence();
    attention_wgmma_pv<C>(o, p, u.v_desc + uint64_t(last_st * C::kTileBytes / 16));
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(o);
    sm90::mbar_arrive(&sm.empty[last_st]);

    const int head = g * kAttnGroup + lane / 4;
    const float sink = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(a.sinks)[head]);
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        float l = r.l[x];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (!r.live[x]) continue;
        // Scores in natural units are kScale · raw; the sink joins the denominator once.
        const float m = r.m[x] * kScale;
        const float mf = fmaxf(m, sink);
        const float keep = expf(m - mf);
        const float scale = keep / (l * keep + expf(sink - mf));
        bf16* out_row = a.out + size_t(it.q_token + tok0 + x) * a.ld_out + head * kD;
#pragma unroll
        for (int n8 = 0; n8 < kD / 8; ++n8)
            *reinterpret_cast<uint32_t*>(out_row + n8 * 8 + 2 * (lane % 4)) =
                pack_bf16(o[4 * n8 + 2 * x] * scale, o[4 * n8 + 2 * x + 1] * scale);
    }
}

// Consumer warpgroup wg (0 .. kConsumers - 1): the CTA's units one after another, the ring position
// carried across them.
template <class C>
__device__ void attention_wgmma_consume(const AttnArgs& a, const AttnItem* items, int n_items, int wg, const Smem& sm) {
    if constexpr (C::kConsumerRegs > 0) sm90::reg_alloc<C::kConsumerRegs>();
    const int n_units = n_items * a.n_kv_heads;
    UnitRun u;
    // Descriptors of the stage-0 tiles; stage st is + st * kTileBytes / 16 (the address field counts
    // 16-byte units and never carries: shared memory is < 256 KB).
    u.k_desc = sm90::desc_sw128(sm.k, 16, 1024);
    u.v_desc = sm90::desc_sw128(sm.v, C::kTileBytes, 1024);
    u.n0 = 0;
    if (wg == C::kConsumers - 1) attention_wgmma_turn_pass<C>(wg);  // consumer 0 goes first
    for (int k = 0;; ++k) {
        const int w = attention_wgmma_unit(k);
        if (w >= n_units) break;
        const int g = w / n_items, qb = k % C::kQBufs;
        u.it = items[n_items - 1 - w % n_items];
        u.n_tiles = (u.it.key_end - u.it.key_begin + C::kBlockN - 1) / C::kBlockN;
        u.last = attention_wgmma_unit(k + 1) >= n_units;
        u.q_desc = sm90::desc_sw128(sm.q + qb * C::kQBytes + wg * 64 * kRowBytes, 16, 1024);
        attention_wgmma_consume_unit<C>(a, u, g, qb, (k / C::kQBufs) & 1, wg, sm);
        u.n0 += u.n_tiles;
    }
}

// One CTA = one (item, KV head) unit, or with a persistent variant one CTA per SM looping over them.
template <int V>
__global__ void __launch_bounds__(Cfg<V>::kThreads, 1)
    attention_prefill_wgmma_kernel(const AttnArgs a, const AttnItem* items, int n_items) {
    using C = Cfg<V>;
    pdl_enter();  // launch.cuh: before any early return or global access
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t* base = smem_raw + (1024 - sm90::smem_u32(smem_raw) % 1024) % 1024;  // 128B-swizzle atoms
    Smem sm;
    sm.q = base;
    sm.k = sm.q + C::kQBufs * C::kQBytes;
    sm.v = sm.k + C::kStages * C::kTileBytes;
    sm.full = reinterpret_cast<uint64_t*>(sm.v + C::kStages * C::kTileBytes);
    sm.empty = sm.full + C::kStages;
    sm.q_full = sm.empty + C::kStages;
    sm.q_empty = sm.q_full + C::kQBufs;
    if (threadIdx.x == 0) {
        for (int s = 0; s < C::kStages; ++s) {
            sm90::mbar_init(&sm.full[s], kWgThreads);
            sm90::mbar_init(&sm.empty[s], C::kConsumers * kWgThreads);
        }
        for (int b = 0; b < C::kQBufs; ++b) {
            sm90::mbar_init(&sm.q_full[b], kWgThreads);
            sm90::mbar_init(&sm.q_empty[b], C::kConsumers * kWgThreads);
        }
    }
    __syncthreads();
    // The warpgroup index through a shuffle: visibly warp-uniform to the compiler.
    const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / kWgThreads, 0);
    if (wg == 0)
        attention_wgmma_produce<C>(a, items, n_items, sm);
    else
        attention_wgmma_consume<C>(a, items, n_items, wg - 1, sm);
}

// CTAs of variant V for n_units (item, KV head) units on `sms` SMs.
template <int V>
int attention_wgmma_grid(int n_units, int sms) {
    return Cfg<V>::kPersistent ? min(n_units, sms) : n_units;
}

}  // namespace
// ---- end of device code (scripts/emulate_attention_wgmma.sh runs everything above on the CPU) ----

namespace {
// Calls f.template operator()<V>() for the variant v (dispatch.h).
template <typename F>
void dispatch_variant(int v, F&& f) {
    static_assert(kAttnWgmmaVariantCount == 7, "list every variant here");
    dispatch_int<0, 1, 2, 3, 4, 5, 6>("wgmma attention variant", v, f);
}
}  // namespace

void attention_prefill_wgmma_configure() {
    thread_local const bool done = [] {
        for (int v = 0; v < kAttnWgmmaVariantCount; ++v)
            dispatch_variant(v, [&]<int V>() {
                CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_wgmma_kernel<V>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg<V>::kSmemBytes));
            });
        return true;
    }();
    (void)done;
}

void attention_prefill_wgmma(const AttnArgs& a, const AttnItem* items, int n_items, int variant, cudaStream_t stream) {
    if (n_items == 0) return;
    OSPREY_CHECK(a.n_q_heads == a.n_kv_heads * kAttnGroup && a.head_dim == kAttnHeadDim,
                 "attention_prefill_wgmma: compiled for head_dim ", kAttnHeadDim, " and a group of ", kAttnGroup);
    attention_prefill_wgmma_configure();
    dispatch_variant(variant, [&]<int V>() {
        const int grid = attention_wgmma_grid<V>(n_items * a.n_kv_heads, sm_count());
        cuda::launch(attention_prefill_wgmma_kernel<V>, dim3(grid), Cfg<V>::kThreads, Cfg<V>::kSmemBytes, stream, a,
                     items, n_items);
    });
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::cuda
