#include "kernels/cuda/rope.h"
#include "kernels/cuda/launch.cuh"

#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_cache_row.cuh"
#include "kernels/cuda/kv_fp8.cuh"
#include "kernels/cuda/rope_pair.cuh"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 256;

// One thread per (head, d) pair of one token (blockIdx.x). With a store, the thread of a k pair also
// writes its two roped values into the cache row, and the v head dimensions are copied alongside.
__global__ void __launch_bounds__(kThreads) rope_kernel(const RopeArgs a) {
    pdl_enter();  // launch.cuh: before any early return or global access
    const int t = blockIdx.x;
    const int half = a.head_dim / 2;
    const int n_pairs = (a.n_q_heads + a.n_kv_heads) * half;
    const int p = a.positions[t];
    __nv_bfloat16* row = reinterpret_cast<__nv_bfloat16*>(a.qkv) + size_t(t) * a.ld;
    const float* cos_p = a.cos + size_t(p) * half;
    const float* sin_p = a.sin + size_t(p) * half;
    const KvStoreRow dst = a.store ? a.store[t] : KvStoreRow{};
    // Element (kv head g, dim c) of the token's cache row.
    auto cache_at = [&](__nv_bfloat16* cache, int g, int c) {
        return cache + kv_cache_row(dst.block, a.n_kv_heads, g, a.rows, dst.row) * a.head_dim + c;
    };
    for (int i = threadIdx.x; i < n_pairs; i += kThreads) {
        const int head = i / half, d = i % half;
        __nv_bfloat16* x = row + head * a.head_dim;
        const float x0 = __bfloat162float(x[d]), x1 = __bfloat162float(x[d + half]);
        __nv_bfloat16 y0, y1;
        rope_pair(x0, x1, cos_p[d], sin_p[d], y0, y1);
        x[d] = y0;
        x[d + half] = y1;
        if (a.store && a.k_cache && head >= a.n_q_heads) {
            __nv_bfloat16* k = cache_at(reinterpret_cast<__nv_bfloat16*>(a.k_cache), head - a.n_q_heads, d);
            k[0] = y0;
            k[half] = y1;
        }
    }
    if (a.step8.on()) {
        // FP8 KV: warp w quantises rows w, w + 8, ... of the token's 2 * n_kv_heads K and V heads (the
        // roped K written above by other threads: visible after the barrier), 2 values per lane.
        __syncthreads();
        const int lane = threadIdx.x % kWarpSize;
        for (int r = threadIdx.x / kWarpSize; r < 2 * a.n_kv_heads; r += kThreads / kWarpSize) {
            const bool is_v = r >= a.n_kv_heads;
            const int g = is_v ? r - a.n_kv_heads : r;
            const __nv_bfloat162 x =
                reinterpret_cast<const __nv_bfloat162*>(row + (a.n_q_heads + r) * a.head_dim)[lane];
            const float x0 = __low2float(x), x1 = __high2float(x);
            const float s = kv_fp8_scale(warp_reduce_max(fmaxf(fabsf(x0), fabsf(x1))));
            const uint16_t codes = kv_fp8_encode2(x0, x1, s);
            const size_t si = size_t(t) * a.n_kv_heads + g;
            reinterpret_cast<uint16_t*>((is_v ? a.step8.v : a.step8.k) + si * a.head_dim)[lane] = codes;
            if (lane == 0) (is_v ? a.step8.v_scale : a.step8.k_scale)[si] = s;
            if (a.store) {
                const size_t ci = kv_cache_row(dst.block, a.n_kv_heads, g, a.rows, dst.row);
                reinterpret_cast<uint16_t*>((is_v ? a.cache8.v : a.cache8.k) + ci * a.head_dim)[lane] = codes;
                if (lane == 0) (is_v ? a.cache8.v_scale : a.cache8.k_scale)[ci] = s;
            }
        }
    } else if (a.store) {
        const __nv_bfloat16* v = row + (a.n_q_heads + a.n_kv_heads) * a.head_dim;
        for (int i = threadIdx.x; i < a.n_kv_heads * a.head_dim; i += kThreads)
            *cache_at(reinterpret_cast<__nv_bfloat16*>(a.v_cache), i / a.head_dim, i % a.head_dim) = v[i];
    }
}

}  // namespace

void rope(const RopeArgs& a, cudaStream_t stream) {
    OSPREY_CHECK(a.n_tokens > 0 && a.head_dim > 0 && a.head_dim % 2 == 0 && a.n_q_heads > 0 && a.n_kv_heads >= 0,
                 "rope: bad shape (n_tokens ", a.n_tokens, ", head_dim ", a.head_dim, ", heads ", a.n_q_heads, "+",
                 a.n_kv_heads, ")");
    OSPREY_CHECK(a.ld >= (a.n_q_heads + a.n_kv_heads) * a.head_dim, "rope: row stride ", a.ld,
                 " shorter than the rotated heads");
    OSPREY_CHECK(a.qkv && a.positions && a.cos && a.sin, "rope: null pointer");
    OSPREY_CHECK(!a.store || ((a.step8.on() ? a.cache8.on() : a.k_cache && a.v_cache) && a.rows > 0 && a.n_kv_heads > 0),
                 "rope: a K/V store needs both caches and their rows per block");
    OSPREY_CHECK(!a.step8.on() || (a.head_dim == 2 * 32 && a.step8.v && a.step8.k_scale && a.step8.v_scale),
                 "rope: the FP8 KV quantisation is compiled for head_dim 64 (got ", a.head_dim, ")");
    OSPREY_CHECK(!a.cache8.on() || a.step8.on(), "rope: an FP8 cache store needs the step's FP8 rows");
    cuda::launch(rope_kernel, a.n_tokens, kThreads, 0, stream, a);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::cuda
