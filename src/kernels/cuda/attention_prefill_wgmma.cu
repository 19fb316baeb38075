#include "kernels/cuda/attention_prefill_wgmma.h"

#include <cuda_bf16.h>

#include <cmath>
#include <climits>
#include <cstdint>

#include "kernels/cuda/attention_kv.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/wgmma.cuh"

namespace osprey::cuda {
namespace {

// The CTA: warpgroup 0 produces (loads Q once, then K/V tiles), warpgroups 1 and 2 consume: each owns
// 64 query rows = 8 tokens x the group's 8 heads. Row r of a consumer is token r / 8 of its 8 (the
// item's token 8 * wg + r / 8) and head g * 8 + r % 8; so in the wgmma fragments warp w's rows r and
// r + 8 (r = lane / 4) are tokens 2w and 2w + 1 of the consumer, head lane / 4, as in the mma.sync
// kernel (attention_prefill.cu).
constexpr int kD = kAttnHeadDim;                         // 64: one 128-byte swizzled row per Q/K/V row
constexpr int kRows = kWgmmaPrefillTokens * kAttnGroup;  // 128 query rows per CTA
constexpr int kBlockN = 128;                             // keys per K/V tile
constexpr int kStages = 3;                               // K/V tiles in the ring (>= 3: the producer
                                                         // releases tile i - 1 after issuing tile i)
constexpr int kWgThreads = 128;
constexpr int kConsumers = 2;
constexpr int kThreads = kWgThreads * (1 + kConsumers);
constexpr int kRowBytes = kD * 2;                    // 128
constexpr int kQBytes = kRows * kRowBytes;           // 16 KB
constexpr int kTileBytes = kBlockN * kRowBytes;      // 16 KB per K or V tile
constexpr int kSmemBytes = 1024 /* alignment slack */ + kQBytes + 2 * kStages * kTileBytes + 8 * (2 * kStages + 1);
// log2(e) / sqrt(head_dim): scores are kept unscaled (raw q·k) and scaled inside exp2.
constexpr float kScaleLog2 = 1.4426950408889634f * 0.125f;
constexpr float kScale = 0.125f;  // 1 / sqrt(64)
static_assert(kD == 64 && kAttnGroup == 8 && kRows == kConsumers * 64 && kBlockN == 128);

struct Smem {
    uint8_t* q;       // [kRows][128 B] swizzled
    uint8_t* k;       // [kStages][kBlockN][128 B] swizzled
    uint8_t* v;       // [kStages][kBlockN][128 B] swizzled
    uint64_t* full;   // [kStages] tile landed (kWgThreads producer arrivals)
    uint64_t* empty;  // [kStages] tile consumed (kConsumers * kWgThreads arrivals)
    uint64_t* q_full; // Q landed (kWgThreads producer arrivals)
};

// Producer: thread t copies 16-byte chunk t % 8 of rows t / 8, t / 8 + 16, ... (a warp covers 4 whole
// 128-byte rows per instruction), into the swizzled position. A tile's rows past the item's keys are
// zero-filled (V must be finite there: P is 0 but 0 · NaN is not). Completion is signalled one tile
// late: wait for tile i - 1's copies, make them visible to the async proxy (wgmma), then arrive.
__device__ void attention_wgmma_produce(const AttnArgs& a, const AttnItem& it, int g, int n_tiles, const Smem& sm) {
    const int t = threadIdx.x % kWgThreads;
    const int c = t % 8, sub = t / 8;
    const __nv_bfloat16* qkv = reinterpret_cast<const __nv_bfloat16*>(a.qkv);
#pragma unroll
    for (int i = 0; i < kRows / 16; ++i) {
        const int r = sub + 16 * i, tok = r / kAttnGroup, h = r % kAttnGroup;
        const bool valid = tok < it.n_q;
        const size_t off = valid ? size_t(it.q_token + tok) * a.ld_qkv + (g * kAttnGroup + h) * kD + c * 8 : 0;
        cp_async16(sm.q + sm90::sw128_offset(r, c * 8), qkv + off, valid);
    }
    for (int i = 0; i < n_tiles; ++i) {
        const int s = i % kStages;
        sm90::mbar_wait(&sm.empty[s], ((i / kStages) & 1) ^ 1);
        const int kt = it.key_begin + i * kBlockN;
#pragma unroll 4
        for (int rr = 0; rr < kBlockN / 16; ++rr) {
            const int key = sub + 16 * rr, j = kt + key;
            const bool valid = j < it.key_end;
            const __nv_bfloat16 *kp = qkv, *vp = qkv;
            if (valid) attention_kv_rows(a, it, g, j, kp, vp);
            const uint32_t dst = s * kTileBytes + sm90::sw128_offset(key, c * 8);
            cp_async16(sm.k + dst, kp + (valid ? c * 8 : 0), valid);
            cp_async16(sm.v + dst, vp + (valid ? c * 8 : 0), valid);
        }
        cp_async_commit();
        if (i > 0) {
            cp_async_wait<1>();
            sm90::fence_proxy_async();
            if (i == 1) sm90::mbar_arrive(sm.q_full);  // Q was in tile 0's group
            sm90::mbar_arrive(&sm.full[(i - 1) % kStages]);
        }
    }
    cp_async_wait<0>();
    sm90::fence_proxy_async();
    if (n_tiles == 1) sm90::mbar_arrive(sm.q_full);
    sm90::mbar_arrive(&sm.full[(n_tiles - 1) % kStages]);
}

// O += P · V for one tile: 8 k-steps of 16 keys, P from registers, V MN-major (rows of 128 B per key,
// 8-key groups 1024 B apart, a k-step = 2048 B).
__device__ __forceinline__ void attention_wgmma_pv(float (&o)[32], const uint32_t (&p)[8][4], uint64_t v_desc) {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
        sm90::wgmma_m64n64k16_rs_mn(o, p[kk], v_desc + uint64_t(kk * 16 * kRowBytes / 16), true);
}

// Online-softmax state of a thread's two fragment rows (x = 0: row r, 1: row r + 8).
struct SoftmaxRows {
    float m[2] = {-INFINITY, -INFINITY};  // running max of the raw scores q·k
    float l[2] = {0.f, 0.f};              // this thread's part of the sum of exp(kScale · (s - m))
    int pos[2];                           // query positions
    bool live[2];                         // token inside the item
};

// Masks S (raw scores of tile kt, accumulator layout) if kMask, updates the running max and sums,
// writes P = exp(kScale · (s - m)) as bf16 A fragments (k-step n8 / 2, rows r / r + 8) and returns the
// factor corr by which the accumulated O must be rescaled.
template <bool kMask>
__device__ __forceinline__ void attention_wgmma_softmax(float (&s)[64], uint32_t (&pn)[8][4], float (&corr)[2],
                                                        SoftmaxRows& r, const AttnArgs& a, int kt, int lane) {
    if constexpr (kMask) {
        // Visible keys of each row: [lo, hi] (an empty range for tokens past the item's end).
        int lo[2], hi[2];
        for (int x = 0; x < 2; ++x) {
            hi[x] = r.live[x] ? r.pos[x] : INT_MIN / 2;
            lo[x] = a.window ? r.pos[x] - a.window + 1 : INT_MIN / 2;
        }
#pragma unroll
        for (int n8 = 0; n8 < kBlockN / 8; ++n8) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int x = e / 2, j = kt + n8 * 8 + 2 * (lane % 4) + e % 2;
                s[4 * n8 + e] = j >= lo[x] && j <= hi[x] ? s[4 * n8 + e] : -INFINITY;
            }
        }
    }
    float mx[2] = {r.m[0], r.m[1]};
#pragma unroll
    for (int n8 = 0; n8 < kBlockN / 8; ++n8) {
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
    for (int n8 = 0; n8 < kBlockN / 8; ++n8) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[4 * n8 + e] = sm90::exp2_approx(fmaf(s[4 * n8 + e], kScaleLog2, -base[e / 2]));
            sum[e / 2] += s[4 * n8 + e];
        }
        pn[n8 / 2][(n8 % 2) * 2 + 0] = pack_bf16(s[4 * n8], s[4 * n8 + 1]);
        pn[n8 / 2][(n8 % 2) * 2 + 1] = pack_bf16(s[4 * n8 + 2], s[4 * n8 + 3]);
    }
    r.l[0] = r.l[0] * corr[0] + sum[0];
    r.l[1] = r.l[1] * corr[1] + sum[1];
}

// S = Q · Kᵀ for one tile: 4 k-steps of 16 dims, both operands K-major (+32 bytes per k-step).
__device__ __forceinline__ void attention_wgmma_qk(float (&s)[64], uint64_t q_desc, uint64_t k_desc) {
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks)
        sm90::wgmma_m64n128k16_ss(s, q_desc + uint64_t(ks * 32 / 16), k_desc + uint64_t(ks * 32 / 16), ks > 0);
}

// One tile i >= 1 of a consumer: in its turn, issue S_i = Q·K_iᵀ and O += P_{i-1}·V_{i-1} (the PV of
// the previous tile: FA3's intra-warpgroup overlap), pass the turn, then the softmax of S_i while the
// other consumer's MMAs run; after the PV completes, release tile i - 1 and rescale O.
template <bool kMask>
__device__ __forceinline__ void attention_wgmma_step(int i, int n_tiles, int wg, const AttnArgs& a, const AttnItem& it,
                                                     const Smem& sm, uint64_t q_desc, uint64_t k_desc,
                                                     uint64_t v_desc, int lane, float (&o)[32], uint32_t (&p)[8][4],
                                                     SoftmaxRows& r) {
    constexpr int kTurnThreads = kConsumers * kWgThreads;
    const int st = i % kStages, prev = (i - 1) % kStages;
    sm90::mbar_wait(&sm.full[st], (i / kStages) & 1);
    sm90::named_bar_sync(1 + wg, kTurnThreads);
    // O's rescale and P's copy must be done before wgmma.fence, not scheduled between it and the MMAs.
    sm90::fence_regs(o);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) sm90::fence_regs(p[kk]);
    sm90::wgmma_fence();
    float s[64];  // fresh per tile: nothing defines the (ignored) inputs of the first k-step
    attention_wgmma_qk(s, q_desc, k_desc + uint64_t(st * kTileBytes / 16));
    sm90::wgmma_commit();
    attention_wgmma_pv(o, p, v_desc + uint64_t(prev * kTileBytes / 16));
    sm90::wgmma_commit();
    // Consumer 1 skips its last pass so that both turn barriers end balanced.
    if (!(wg == 1 && i == n_tiles - 1)) sm90::named_bar_arrive(2 - wg, kTurnThreads);
    sm90::wgmma_wait<1>();  // S_i done, the PV may still run
    sm90::fence_regs(s);
    uint32_t pn[8][4];
    float corr[2];
    attention_wgmma_softmax<kMask>(s, pn, corr, r, a, it.key_begin + i * kBlockN, lane);
    sm90::wgmma_wait<0>();
    sm90::fence_regs(o);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) sm90::fence_regs(p[kk]);  // P_{i-1} stays live (unclobbered) until here
    sm90::mbar_arrive(&sm.empty[prev]);
#pragma unroll
    for (int n8 = 0; n8 < kD / 8; ++n8) {
        o[4 * n8] *= corr[0], o[4 * n8 + 1] *= corr[0];
        o[4 * n8 + 2] *= corr[1], o[4 * n8 + 3] *= corr[1];
    }
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) p[kk][e] = pn[kk][e];
}

// Consumer warpgroup wg (0, 1): tile 0 (S and softmax only), tiles 1.. (attention_wgmma_step), the
// last tile's PV, then the sink and the normalised output. The two consumers take turns (named
// barriers 1 and 2) to issue their MMAs. No wgmma sits under a branch: ptxas would serialise them.
__device__ void attention_wgmma_consume(const AttnArgs& a, const AttnItem& it, int g, int n_tiles, int wg,
                                        const Smem& sm) {
    constexpr int kTurnThreads = kConsumers * kWgThreads;
    const int t = threadIdx.x % kWgThreads, warp = t / kWarpSize, lane = t % kWarpSize;
    const int tok0 = wg * 8 + 2 * warp;  // item-relative token of fragment row r (row r + 8: tok0 + 1)
    SoftmaxRows r;
    for (int x = 0; x < 2; ++x) r.pos[x] = it.pos0 + tok0 + x, r.live[x] = tok0 + x < it.n_q;
    // Descriptors of the stage-0 tiles; stage st is + st * kTileBytes / 16 (the address field counts
    // 16-byte units and never carries: shared memory is < 256 KB).
    const uint64_t q_desc = sm90::desc_sw128(sm.q + wg * 64 * kRowBytes, 16, 1024);
    const uint64_t k_desc = sm90::desc_sw128(sm.k, 16, 1024);
    const uint64_t v_desc = sm90::desc_sw128(sm.v, kTileBytes, 1024);

    float o[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) o[e] = 0.f;
    uint32_t p[8][4];
    {
        if (wg == 1) sm90::named_bar_arrive(1, kTurnThreads);  // consumer 0 goes first
        sm90::mbar_wait(sm.q_full, 0);
        sm90::mbar_wait(&sm.full[0], 0);
        sm90::named_bar_sync(1 + wg, kTurnThreads);
        sm90::wgmma_fence();
        float s[64];
        attention_wgmma_qk(s, q_desc, k_desc);
        sm90::wgmma_commit();
        if (!(wg == 1 && n_tiles == 1)) sm90::named_bar_arrive(2 - wg, kTurnThreads);
        sm90::wgmma_wait<0>();
        sm90::fence_regs(s);
        float corr[2];  // O is still zero
        attention_wgmma_softmax<true>(s, p, corr, r, a, it.key_begin, lane);
    }
    // Tiles [1, n_tiles) in three runs: masked ones at the window's lower edge, whole ones, masked ones
    // on the causal diagonal (and past the item's last key). Separate loops, not a branch inside one:
    // a branch that rewrites S on one path makes ptxas serialise the wgmmas (C7513).
    const int kb = it.key_begin;
    const int lead = a.window ? min(n_tiles, max(1, (it.pos0 + it.n_q - a.window - kb + kBlockN - 1) / kBlockN)) : 1;
    const int diag = it.pos0 - kb - kBlockN + 1;  // tile i is whole on the right iff i * kBlockN <= diag
    const int whole_end = max(lead, min(n_tiles, diag >= 0 ? diag / kBlockN + 1 : 0));
    for (int i = 1; i < lead; ++i)
        attention_wgmma_step<true>(i, n_tiles, wg, a, it, sm, q_desc, k_desc, v_desc, lane, o, p, r);
    for (int i = lead; i < whole_end; ++i)
        attention_wgmma_step<false>(i, n_tiles, wg, a, it, sm, q_desc, k_desc, v_desc, lane, o, p, r);
    for (int i = whole_end; i < n_tiles; ++i)
        attention_wgmma_step<true>(i, n_tiles, wg, a, it, sm, q_desc, k_desc, v_desc, lane, o, p, r);

    sm90::fence_regs(o);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) sm90::fence_regs(p[kk]);
    sm90::wgmma_fence();
    attention_wgmma_pv(o, p, v_desc + uint64_t((n_tiles - 1) % kStages * kTileBytes / 16));
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(o);
    sm90::mbar_arrive(&sm.empty[(n_tiles - 1) % kStages]);

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

// One CTA = one item (<= 16 query tokens of a slice) x one KV head. Items are taken in reverse plan
// order: a slice's last items have the most keys, so the longest CTAs start first.
__global__ void __launch_bounds__(kThreads, 1) attention_prefill_wgmma_kernel(const AttnArgs a, const AttnItem* items,
                                                                              int n_items) {
    pdl_enter();  // launch.cuh: before any early return or global access
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t* base = smem_raw + (1024 - sm90::smem_u32(smem_raw) % 1024) % 1024;  // 128B-swizzle atoms
    Smem sm;
    sm.q = base;
    sm.k = sm.q + kQBytes;
    sm.v = sm.k + kStages * kTileBytes;
    sm.full = reinterpret_cast<uint64_t*>(sm.v + kStages * kTileBytes);
    sm.empty = sm.full + kStages;
    sm.q_full = sm.empty + kStages;

    const AttnItem it = items[n_items - 1 - int(blockIdx.x)];
    const int g = blockIdx.y;
    const int n_tiles = (it.key_end - it.key_begin + kBlockN - 1) / kBlockN;  // >= 1: a token sees itself
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) {
            sm90::mbar_init(&sm.full[s], kWgThreads);
            sm90::mbar_init(&sm.empty[s], kConsumers * kWgThreads);
        }
        sm90::mbar_init(sm.q_full, kWgThreads);
    }
    __syncthreads();
    // The warpgroup index through a shuffle: visibly warp-uniform to the compiler.
    const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / kWgThreads, 0);
    if (wg == 0)
        attention_wgmma_produce(a, it, g, n_tiles, sm);
    else
        attention_wgmma_consume(a, it, g, n_tiles, wg - 1, sm);
}

}  // namespace
// ---- end of device code (scripts/emulate_attention_wgmma.sh runs everything above on the CPU) ----

void attention_prefill_wgmma_configure() {
    thread_local const bool done = [] {
        CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        kSmemBytes));
        return true;
    }();
    (void)done;
}

void attention_prefill_wgmma(const AttnArgs& a, const AttnItem* items, int n_items, cudaStream_t stream) {
    if (n_items == 0) return;
    OSPREY_CHECK(a.n_q_heads == a.n_kv_heads * kAttnGroup && a.head_dim == kAttnHeadDim,
                 "attention_prefill_wgmma: compiled for head_dim ", kAttnHeadDim, " and a group of ", kAttnGroup);
    attention_prefill_wgmma_configure();
    cuda::launch(attention_prefill_wgmma_kernel, dim3(n_items, a.n_kv_heads), kThreads, kSmemBytes, stream, a, items,
                 n_items);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::cuda
