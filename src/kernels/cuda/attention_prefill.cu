#include "kernels/cuda/attention_prefill.h"
#include "kernels/cuda/launch.cuh"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_kv.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_fp8.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 128;                       // 4 warps x 16 query rows
constexpr int kD = kAttnHeadDim;                    // 64
constexpr int kRows = kPrefillTokens * kAttnGroup;  // 64 query rows per CTA
constexpr int kTile = kAttnKeyTile;                 // 64 keys per tile
constexpr int kStride = kD + 8;                     // bf16 per smem row: 144 bytes, ldmatrix conflict-free
static_assert(kRows == 4 * 16 && kD == 64 && kTile == 64);

// Row r of the CTA is query token r / 8 (of the item) and head g * 8 + r % 8. Warp w owns rows
// [16w, 16w + 16) = tokens 2w (fragment rows 0-7) and 2w + 1 (rows 8-15), all 8 heads each.
__global__ void __launch_bounds__(kThreads) attention_prefill_kernel(const AttnArgs a, const AttnItem* items) {
    pdl_enter();  // launch.cuh: before any early return or global access
    __shared__ alignas(16) __nv_bfloat16 q_s[kRows * kStride];
    __shared__ alignas(16) __nv_bfloat16 k_s[kTile * kStride];
    __shared__ alignas(16) __nv_bfloat16 v_s[kTile * kStride];

    const AttnItem it = items[blockIdx.x];
    const int g = blockIdx.y;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const __nv_bfloat16* qkv = reinterpret_cast<const __nv_bfloat16*>(a.qkv);

    // Query rows into shared memory, scaled by 1/sqrt(64) = 0.125 (exact in bf16).
    for (int idx = threadIdx.x; idx < kRows * kD / 8; idx += kThreads) {
        const int r = idx / (kD / 8), part = idx % (kD / 8);
        const int tq = r / kAttnGroup, h = r % kAttnGroup;
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (tq < it.n_q) {
            bf16x8_to_float(*reinterpret_cast<const uint4*>(qkv + size_t(it.q_token + tq) * a.ld_qkv +
                                                            (g * kAttnGroup + h) * kD + part * 8),
                            f);
#pragma unroll
            for (int e = 0; e < 8; ++e) f[e] *= 0.125f;
        }
        *reinterpret_cast<uint4*>(&q_s[r * kStride + part * 8]) = float_to_bf16x8(f);
    }
    __syncthreads();

    // Q fragments of this warp's 16 rows, 4 k-steps of 16 dims.
    uint32_t qf[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
        ldmatrix_x4(qf[ks], &q_s[(warp * 16 + lane % 16) * kStride + ks * 16 + (lane / 16) * 8]);

    const int row0 = lane / 4;                     // fragment rows row0 (token 2w) and row0 + 8 (token 2w + 1)
    const int p_a = it.pos0 + 2 * warp, p_b = p_a + 1;  // their positions
    const bool live_a = 2 * warp < it.n_q, live_b = 2 * warp + 1 < it.n_q;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
    float o[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;

    for (int kt = it.key_begin; kt < it.key_end; kt += kTile) {
        __syncthreads();  // the previous tile is consumed
        for (int idx = threadIdx.x; idx < kTile * kD / 8; idx += kThreads) {
            const int key = idx / (kD / 8), part = idx % (kD / 8);
            const int j = kt + key;
            __nv_bfloat16* ks = &k_s[key * kStride + part * 8];
            __nv_bfloat16* vs = &v_s[key * kStride + part * 8];
            if (j < it.key_end && a.cache8.on()) {  // FP8 cache: dequantised to bf16 while staging
                const uint8_t *kp, *vp;
                const float *ksp, *vsp;
                attention_kv_rows_fp8(a, it, g, j, kp, vp, ksp, vsp);
                *reinterpret_cast<uint4*>(ks) = kv_fp8x8_to_bf16x8(*reinterpret_cast<const uint2*>(kp + part * 8), *ksp);
                *reinterpret_cast<uint4*>(vs) = kv_fp8x8_to_bf16x8(*reinterpret_cast<const uint2*>(vp + part * 8), *vsp);
            } else if (j < it.key_end) {
                const __nv_bfloat16 *kp, *vp;
                attention_kv_rows(a, it, g, j, kp, vp);
                cp_async16(ks, kp + part * 8);
                cp_async16(vs, vp + part * 8);
            } else {
                *reinterpret_cast<uint4*>(ks) = make_uint4(0, 0, 0, 0);
                *reinterpret_cast<uint4*>(vs) = make_uint4(0, 0, 0, 0);
            }
        }
        cp_async_wait_all();
        __syncthreads();

        // S = Q · Kᵀ for 64 keys: 8 n-tiles of 8 keys.
        float s[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
            for (int np = 0; np < 4; ++np) {  // pairs of n-tiles
                uint32_t b[4];
                const int i = lane / 8;
                ldmatrix_x4(b, &k_s[(np * 16 + (i / 2) * 8 + lane % 8) * kStride + ks * 16 + (i % 2) * 8]);
                mma_bf16(s[2 * np], qf[ks], b[0], b[1]);
                mma_bf16(s[2 * np + 1], qf[ks], b[2], b[3]);
            }
        }

        // Mask, online softmax (rows a = token 2w, b = token 2w + 1; a quad shares a row).
        float tmax_a = -INFINITY, tmax_b = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = kt + nt * 8 + 2 * (lane % 4) + e;
                const bool in = j < it.key_end;
                const bool ok_a = live_a && in && j <= p_a && (a.window == 0 || p_a - j < a.window);
                const bool ok_b = live_b && in && j <= p_b && (a.window == 0 || p_b - j < a.window);
                s[nt][e] = ok_a ? s[nt][e] : -INFINITY;
                s[nt][2 + e] = ok_b ? s[nt][2 + e] : -INFINITY;
                tmax_a = fmaxf(tmax_a, s[nt][e]);
                tmax_b = fmaxf(tmax_b, s[nt][2 + e]);
            }
        }
#pragma unroll
        for (int o2 = 1; o2 <= 2; o2 *= 2) {
            tmax_a = fmaxf(tmax_a, __shfl_xor_sync(0xffffffffu, tmax_a, o2));
            tmax_b = fmaxf(tmax_b, __shfl_xor_sync(0xffffffffu, tmax_b, o2));
        }
        const float mn_a = fmaxf(m_a, tmax_a), mn_b = fmaxf(m_b, tmax_b);
        const float base_a = mn_a == -INFINITY ? 0.f : mn_a, base_b = mn_b == -INFINITY ? 0.f : mn_b;
        const float corr_a = expf(m_a - base_a), corr_b = expf(m_b - base_b);
        m_a = mn_a, m_b = mn_b;
        float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            s[nt][0] = expf(s[nt][0] - base_a), s[nt][1] = expf(s[nt][1] - base_a);
            s[nt][2] = expf(s[nt][2] - base_b), s[nt][3] = expf(s[nt][3] - base_b);
            sum_a += s[nt][0] + s[nt][1], sum_b += s[nt][2] + s[nt][3];
            o[nt][0] *= corr_a, o[nt][1] *= corr_a, o[nt][2] *= corr_b, o[nt][3] *= corr_b;
        }
        l_a = l_a * corr_a + sum_a;  // per-thread partial sums; the quad is reduced at the end
        l_b = l_b * corr_b + sum_b;

        // O += P · V: P (bf16) from the S fragments, 4 k-steps of 16 keys; V via transposed loads.
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                    pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dp = 0; dp < 4; ++dp) {  // pairs of 8-dim output tiles
                uint32_t b[4];
                const int i = lane / 8;
                ldmatrix_x4_trans(b, &v_s[(kk * 16 + (i % 2) * 8 + lane % 8) * kStride + dp * 16 + (i / 2) * 8]);
                mma_bf16(o[2 * dp], pa, b[0], b[1]);
                mma_bf16(o[2 * dp + 1], pa, b[2], b[3]);
            }
        }
    }

#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 *= 2) {
        l_a += __shfl_xor_sync(0xffffffffu, l_a, o2);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, o2);
    }
    const int head = g * kAttnGroup + row0;
    const float sink = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(a.sinks)[head]);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        if (!(half == 0 ? live_a : live_b)) continue;
        const float m = half == 0 ? m_a : m_b, l = half == 0 ? l_a : l_b;
        const float mf = fmaxf(m, sink);
        const float keep = expf(m - mf);
        const float scale = keep / (l * keep + expf(sink - mf));
        bf16* out_row = a.out + size_t(it.q_token + 2 * warp + half) * a.ld_out + head * kD;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            *reinterpret_cast<uint32_t*>(out_row + nt * 8 + 2 * (lane % 4)) =
                pack_bf16(o[nt][2 * half] * scale, o[nt][2 * half + 1] * scale);
        }
    }
}

}  // namespace

void attention_prefill(const AttnArgs& a, const AttnItem* items, int n_items, cudaStream_t stream) {
    if (n_items == 0) return;
    OSPREY_CHECK(a.n_q_heads == a.n_kv_heads * kAttnGroup && a.head_dim == kAttnHeadDim,
                 "attention_prefill: compiled for head_dim ", kAttnHeadDim, " and a group of ", kAttnGroup);
    cuda::launch(attention_prefill_kernel, dim3(n_items, a.n_kv_heads), kThreads, 0, stream, a, items);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::cuda
