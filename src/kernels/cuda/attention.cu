#include "kernels/cuda/attention.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention_prefill.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {

AttnPlan plan_attention(std::span<const AttnSlice> slices, int window, int n_kv_heads, int target_ctas,
                        bool fixed_splits) {
    OSPREY_CHECK(window >= 0 && n_kv_heads > 0, "plan_attention: window ", window, ", n_kv_heads ", n_kv_heads);
    AttnPlan plan;
    int n_decode_tokens = 0;
    for (const AttnSlice& s : slices) {
        OSPREY_CHECK(s.n_tokens > 0 && s.start_pos >= 0 && s.first_token >= 0 && s.first_key >= 0 &&
                         s.first_key <= s.start_pos,
                     "plan_attention: bad slice (tokens ", s.n_tokens, ", start_pos ", s.start_pos, ", first_key ",
                     s.first_key, ")");
        n_decode_tokens += s.n_tokens == 1;
    }
    // Splits per decode token: enough to fill target_ctas, never below kMinKeysPerSplit keys each.
    int want_splits = std::max(1, target_ctas / std::max(1, n_decode_tokens * n_kv_heads));
    if (fixed_splits) {
        int needed = 1;  // splits the longest decode context can use
        for (const AttnSlice& s : slices) {
            if (s.n_tokens != 1) continue;
            const int lo = std::max(s.first_key, window ? s.start_pos - window + 1 : 0);
            needed = std::max(needed, (s.start_pos + 1 - lo + kMinKeysPerSplit - 1) / kMinKeysPerSplit);
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
            const int max_splits = (n_keys + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
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
                for (int i = 0; i < made; ++i) plan.decode[plan.decode.size() - made + i].partial = first_partial + i;
                plan.merges.push_back({s.first_token, first_partial, made});
                plan.n_partials += made;
            }
        } else {
            for (int t = 0; t < s.n_tokens; t += kPrefillTokens) {
                AttnItem it = base;
                it.q_token = s.first_token + t;
                it.n_q = std::min(kPrefillTokens, s.n_tokens - t);
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

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kD = kAttnHeadDim;
constexpr int kKStride = kD + 1;  // pad K rows so lanes reading K[lane][d] hit distinct banks

template <int kQ>
constexpr size_t smem_bytes() {
    return sizeof(float) * (size_t(kQ) * kAttnGroup * kD + kAttnKeyTile * kKStride + kAttnKeyTile * kD);
}

// The decode kernel (kQ = 1; prefill items run on tensor cores in attention_prefill.cu).
// One CTA = one item x one KV head: kQ query tokens x kGroup heads = kRows query rows. Warp w owns
// rows [w * kRowsPerWarp, (w + 1) * kRowsPerWarp); within a key tile lane l scores keys l and l + 32
// and accumulates output dims 2l, 2l + 1.
template <int kQ>
__global__ void __launch_bounds__(kThreads) attention_kernel(const AttnArgs a, const AttnItem* items) {
    constexpr int kRows = kQ * kAttnGroup;
    constexpr int kRowsPerWarp = kRows / kWarps;
    static_assert(kRows % kWarps == 0);
    extern __shared__ float smem[];
    float* q_s = smem;                          // [kRows, kD]
    float* k_s = q_s + kRows * kD;              // [kKeyTile, kKStride]
    float* v_s = k_s + kAttnKeyTile * kKStride; // [kKeyTile, kD]

    const AttnItem it = items[blockIdx.x];
    const int g = blockIdx.y;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const __nv_bfloat16* qkv = reinterpret_cast<const __nv_bfloat16*>(a.qkv);

    // Query rows, pre-scaled by 1/sqrt(64) = 0.125 (exact).
    for (int idx = threadIdx.x; idx < kRows * kD / 8; idx += kThreads) {
        const int r = idx / (kD / 8), part = idx % (kD / 8);
        const int tq = r / kAttnGroup, h = r % kAttnGroup;
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (tq < it.n_q) {
            const uint4 u = *reinterpret_cast<const uint4*>(qkv + size_t(it.q_token + tq) * a.ld_qkv +
                                                            (g * kAttnGroup + h) * kD + part * 8);
            bf16x8_to_float(u, f);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) q_s[r * kD + part * 8 + e] = f[e] * 0.125f;
    }

    float m[kRowsPerWarp], l[kRowsPerWarp], acc0[kRowsPerWarp], acc1[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) m[i] = -INFINITY, l[i] = 0.f, acc0[i] = 0.f, acc1[i] = 0.f;

    const int k_col = a.n_q_heads * kD + g * kD;
    const int v_col = (a.n_q_heads + a.n_kv_heads) * kD + g * kD;
    for (int kt = it.key_begin; kt < it.key_end; kt += kAttnKeyTile) {
        __syncthreads();  // previous tile fully consumed (and q_s written, first time)
        for (int idx = threadIdx.x; idx < kAttnKeyTile * kD / 8; idx += kThreads) {
            const int key = idx / (kD / 8), part = idx % (kD / 8);
            const int j = kt + key;
            float kf[8] = {0, 0, 0, 0, 0, 0, 0, 0}, vf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (j < it.key_end) {
                const __nv_bfloat16 *kp, *vp;
                if (j >= it.slice_start_pos) {
                    const size_t row = size_t(it.slice_first_token + j - it.slice_start_pos) * a.ld_qkv;
                    kp = qkv + row + k_col, vp = qkv + row + v_col;
                } else {
                    const int block = a.ring ? it.window_slot : a.page_table[it.page_offset + j / a.rows];
                    const size_t off = ((size_t(block) * a.n_kv_heads + g) * a.rows + j % a.rows) * kD;
                    kp = reinterpret_cast<const __nv_bfloat16*>(a.k_cache) + off;
                    vp = reinterpret_cast<const __nv_bfloat16*>(a.v_cache) + off;
                }
                bf16x8_to_float(*reinterpret_cast<const uint4*>(kp + part * 8), kf);
                bf16x8_to_float(*reinterpret_cast<const uint4*>(vp + part * 8), vf);
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                k_s[key * kKStride + part * 8 + e] = kf[e];
                v_s[key * kD + part * 8 + e] = vf[e];
            }
        }
        __syncthreads();

        float s0[kRowsPerWarp], s1[kRowsPerWarp];
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) s0[i] = 0.f, s1[i] = 0.f;
#pragma unroll 8
        for (int d = 0; d < kD; ++d) {
            const float k0 = k_s[lane * kKStride + d], k1 = k_s[(lane + 32) * kKStride + d];
#pragma unroll
            for (int i = 0; i < kRowsPerWarp; ++i) {
                const float qv = q_s[(warp * kRowsPerWarp + i) * kD + d];
                s0[i] = fmaf(qv, k0, s0[i]);
                s1[i] = fmaf(qv, k1, s1[i]);
            }
        }
        const int j0 = kt + lane, j1 = kt + lane + 32;
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            const int p = it.pos0 + (warp * kRowsPerWarp + i) / kAttnGroup;
            const bool ok0 = j0 < it.key_end && j0 <= p && (a.window == 0 || p - j0 < a.window);
            const bool ok1 = j1 < it.key_end && j1 <= p && (a.window == 0 || p - j1 < a.window);
            const float z0 = ok0 ? s0[i] : -INFINITY, z1 = ok1 ? s1[i] : -INFINITY;
            const float m_new = fmaxf(m[i], warp_reduce_max(fmaxf(z0, z1)));
            if (m_new == -INFINITY) {
                s0[i] = 0.f, s1[i] = 0.f;  // nothing allowed yet for this row
                continue;
            }
            const float corr = expf(m[i] - m_new);
            s0[i] = expf(z0 - m_new), s1[i] = expf(z1 - m_new);
            l[i] = l[i] * corr + warp_reduce_sum(s0[i] + s1[i]);
            acc0[i] *= corr, acc1[i] *= corr;
            m[i] = m_new;
        }
#pragma unroll 4
        for (int k = 0; k < 32; ++k) {
            const float2 v = *reinterpret_cast<const float2*>(&v_s[k * kD + 2 * lane]);
#pragma unroll
            for (int i = 0; i < kRowsPerWarp; ++i) {
                const float pk = __shfl_sync(0xffffffffu, s0[i], k);
                acc0[i] = fmaf(pk, v.x, acc0[i]);
                acc1[i] = fmaf(pk, v.y, acc1[i]);
            }
        }
#pragma unroll 4
        for (int k = 0; k < 32; ++k) {
            const float2 v = *reinterpret_cast<const float2*>(&v_s[(k + 32) * kD + 2 * lane]);
#pragma unroll
            for (int i = 0; i < kRowsPerWarp; ++i) {
                const float pk = __shfl_sync(0xffffffffu, s1[i], k);
                acc0[i] = fmaf(pk, v.x, acc0[i]);
                acc1[i] = fmaf(pk, v.y, acc1[i]);
            }
        }
    }

#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
        const int r = warp * kRowsPerWarp + i;
        const int tq = r / kAttnGroup, h = r % kAttnGroup;
        if (tq >= it.n_q) continue;
        const int head = g * kAttnGroup + h;
        if (it.partial < 0) {
            const float sink = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(a.sinks)[head]);
            const float mf = fmaxf(m[i], sink);
            const float keep = expf(m[i] - mf);
            const float scale = keep / (l[i] * keep + expf(sink - mf));
            __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(a.out + size_t(it.q_token + tq) * a.ld_out +
                                                                  head * kD) + lane;
            *o = __floats2bfloat162_rn(acc0[i] * scale, acc1[i] * scale);
        } else {
            const size_t pidx = (size_t(it.partial) * a.n_kv_heads + g) * kAttnGroup + h;
            *reinterpret_cast<float2*>(a.partial_acc + pidx * kD + 2 * lane) = make_float2(acc0[i], acc1[i]);
            if (lane == 0) a.partial_ml[pidx] = make_float2(m[i], l[i]);
        }
    }
}

// One CTA = one split decode token x one KV head; warp h merges query head g * kGroup + h.
__global__ void __launch_bounds__(kAttnGroup * kWarpSize) attention_merge_kernel(const AttnArgs a,
                                                                                const AttnMerge* merges) {
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

template <int kQ>
void launch_items(const AttnArgs& a, const AttnItem* items, int n_items, cudaStream_t stream) {
    if (n_items == 0) return;
    constexpr size_t smem = smem_bytes<kQ>();
    attention_kernel<kQ><<<dim3(n_items, a.n_kv_heads), kThreads, smem, stream>>>(a, items);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void attention_configure() {
    static const bool done = [] {
        CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(smem_bytes<1>())));
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
    launch_items<1>(a, plan.decode, plan.n_decode, stream);
    attention_prefill(a, plan.prefill, plan.n_prefill, stream);  // tensor cores (attention_prefill.cu)
    if (plan.n_merges > 0) {
        attention_merge_kernel<<<dim3(plan.n_merges, a.n_kv_heads), kAttnGroup * kWarpSize, 0, stream>>>(a, plan.merges);
        CUDA_CHECK(cudaGetLastError());
    }
}

}  // namespace osprey::cuda
