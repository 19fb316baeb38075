#include "kernels/cuda/attention.h"
#include "kernels/cuda/launch.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>

#include "kernels/cuda/attention_kv.cuh"
#include "kernels/cuda/rope_pair.cuh"
#include "kernels/cuda/attention_prefill.h"
#include "kernels/cuda/attention_prefill_wgmma.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/kv_fp8.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/timeline.cuh"

namespace osprey::cuda {

AttnPrefillKernel attention_prefill_kernel_default() {
    static const AttnPrefillKernel k = [] {
        const char* v = std::getenv("OSPREY_ATTN_WGMMA");
        // wgmma by default since its first H200 run (bench_attention prefill, 2026-12-01): 8k tokens
        // 4044 -> 1634 us (17.2% -> 42.6% of 790 TFLOP/s), 32k window 889 -> 787 us, 1k 106 -> 52 us.
        // OSPREY_ATTN_WGMMA=0 keeps the mma.sync kernel (A/B runs).
        return v && std::string_view(v) == "0" ? AttnPrefillKernel::mma_sync : AttnPrefillKernel::wgmma;
    }();
    return k;
}

AttnFp8DecodeMma attention_fp8_decode_mma() {
    static const AttnFp8DecodeMma m = [] {
        const char* v = std::getenv("OSPREY_ATTN_FP8_DECODE");
        if (!v || !*v || std::string_view(v) == "f16") return AttnFp8DecodeMma::f16;
        OSPREY_CHECK(std::string_view(v) == "bf16", "OSPREY_ATTN_FP8_DECODE=", v, ": expected f16 or bf16");
        return AttnFp8DecodeMma::bf16;
    }();
    return m;
}

int attention_wgmma_variant_default() {
    static const int v = [] {
        const char* s = std::getenv("OSPREY_ATTN_WGMMA_VARIANT");
        if (!s || !*s) return kAttnWgmmaDefaultVariant;
        const int n = std::atoi(s);
        OSPREY_CHECK(n >= 0 && n < kAttnWgmmaVariantCount && std::string_view(s) == std::to_string(n),
                     "OSPREY_ATTN_WGMMA_VARIANT=", s, ": expected 0..", kAttnWgmmaVariantCount - 1);
        return n;
    }();
    return v;
}

int attention_min_keys_per_split() {
    static const int v = [] {
        const char* s = std::getenv("OSPREY_ATTN_MIN_KEYS");
        if (!s || !*s) return kMinKeysPerSplit;
        const int n = std::atoi(s);
        OSPREY_CHECK(n > 0 && n % kAttnKeyTile == 0 && std::string_view(s) == std::to_string(n), "OSPREY_ATTN_MIN_KEYS=",
                     s, ": expected a positive multiple of ", kAttnKeyTile);
        return n;
    }();
    return v;
}

AttnPlan plan_attention(std::span<const AttnSlice> slices, int window, int n_kv_heads, int target_ctas,
                        bool fixed_splits, AttnPrefillKernel prefill, int wgmma_variant, int min_keys_per_split) {
    OSPREY_CHECK(min_keys_per_split > 0 && min_keys_per_split % kAttnKeyTile == 0,
                 "plan_attention: min_keys_per_split ", min_keys_per_split, " is not a positive multiple of ",
                 kAttnKeyTile);
    OSPREY_CHECK(window >= 0 && n_kv_heads > 0, "plan_attention: window ", window, ", n_kv_heads ", n_kv_heads);
    OSPREY_CHECK(wgmma_variant >= 0 && wgmma_variant < kAttnWgmmaVariantCount, "plan_attention: wgmma variant ",
                 wgmma_variant);
    AttnPlan plan;
    plan.prefill_kernel = prefill;
    plan.wgmma_variant = wgmma_variant;
    const int item_tokens = prefill == AttnPrefillKernel::wgmma ? wgmma_prefill_tokens(wgmma_variant) : kPrefillTokens;
    int n_decode_tokens = 0;
    for (const AttnSlice& s : slices) {
        OSPREY_CHECK(s.n_tokens > 0 && s.start_pos >= 0 && s.first_token >= 0 && s.first_key >= 0 &&
                         s.first_key <= s.start_pos,
                     "plan_attention: bad slice (tokens ", s.n_tokens, ", start_pos ", s.start_pos, ", first_key ",
                     s.first_key, ")");
        n_decode_tokens += s.n_tokens == 1;
    }
    // Splits per decode token: enough to fill target_ctas, never below min_keys_per_split keys each.
    int want_splits = std::max(1, target_ctas / std::max(1, n_decode_tokens * n_kv_heads));
    if (fixed_splits) {
        int needed = 1;  // splits the longest decode context can use
        for (const AttnSlice& s : slices) {
            if (s.n_tokens != 1) continue;
            const int lo = std::max(s.first_key, window ? s.start_pos - window + 1 : 0);
            needed = std::max(needed, (s.start_pos + 1 - lo + min_keys_per_split - 1) / min_keys_per_split);
        }
        int pow2 = 1;
        while (pow2 < needed) pow2 *= 2;
        want_splits = std::min(want_splits, pow2);
    }
    for (const AttnSlice& s : slices) {
        AttnItem base{};
        base.slice_first_token = s.first_token;
        base.slice_start_pos = s.start_pos;
        base.window_slot = s.window_slot;
        base.page_offset = s.page_offset;
        if (s.n_tokens == 1) {
            const int p = s.start_pos;
            const int lo = std::max(s.first_key, window ? p - window + 1 : 0);
            const int n_keys = p + 1 - lo;
            const int max_splits = (n_keys + min_keys_per_split - 1) / min_keys_per_split;
            const int n_splits = fixed_splits ? want_splits : std::clamp(want_splits, 1, max_splits);
            // Splits of whole key tiles, so that no tile is read by two splits.
            const int raw_per_split = (n_keys + n_splits - 1) / n_splits;
            const int per_split = (raw_per_split + kAttnKeyTile - 1) / kAttnKeyTile * kAttnKeyTile;
            const int first_partial = plan.n_partials;
            int made = 0;
            for (int i = 0; i < n_splits && (fixed_splits || lo + i * per_split <= p); ++i, ++made) {
                AttnItem it = base;
                it.q_token = s.first_token, it.n_q = 1, it.pos0 = p;
                it.key_begin = std::min(p + 1, lo + i * per_split);  // empty when past the end
                it.key_end = std::min(p + 1, lo + (i + 1) * per_split);
                it.partial = -1;
                plan.decode.push_back(it);
            }
            if (made > 1) {
                for (int i = 0; i < made; ++i) {
                    plan.decode[plan.decode.size() - made + i].partial = first_partial + i;
                    plan.decode[plan.decode.size() - made + i].merge = int(plan.merges.size());
                }
                plan.merges.push_back({s.first_token, first_partial, made});
                plan.n_partials += made;
            }
        } else {
            for (int t = 0; t < s.n_tokens; t += item_tokens) {
                AttnItem it = base;
                it.q_token = s.first_token + t;
                it.n_q = std::min(item_tokens, s.n_tokens - t);
                it.pos0 = s.start_pos + t;
                it.key_begin = std::max(s.first_key, window ? it.pos0 - window + 1 : 0);
                it.key_end = it.pos0 + it.n_q;
                plan.prefill.push_back(it);
            }
        }
    }
    return plan;
}

namespace {
// ---- decode device code (scripts/emulate_attention_decode.sh runs it on the CPU) ----

constexpr int kThreads = 128;  // 4 warps
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kD = kAttnHeadDim;
constexpr int kTile = kAttnKeyTile;  // 64 keys per tile, 16 per warp
constexpr int kStride = kD + 8;      // bf16 per smem row: 144 bytes, ldmatrix conflict-free
constexpr int kStages = 3;           // tiles in shared memory: two in flight while one is computed
static_assert(kTile == kWarps * 16 && kD == 64 && kAttnGroup == 8);

constexpr size_t decode_smem_bytes() { return size_t(kStages) * 2 * kTile * kStride * sizeof(__nv_bfloat16); }
static_assert(decode_smem_bytes() >= sizeof(float) * kWarps * kAttnGroup * (kD + 2));  // reused for the merge

// The end of a decode CTA: the 4 warps' (max, sum, output) merged through shared memory, then
// normalised with the sink (it.partial < 0), or written as a partial (and with merge counters the last
// split merges its token's partials). o[nt][e] is this lane's output column nt * 8 + c + e (BF16 kernel)
// or dimension 8 (c + e) + nt (kFp8: the FP8 kernel's permuted V columns).
template <bool kFp8>
__device__ __forceinline__ void attention_decode_finish(const AttnArgs& a, const AttnItem& it, const AttnMerge* merges,
                                                        int g, float m, float l, float (&o)[8][4],
                                                        unsigned char* smem_raw) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int h = lane / 4, c = 2 * (lane % 4);
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);

    // Merge the 4 warps through shared memory: red_o [warp][head][64], red_ml [warp][head] (max, sum).
    __syncthreads();  // every warp is done with the K/V stages
    float* red_o = reinterpret_cast<float*>(smem_raw);
    float2* red_ml = reinterpret_cast<float2*>(red_o + kWarps * kAttnGroup * kD);
    if constexpr (kFp8) {  // column n of n-tile nt is dimension 8n + nt (the FP8 kernel's V layout)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) red_o[(warp * kAttnGroup + h) * kD + 8 * (c + e) + nt] = o[nt][e];
    } else {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
            *reinterpret_cast<float2*>(&red_o[(warp * kAttnGroup + h) * kD + nt * 8 + c]) = make_float2(o[nt][0], o[nt][1]);
    }
    if (lane % 4 == 0) red_ml[warp * kAttnGroup + h] = make_float2(m, l);
    __syncthreads();

    const int row = threadIdx.x / 16, d4 = (threadIdx.x % 16) * 4;  // 8 heads x 16 groups of 4 dims
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, red_ml[w * kAttnGroup + row].x);
    float sum = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (mx != -INFINITY) {
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
            const float2 ml = red_ml[w * kAttnGroup + row];
            const float wt = expf(ml.x - mx);  // 0 for a warp that saw no allowed key
            sum += ml.y * wt;
            const float4 v = *reinterpret_cast<const float4*>(&red_o[(w * kAttnGroup + row) * kD + d4]);
            acc[0] += v.x * wt, acc[1] += v.y * wt, acc[2] += v.z * wt, acc[3] += v.w * wt;
        }
    }
    const int head = g * kAttnGroup + row;
    if (it.partial < 0) {
        const float sink = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(a.sinks)[head]);
        const float mf = fmaxf(mx, sink);
        const float keep = expf(mx - mf);
        const float scale = keep / (sum * keep + expf(sink - mf));
        uint32_t* out = reinterpret_cast<uint32_t*>(a.out + size_t(it.q_token) * a.ld_out + head * kD + d4);
        out[0] = pack_bf16(acc[0] * scale, acc[1] * scale);
        out[1] = pack_bf16(acc[2] * scale, acc[3] * scale);
    } else {
        const size_t pidx = (size_t(it.partial) * a.n_kv_heads + g) * kAttnGroup + row;
        *reinterpret_cast<float4*>(a.partial_acc + pidx * kD + d4) = make_float4(acc[0], acc[1], acc[2], acc[3]);
        if (d4 == 0) a.partial_ml[pidx] = make_float2(mx, sum);
        if (a.merge_counters == nullptr) return;  // attention_merge_kernel merges
        // Fused merge: the last of the token's splits to arrive (for this KV head) merges them all, in
        // split order (deterministic), and leaves the counter at zero for the next call. The partials
        // are published with a fence before the arrival and read from L2 after it.
        __shared__ int s_last;
        __threadfence();
        __syncthreads();
        const AttnMerge mg = merges[it.merge];
        if (threadIdx.x == 0) {
            int32_t* counter = a.merge_counters + size_t(it.merge) * a.n_kv_heads + g;
            s_last = atomicAdd(counter, 1) == mg.n_partials - 1;
            if (s_last) *counter = 0;
        }
        __syncthreads();
        if (!s_last) return;
        __threadfence();
        const float sink = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(a.sinks)[head]);
        float mf = sink;
        for (int s = 0; s < mg.n_partials; ++s)
            mf = fmaxf(mf, __ldcg(&a.partial_ml[(size_t(mg.first_partial + s) * a.n_kv_heads + g) * kAttnGroup + row].x));
        float den = expf(sink - mf);  // the sink, counted once
        float o[4] = {0.f, 0.f, 0.f, 0.f};
        for (int s = 0; s < mg.n_partials; ++s) {
            const size_t q = (size_t(mg.first_partial + s) * a.n_kv_heads + g) * kAttnGroup + row;
            const float2 ml = __ldcg(&a.partial_ml[q]);
            const float w = expf(ml.x - mf);  // 0 for a split that saw no allowed key (max = -inf)
            den += ml.y * w;
            const float4 v = __ldcg(reinterpret_cast<const float4*>(a.partial_acc + q * kD + d4));
            o[0] += v.x * w, o[1] += v.y * w, o[2] += v.z * w, o[3] += v.w * w;
        }
        uint32_t* out = reinterpret_cast<uint32_t*>(a.out + size_t(mg.token) * a.ld_out + head * kD + d4);
        out[0] = pack_bf16(o[0] / den, o[1] / den);
        out[1] = pack_bf16(o[2] / den, o[3] / den);
    }
}

// RoPE fused into decode (AttnArgs::rope_cos): the step's own key j, unrotated in qkv (kp, vp from
// attention_kv_rows). This thread's 8 dimensions [8 part, 8 part + 8) of the K row are rotated with
// their partners (part ^ 4: dimension d pairs with d + 32) into shared memory at dst; with a store, the
// roped K dimensions and the same V dimensions also go to the cache row of position j (its page, or
// the item's ring slot), where rope()'s store would have put them.
__device__ __forceinline__ void attention_rope_own_key(const AttnArgs& a, const AttnItem& it, int g, int j, int part,
                                                        const __nv_bfloat16* kp, const __nv_bfloat16* vp,
                                                        __nv_bfloat16* dst) {
    const uint4 mine = *reinterpret_cast<const uint4*>(kp + part * 8);
    const uint4 other = *reinterpret_cast<const uint4*>(kp + (part ^ 4) * 8);
    const __nv_bfloat16* m = reinterpret_cast<const __nv_bfloat16*>(&mine);
    const __nv_bfloat16* o = reinterpret_cast<const __nv_bfloat16*>(&other);
    const bool low = part < 4;  // dimensions d < 32: this thread keeps the first of each pair
    const float* cs = a.rope_cos + size_t(j) * (kD / 2) + (part & 3) * 8;
    const float* sn = a.rope_sin + size_t(j) * (kD / 2) + (part & 3) * 8;
    uint4 roped;
    __nv_bfloat16* r = reinterpret_cast<__nv_bfloat16*>(&roped);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        __nv_bfloat16 y0, y1;
        rope_pair(__bfloat162float(low ? m[e] : o[e]), __bfloat162float(low ? o[e] : m[e]), cs[e], sn[e], y0, y1);
        r[e] = low ? y0 : y1;
    }
    *reinterpret_cast<uint4*>(dst) = roped;
    if (a.k_store != nullptr) {
        const size_t off = attention_cache_row(a, it, g, j) * kD + part * 8;
        *reinterpret_cast<uint4*>(a.k_store + off) = roped;
        *reinterpret_cast<uint4*>(a.v_store + off) = *reinterpret_cast<const uint4*>(vp + part * 8);
    }
}

// The decode kernel: one CTA = one decode item (one token, a range of its keys) x one KV head, on
// tensor cores. The 8 query heads of the group are the rows of a 16-row mma fragment (rows 8-15 are
// zero); key tiles of 64 stream through a 3-stage cp.async pipeline, and warp w takes keys
// [16w, 16w + 16) of every tile with its own online softmax (S and P stay in registers, P rounded to
// bf16 for P·V, FP32 accumulators). At the end the 4 warps' (max, sum, output) are merged through
// shared memory, then normalised with the sink (partial < 0) or written as a partial for the merge
// kernel. Memory-bound: the CTA keeps 32 KB of K/V in flight.
__global__ void __launch_bounds__(kThreads) attention_decode_kernel(const AttnArgs a, const AttnItem* items,
                                                                   const AttnMerge* merges) {
    OSPREY_TL_ENTER();
    pdl_enter();  // launch.cuh: before any early return or global access
    OSPREY_TL_WAITED();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [kStages][kTile][kStride]
    __nv_bfloat16* v_s = k_s + kStages * kTile * kStride;

    const AttnItem it = items[blockIdx.x];
    const int g = blockIdx.y;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int h = lane / 4, c = 2 * (lane % 4);  // this lane's fragment row (query head in the group), column pair
    const int p = it.pos0;

    // Q fragments (A operand, rows = heads), scaled by 1/sqrt(64) = 0.125 (exact in bf16). The lane's
    // dimensions ks * 16 + {c, c + 1, c + 8, c + 9} of k-steps ks and ks + 2 are RoPE pairs (d, d + 32),
    // so a fused rotation needs nothing from other lanes.
    uint32_t qf[4][4];
    {
        const __nv_bfloat16* q =
            reinterpret_cast<const __nv_bfloat16*>(a.qkv) + size_t(it.q_token) * a.ld_qkv + (g * kAttnGroup + h) * kD;
        float x[4][4];  // [k-step][c, c + 1, c + 8, c + 9]
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(q + ks * 16 + c);
            const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(q + ks * 16 + c + 8);
            x[ks][0] = __low2float(lo), x[ks][1] = __high2float(lo), x[ks][2] = __low2float(hi), x[ks][3] = __high2float(hi);
        }
        if (a.rope_cos != nullptr) {
            const float* cs = a.rope_cos + size_t(p) * (kD / 2);
            const float* sn = a.rope_sin + size_t(p) * (kD / 2);
#pragma unroll
            for (int ks = 0; ks < 2; ++ks)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int d = ks * 16 + c + (e & 1) + (e >> 1) * 8;
                    __nv_bfloat16 y0, y1;
                    rope_pair(x[ks][e], x[ks + 2][e], cs[d], sn[d], y0, y1);
                    x[ks][e] = __bfloat162float(y0), x[ks + 2][e] = __bfloat162float(y1);
                }
        }
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            qf[ks][0] = pack_bf16(x[ks][0] * 0.125f, x[ks][1] * 0.125f);
            qf[ks][1] = 0;
            qf[ks][2] = pack_bf16(x[ks][2] * 0.125f, x[ks][3] * 0.125f);
            qf[ks][3] = 0;
        }
    }

    const int n_tiles = it.key_end > it.key_begin ? (it.key_end - it.key_begin + kTile - 1) / kTile : 0;
    auto load_tile = [&](int t) {
        const int kt = it.key_begin + t * kTile;
        __nv_bfloat16* ks = k_s + (t % kStages) * kTile * kStride;
        __nv_bfloat16* vs = v_s + (t % kStages) * kTile * kStride;
#pragma unroll
        for (int idx = threadIdx.x; idx < kTile * kD / 8; idx += kThreads) {
            const int key = idx / (kD / 8), part = idx % (kD / 8);
            const int j = kt + key;
            const __nv_bfloat16 *kp = reinterpret_cast<const __nv_bfloat16*>(a.k_cache), *vp = kp;
            const bool valid = j < it.key_end;
            if (valid) attention_kv_rows(a, it, g, j, kp, vp);
            if (valid && a.rope_cos != nullptr && j >= it.slice_start_pos) {  // the own key, rotated here
                attention_rope_own_key(a, it, g, j, part, kp, vp, ks + key * kStride + part * 8);
            } else {
                cp_async16(ks + key * kStride + part * 8, kp + part * 8, valid);  // zero-filled past the end
            }
            cp_async16(vs + key * kStride + part * 8, vp + part * 8, valid);
        }
    };
#pragma unroll
    for (int t = 0; t < kStages - 1; ++t) {
        if (t < n_tiles) load_tile(t);
        cp_async_commit();
    }

    float m = -INFINITY, l = 0.f;  // this warp's running max and (per-lane partial) sum for row h
    float o[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;

    for (int t = 0; t < n_tiles; ++t) {
        cp_async_wait<kStages - 2>();  // this thread's copies of tile t have landed
        __syncthreads();               // everyone's; and the stage tile t + 2 reuses is consumed
        if (t + kStages - 1 < n_tiles) load_tile(t + kStages - 1);
        cp_async_commit();

        const __nv_bfloat16* ks = k_s + (t % kStages) * kTile * kStride + warp * 16 * kStride;
        const __nv_bfloat16* vs = v_s + (t % kStages) * kTile * kStride + warp * 16 * kStride;
        const int i = lane / 8;
        // S = Q · Kᵀ for this warp's 16 keys: two n-tiles of 8 keys, 4 k-steps of 16 dims.
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int kstep = 0; kstep < 4; ++kstep) {
            uint32_t b[4];
            ldmatrix_x4(b, &ks[((i / 2) * 8 + lane % 8) * kStride + kstep * 16 + (i % 2) * 8]);
            mma_bf16(s[0], qf[kstep], b[0], b[1]);
            mma_bf16(s[1], qf[kstep], b[2], b[3]);
        }
        // Mask and online softmax of row h (the quad of lanes 4h..4h+3 holds its 16 scores).
        const int j0 = it.key_begin + t * kTile + warp * 16 + c;
        float tmax = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = j0 + nt * 8 + e;
                const bool ok = j < it.key_end && j <= p && (a.window == 0 || p - j < a.window);
                s[nt][e] = ok ? s[nt][e] : -INFINITY;
                tmax = fmaxf(tmax, s[nt][e]);
            }
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
        const float m_new = fmaxf(m, tmax);
        const float base = m_new == -INFINITY ? 0.f : m_new;
        const float corr = expf(m - base);
        m = m_new;
        float pr[2][2];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) pr[nt][0] = expf(s[nt][0] - base), pr[nt][1] = expf(s[nt][1] - base);
        l = l * corr + (pr[0][0] + pr[0][1] + pr[1][0] + pr[1][1]);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) o[nt][0] *= corr, o[nt][1] *= corr;
        // O += P · V over the 16 keys (one k-step); rows 8-15 of P are zero.
        const uint32_t pa[4] = {pack_bf16(pr[0][0], pr[0][1]), 0u, pack_bf16(pr[1][0], pr[1][1]), 0u};
#pragma unroll
        for (int dp = 0; dp < 4; ++dp) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, &vs[((i % 2) * 8 + lane % 8) * kStride + dp * 16 + (i / 2) * 8]);
            mma_bf16(o[2 * dp], pa, b[0], b[1]);
            mma_bf16(o[2 * dp + 1], pa, b[2], b[3]);
        }
    }
    cp_async_wait_all();
    attention_decode_finish<false>(a, it, merges, g, m, l, o, smem_raw);
    OSPREY_TL_EXIT(a.k_cache, kTlAttention);
}

// ---- FP8 decode (kv_fp8.h) ----
// The same decomposition as attention_decode_kernel (one CTA = one decode item x one KV head, 4 warps
// of 16 keys per 64-key tile, mma.sync with the group's 8 heads as rows 0-7), reading E4M3 codes: a
// key row is 64 bytes (four 16-byte cp.async chunks) and its K and V multipliers 4 bytes each, so a
// tile is 8.5 KB instead of 16 KB. No ldmatrix: each lane builds its B fragments from shared memory
// with 16-byte (K) and 8-byte (V) loads and converts the codes exactly to bf16 (cvt e4m3x2 -> f16x2 ->
// bf16x2). Two permutations make those loads contiguous, both invisible outside the kernel:
//   K: the head dimension of S = Q·Kᵀ is summed in any order, so lane quad t (= lane % 4) takes the
//      16 bytes [16t, 16t + 16) of a key for all four k-steps (k-step ks, fragment half hi, element e
//      is dimension 16t + 4ks + 2hi + e), and Q is loaded with the same permutation.
//   V: B column n of output n-tile nt is dimension 8n + nt, so a lane (n = lane / 4) reads the 8 bytes
//      [8n, 8n + 8) of its four keys and pairs bytes of two keys with prmt; the finish stores columns
//      back in order (attention_decode_finish<true>).
// The multipliers are applied in FP32: S = s_k · (Q·codes) per key, and P·V as Σ bf16(p · s_v) · codes
// while the softmax sum takes the unscaled p. Chunk q of key row r sits at chunk q ^ (2 · ((r >> 2) & 1))
// and the two V loads of a lane go in the order that keeps each 16-lane phase on distinct banks. V
// bytes of keys c and c + 1 are paired by __byte_perm (prmt): selector 0x5140 gives bytes 0 and 1 of
// both as two e4m3x2 pairs, 0x7362 bytes 2 and 3.
constexpr int kF8Row = kD;     // bytes per key row (codes)
constexpr int kF8Stages = 4;   // tiles in flight (each half the bytes of a BF16 tile)
constexpr int kF8TileBytes = kTile * kF8Row;
constexpr size_t decode_fp8_smem_bytes() {
    return size_t(kF8Stages) * (2 * kF8TileBytes + 2 * kTile * sizeof(float));
}
static_assert(decode_fp8_smem_bytes() >= sizeof(float) * kWarps * kAttnGroup * (kD + 2));
__device__ __forceinline__ int f8_chunk(int key, int q) { return q ^ (((key >> 2) & 1) * 2); }

// kF16 (the default, attention_fp8_decode_mma()): the MMAs in FP16 instead of BF16. Every E4M3 value
// is an FP16 value and cvt.rn.f16x2.e4m3x2 gives it in one instruction (BF16 needs three more: f16x2 ->
// f32 -> bf16x2), and Q (BF16, |q| / 8 < 65504 assumed) converts exactly, so S = Q·codes is exact
// up to FP32 accumulation. P·V: P' = p · s_v / s_ref in FP16 (2^-11 relative; s_ref the largest
// multiplier of the warp's 16 keys, so P' <= 1), accumulated per tile and added as o = o · corr +
// s_ref · (P'·codes). !kF16: BF16 operands, P rounded as bf16(p · s_v) into the running accumulators.
template <bool kF16>
__global__ void __launch_bounds__(kThreads) attention_decode_fp8_kernel(const AttnArgs a, const AttnItem* items,
                                                                       const AttnMerge* merges) {
    pdl_enter();  // launch.cuh: before any early return or global access
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint8_t* k_s = smem_raw;                                   // [kF8Stages][kTile][64] codes (swizzled chunks)
    uint8_t* v_s = k_s + kF8Stages * kF8TileBytes;
    float* ks_s = reinterpret_cast<float*>(v_s + kF8Stages * kF8TileBytes);  // [kF8Stages][kTile]
    float* vs_s = ks_s + kF8Stages * kTile;

    const AttnItem it = items[blockIdx.x];
    const int g = blockIdx.y;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int h = lane / 4, t4 = lane % 4, c = 2 * t4;
    const int p = it.pos0;

    // Q fragments (rows = heads) in the K permutation, scaled by 1/sqrt(64) = 0.125 (exact in bf16).
    uint32_t qf[4][4];
    {
        const __nv_bfloat16* q = reinterpret_cast<const __nv_bfloat16*>(a.qkv) + size_t(it.q_token) * a.ld_qkv +
                                 (g * kAttnGroup + h) * kD + 16 * t4;
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(q + 4 * ks);
            const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(q + 4 * ks + 2);
            const auto pack = [](float x, float y) { return kF16 ? pack_f16(x, y) : pack_bf16(x, y); };
            qf[ks][0] = pack(__low2float(lo) * 0.125f, __high2float(lo) * 0.125f);
            qf[ks][1] = 0;
            qf[ks][2] = pack(__low2float(hi) * 0.125f, __high2float(hi) * 0.125f);
            qf[ks][3] = 0;
        }
    }

    const int n_tiles = it.key_end > it.key_begin ? (it.key_end - it.key_begin + kTile - 1) / kTile : 0;
    auto load_tile = [&](int t) {
        const int kt = it.key_begin + t * kTile;
        const int st = t % kF8Stages;
#pragma unroll
        for (int idx = threadIdx.x; idx < kTile * 4; idx += kThreads) {  // (key, 16-byte chunk)
            const int key = idx / 4, q = idx % 4;
            const int j = kt + key;
            const bool valid = j < it.key_end;
            const uint8_t *kp = a.cache8.k, *vp = a.cache8.v;
            const float *ksp = a.cache8.k_scale, *vsp = a.cache8.v_scale;
            if (valid) attention_kv_rows_fp8(a, it, g, j, kp, vp, ksp, vsp);
            const int off = st * kF8TileBytes + key * kF8Row + f8_chunk(key, q) * 16;
            cp_async16(k_s + off, kp + q * 16, valid);  // zero-filled past the end
            cp_async16(v_s + off, vp + q * 16, valid);
            if (q == 0) {
                cp_async4(ks_s + st * kTile + key, ksp, valid);
                cp_async4(vs_s + st * kTile + key, vsp, valid);
            }
        }
    };
#pragma unroll
    for (int t = 0; t < kF8Stages - 1; ++t) {
        if (t < n_tiles) load_tile(t);
        cp_async_commit();
    }

    float m = -INFINITY, l = 0.f;
    float o[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
    // This lane's V rows (keys c, c + 1 and c + 8, c + 9 of the warp's 16): loaded in the order A, B.
    const int v_first = c + (t4 & 1), v_second = c + 1 - (t4 & 1);

    for (int t = 0; t < n_tiles; ++t) {
        cp_async_wait<kF8Stages - 2>();
        __syncthreads();
        if (t + kF8Stages - 1 < n_tiles) load_tile(t + kF8Stages - 1);
        cp_async_commit();

        const int st = t % kF8Stages;
        const uint8_t* kw = k_s + st * kF8TileBytes + warp * 16 * kF8Row;
        const uint8_t* vw = v_s + st * kF8TileBytes + warp * 16 * kF8Row;
        const float* ksc = ks_s + st * kTile + warp * 16;
        const float* vsc = vs_s + st * kTile + warp * 16;
        // S = Q · codesᵀ for this warp's 16 keys (n-tile nt: keys 8nt + lane / 4), then times s_k.
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            const int key = nt * 8 + h;
            const uint4 kc = *reinterpret_cast<const uint4*>(kw + key * kF8Row + f8_chunk(key, t4) * 16);
            const uint32_t w[4] = {kc.x, kc.y, kc.z, kc.w};
#pragma unroll
            for (int ks = 0; ks < 4; ++ks)
                if constexpr (kF16)
                    mma_f16(s[nt], qf[ks], kv_fp8_to_f16x2(w[ks] & 0xFFFFu), kv_fp8_to_f16x2(w[ks] >> 16));
                else
                    mma_bf16(s[nt], qf[ks], kv_fp8_to_bf16x2(w[ks] & 0xFFFFu), kv_fp8_to_bf16x2(w[ks] >> 16));
        }
        const int j0 = it.key_begin + t * kTile + warp * 16 + c;
        float tmax = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = j0 + nt * 8 + e;
                const bool ok = j < it.key_end && j <= p && (a.window == 0 || p - j < a.window);
                s[nt][e] = ok ? s[nt][e] * ksc[nt * 8 + c + e] : -INFINITY;
                tmax = fmaxf(tmax, s[nt][e]);
            }
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
        const float m_new = fmaxf(m, tmax);
        const float base = m_new == -INFINITY ? 0.f : m_new;
        const float corr = expf(m - base);
        m = m_new;
        float pr[2][2];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) pr[nt][0] = expf(s[nt][0] - base), pr[nt][1] = expf(s[nt][1] - base);
        l = l * corr + (pr[0][0] + pr[0][1] + pr[1][0] + pr[1][1]);
        // O += (P · s_v) · codes over the 16 keys (one k-step); rows 8-15 of P are zero.
        uint32_t pa[4];
        float s_ref = 0.f;  // kF16: the largest multiplier of the 16 keys (0: all masked, P = 0)
        if constexpr (kF16) {
            s_ref = fmaxf(fmaxf(vsc[c], vsc[c + 1]), fmaxf(vsc[c + 8], vsc[c + 9]));
            s_ref = fmaxf(s_ref, __shfl_xor_sync(0xffffffffu, s_ref, 1));
            s_ref = fmaxf(s_ref, __shfl_xor_sync(0xffffffffu, s_ref, 2));
            const float inv = s_ref > 0.f ? 1.f / s_ref : 0.f;
            pa[0] = pack_f16(pr[0][0] * (vsc[c] * inv), pr[0][1] * (vsc[c + 1] * inv));
            pa[2] = pack_f16(pr[1][0] * (vsc[c + 8] * inv), pr[1][1] * (vsc[c + 9] * inv));
        } else {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) o[nt][0] *= corr, o[nt][1] *= corr;
            pa[0] = pack_bf16(pr[0][0] * vsc[c], pr[0][1] * vsc[c + 1]);
            pa[2] = pack_bf16(pr[1][0] * vsc[c + 8], pr[1][1] * vsc[c + 9]);
        }
        pa[1] = pa[3] = 0u;
        float ot[8][4];  // kF16: this tile's P'·codes
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) ot[nt][0] = ot[nt][1] = ot[nt][2] = ot[nt][3] = 0.f;
        uint2 lo[2], hi[2];  // [keys c / c + 8]: bytes [8h, 8h + 8) of key c (lo) and c + 1 (hi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r_a = v_first + 8 * half, r_b = v_second + 8 * half;
            const uint2 va = *reinterpret_cast<const uint2*>(vw + r_a * kF8Row + f8_chunk(r_a, h / 2) * 16 + (h % 2) * 8);
            const uint2 vb = *reinterpret_cast<const uint2*>(vw + r_b * kF8Row + f8_chunk(r_b, h / 2) * 16 + (h % 2) * 8);
            lo[half] = (t4 & 1) ? vb : va;
            hi[half] = (t4 & 1) ? va : vb;
        }
#pragma unroll
        for (int wd = 0; wd < 2; ++wd) {  // bytes 0-3 (n-tiles 0-3), 4-7 (n-tiles 4-7)
            uint32_t pairs[2][2];  // [keys c / c + 8][n-tiles 4wd + {0,1} / {2,3}]: two e4m3x2 pairs each
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const uint32_t x = wd ? lo[half].y : lo[half].x, y = wd ? hi[half].y : hi[half].x;
                pairs[half][0] = __byte_perm(x, y, 0x5140);
                pairs[half][1] = __byte_perm(x, y, 0x7362);
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int nt = 4 * wd + q;
                const uint32_t x0 = (pairs[0][q / 2] >> (16 * (q % 2))) & 0xFFFFu;
                const uint32_t x1 = (pairs[1][q / 2] >> (16 * (q % 2))) & 0xFFFFu;
                if constexpr (kF16)
                    mma_f16(ot[nt], pa, kv_fp8_to_f16x2(x0), kv_fp8_to_f16x2(x1));
                else
                    mma_bf16(o[nt], pa, kv_fp8_to_bf16x2(x0), kv_fp8_to_bf16x2(x1));
            }
        }
        if constexpr (kF16) {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                o[nt][0] = fmaf(o[nt][0], corr, ot[nt][0] * s_ref);
                o[nt][1] = fmaf(o[nt][1], corr, ot[nt][1] * s_ref);
            }
        }
    }
    cp_async_wait_all();
    attention_decode_finish<true>(a, it, merges, g, m, l, o, smem_raw);
}

// One CTA = one split decode token x one KV head; warp h merges query head g * kGroup + h.
__global__ void __launch_bounds__(kAttnGroup * kWarpSize) attention_merge_kernel(const AttnArgs a,
                                                                                const AttnMerge* merges) {
    pdl_enter();  // launch.cuh: before any early return or global access
    const AttnMerge mg = merges[blockIdx.x];
    const int g = blockIdx.y;
    const int h = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const int head = g * kAttnGroup + h;
    const float sink = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(a.sinks)[head]);
    float mf = sink;
    for (int s = 0; s < mg.n_partials; ++s) {
        mf = fmaxf(mf, a.partial_ml[(size_t(mg.first_partial + s) * a.n_kv_heads + g) * kAttnGroup + h].x);
    }
    float den = expf(sink - mf);  // the sink, counted once
    float o0 = 0.f, o1 = 0.f;
    for (int s = 0; s < mg.n_partials; ++s) {
        const size_t pidx = (size_t(mg.first_partial + s) * a.n_kv_heads + g) * kAttnGroup + h;
        const float2 ml = a.partial_ml[pidx];
        const float w = expf(ml.x - mf);  // 0 for a split that saw no allowed key (max = -inf)
        den += ml.y * w;
        const float2 acc = *reinterpret_cast<const float2*>(a.partial_acc + pidx * kD + 2 * lane);
        o0 += acc.x * w, o1 += acc.y * w;
    }
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(a.out + size_t(mg.token) * a.ld_out + head * kD) + lane;
    *o = __floats2bfloat162_rn(o0 / den, o1 / den);
}

// ---- end of decode device code ----

void launch_decode(const AttnArgs& a, const AttnItem* items, int n_items, const AttnMerge* merges,
                   AttnFp8DecodeMma fp8_mma, cudaStream_t stream) {
    if (n_items == 0) return;
    if (a.cache8.on()) {
        if (fp8_mma == AttnFp8DecodeMma::f16)
            cuda::launch(attention_decode_fp8_kernel<true>, dim3(n_items, a.n_kv_heads), kThreads,
                         decode_fp8_smem_bytes(), stream, a, items, merges);
        else
            cuda::launch(attention_decode_fp8_kernel<false>, dim3(n_items, a.n_kv_heads), kThreads,
                         decode_fp8_smem_bytes(), stream, a, items, merges);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    cuda::launch(attention_decode_kernel, dim3(n_items, a.n_kv_heads), kThreads, decode_smem_bytes(), stream, a, items,
                 merges);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void attention_configure() {
    // Once per thread, not per process: the attribute is per device, and with a parallel layout each
    // rank's thread drives its own GPU (model/cuda/parallel_cuda.h).
    thread_local const bool done = [] {
        CUDA_CHECK(cudaFuncSetAttribute(attention_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(decode_smem_bytes())));
        CUDA_CHECK(cudaFuncSetAttribute(attention_decode_fp8_kernel<true>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(decode_fp8_smem_bytes())));
        CUDA_CHECK(cudaFuncSetAttribute(attention_decode_fp8_kernel<false>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(decode_fp8_smem_bytes())));
        attention_prefill_wgmma_configure();
        return true;
    }();
    (void)done;
}

void attention(const AttnArgs& a, const AttnDevicePlan& plan, cudaStream_t stream) {
    attention_configure();
    OSPREY_CHECK(a.n_kv_heads > 0 && a.n_q_heads == a.n_kv_heads * kAttnGroup, "attention: ", a.n_q_heads,
                 " query heads for ", a.n_kv_heads, " KV heads; only a group of ", kAttnGroup, " is compiled");
    dispatch_int<kAttnHeadDim>("attention head_dim", a.head_dim, [&]<int>() {});
    OSPREY_CHECK(a.out && a.qkv && a.sinks, "attention: null pointer");
    OSPREY_CHECK(a.ld_qkv >= (a.n_q_heads + 2 * a.n_kv_heads) * a.head_dim && a.ld_out >= a.n_q_heads * a.head_dim,
                 "attention: row strides too small (qkv ", a.ld_qkv, ", out ", a.ld_out, ")");
    OSPREY_CHECK(a.ld_qkv % 8 == 0 && a.ld_out % 2 == 0, "attention: row strides must allow vector access");
    OSPREY_CHECK(a.window >= 0 && a.rows > 0 && (!a.ring || a.rows >= a.window),
                 "attention: cache rows ", a.rows, " for window ", a.window);
    OSPREY_CHECK(a.ring || a.page_table, "attention: paged layer without a page table");
    OSPREY_CHECK(plan.n_merges == 0 || (a.partial_acc && a.partial_ml), "attention: split plan without scratch");
    OSPREY_CHECK(!a.cache8.on() || (a.cache8.v && a.cache8.k_scale && a.cache8.v_scale && a.step8.on() && a.step8.v &&
                                    a.step8.k_scale && a.step8.v_scale),
                 "attention: FP8 KV cache without its multipliers or the step's FP8 rows");
    OSPREY_CHECK(a.rope_cos == nullptr || (a.rope_sin && plan.n_prefill == 0 && !a.cache8.on()),
                 "attention: RoPE is fused into decode items over a BF16 cache only (", plan.n_prefill,
                 " prefill items, ", a.cache8.on() ? "FP8" : "BF16", " cache)");
    OSPREY_CHECK((a.k_store == nullptr) == (a.v_store == nullptr) && (a.k_store == nullptr || a.rope_cos),
                 "attention: the fused K/V store needs both caches and the fused RoPE");
    launch_decode(a, plan.decode, plan.n_decode, plan.merges, plan.fp8_decode, stream);
    if (plan.prefill_kernel == AttnPrefillKernel::wgmma)
        attention_prefill_wgmma(a, plan.prefill, plan.n_prefill, plan.wgmma_variant, stream);  // wgmma
    else
        attention_prefill(a, plan.prefill, plan.n_prefill, stream);  // mma.sync (attention_prefill.cu)
    if (plan.n_merges > 0 && a.merge_counters == nullptr) {
        cuda::launch(attention_merge_kernel, dim3(plan.n_merges, a.n_kv_heads), kAttnGroup * kWarpSize, 0, stream, a, plan.merges);
        CUDA_CHECK(cudaGetLastError());
    }
}

}  // namespace osprey::cuda
