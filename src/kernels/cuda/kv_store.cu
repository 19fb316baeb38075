#include "kernels/cuda/kv_store.h"
#include "kernels/cuda/launch.cuh"

#include <algorithm>

#include "kernels/cuda/kv_cache_row.cuh"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {

std::vector<KvStoreRow> plan_kv_store(std::span<const KvStoreSlice> slices, bool ring, int rows) {
    OSPREY_CHECK(rows > 0, "plan_kv_store: rows ", rows);
    std::vector<KvStoreRow> out;
    for (const KvStoreSlice& s : slices) {
        const int first = ring ? std::max(0, s.n_tokens - rows) : std::clamp(s.n_skip, 0, s.n_tokens);
        for (int t = first; t < s.n_tokens; ++t) {
            const int p = s.start_pos + t;
            int block = s.window_slot;
            if (!ring) {
                OSPREY_CHECK(size_t(p / rows) < s.pages.size(), "kv store: position ", p, " has no page (",
                             s.pages.size(), " pages of ", rows, " rows)");
                block = s.pages[p / rows];
            }
            out.push_back({s.first_token + t, block, p % rows});
        }
    }
    return out;
}

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) kv_store_kernel(const KvStoreArgs a) {
    pdl_enter();  // launch.cuh: before any early return or global access
    const KvStoreRow d = a.dst[blockIdx.x];
    const int width = a.n_kv_heads * a.head_dim;  // elements of K (and of V) per token
    const bf16* k_src = a.qkv + size_t(d.token) * a.ld_qkv + a.n_q_heads * a.head_dim;
    const bf16* v_src = k_src + width;
    for (int i = threadIdx.x; i < 2 * width / 8; i += kThreads) {
        const bool is_v = i >= width / 8;
        const int e = (is_v ? i - width / 8 : i) * 8;  // element in [0, width)
        const int g = e / a.head_dim, c = e % a.head_dim;
        const size_t off = kv_cache_row(d.block, a.n_kv_heads, g, a.rows, d.row) * a.head_dim + c;
        const uint4 v = *reinterpret_cast<const uint4*>((is_v ? v_src : k_src) + e);
        *reinterpret_cast<uint4*>((is_v ? a.v_cache : a.k_cache) + off) = v;
    }
}

// FP8: codes (head_dim bytes per head, 16 at a time) and multipliers from the step's row to the cache's.
__global__ void __launch_bounds__(kThreads) kv_store_fp8_kernel(const KvStoreArgs a) {
    pdl_enter();  // launch.cuh: before any early return or global access
    const KvStoreRow d = a.dst[blockIdx.x];
    const int chunks = a.head_dim / 16;  // per head
    for (int i = threadIdx.x; i < 2 * a.n_kv_heads * chunks; i += kThreads) {
        const bool is_v = i >= a.n_kv_heads * chunks;
        const int e = is_v ? i - a.n_kv_heads * chunks : i;
        const int g = e / chunks, c = e % chunks;
        const size_t src = size_t(d.token) * a.n_kv_heads + g;
        const size_t dst = kv_cache_row(d.block, a.n_kv_heads, g, a.rows, d.row);
        const uint8_t* from = is_v ? a.step8.v : a.step8.k;
        uint8_t* to = is_v ? a.cache8.v : a.cache8.k;
        *reinterpret_cast<uint4*>(to + dst * a.head_dim + c * 16) =
            *reinterpret_cast<const uint4*>(from + src * a.head_dim + c * 16);
        if (c == 0) (is_v ? a.cache8.v_scale : a.cache8.k_scale)[dst] = (is_v ? a.step8.v_scale : a.step8.k_scale)[src];
    }
}

}  // namespace

void kv_store(const KvStoreArgs& a, cudaStream_t stream) {
    if (a.n == 0) return;
    OSPREY_CHECK(a.n_kv_heads > 0 && a.head_dim > 0 && a.head_dim % 8 == 0 && a.rows > 0, "kv_store: bad shape (",
                 a.n_kv_heads, " kv heads, head_dim ", a.head_dim, ", rows ", a.rows, ")");
    OSPREY_CHECK(a.ld_qkv % 8 == 0 && a.ld_qkv >= (a.n_q_heads + 2 * a.n_kv_heads) * a.head_dim,
                 "kv_store: qkv row stride ", a.ld_qkv);
    if (a.cache8.on()) {
        OSPREY_CHECK(a.head_dim % 16 == 0 && a.step8.on() && a.cache8.v && a.cache8.k_scale && a.cache8.v_scale &&
                         a.step8.v && a.step8.k_scale && a.step8.v_scale && a.dst,
                     "kv_store: FP8 store without the step's FP8 rows or a complete cache");
        cuda::launch(kv_store_fp8_kernel, a.n, kThreads, 0, stream, a);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    OSPREY_CHECK(a.qkv && a.k_cache && a.v_cache && a.dst, "kv_store: null pointer");
    cuda::launch(kv_store_kernel, a.n, kThreads, 0, stream, a);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::cuda
