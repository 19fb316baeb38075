// Where the decode and prefill attention kernels find the K and V rows of a key (attention.h).
#pragma once

#include <cuda_bf16.h>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_cache_row.cuh"

namespace osprey::cuda {

// The cache row (kv_cache_row.cuh) of key position j for KV head g of item `it`: the item's ring slot
// (ring layers), else the page holding j (page_table[page_offset + j / rows]); row j % rows of it.
__device__ __forceinline__ size_t attention_cache_row(const AttnArgs& a, const AttnItem& it, int g, int j) {
    const int block = a.ring ? it.window_slot : a.page_table[it.page_offset + j / a.rows];
    return kv_cache_head_row(block, a.n_kv_heads, g, a.rows) + j % a.rows;
}

// K and V rows (kAttnHeadDim bf16 each) of key position j for KV head g of item `it`: the step's own
// rows in qkv for positions the step computes (j >= the slice's start, not stored in the cache yet),
// else the cache row of the item's ring slot or of the page holding j.
__device__ inline void attention_kv_rows(const AttnArgs& a, const AttnItem& it, int g, int j,
                                         const __nv_bfloat16*& kp, const __nv_bfloat16*& vp) {
    constexpr int kD = kAttnHeadDim;
    if (j >= it.slice_start_pos) {
        const __nv_bfloat16* row =
            reinterpret_cast<const __nv_bfloat16*>(a.qkv) + size_t(it.slice_first_token + j - it.slice_start_pos) * a.ld_qkv;
        kp = row + a.n_q_heads * kD + g * kD;
        vp = row + (a.n_q_heads + a.n_kv_heads) * kD + g * kD;
    } else {
        const size_t off = attention_cache_row(a, it, g, j) * kD;
        kp = reinterpret_cast<const __nv_bfloat16*>(a.k_cache) + off;
        vp = reinterpret_cast<const __nv_bfloat16*>(a.v_cache) + off;
    }
}

// The FP8 cache (kv_fp8.h, a.cache8 set): codes (kAttnHeadDim bytes each) and multipliers of key j's K
// and V rows, from the step's quantised rows (a.step8, one block per token) for positions the step
// computes, else from the cache.
__device__ inline void attention_kv_rows_fp8(const AttnArgs& a, const AttnItem& it, int g, int j, const uint8_t*& kp,
                                             const uint8_t*& vp, const float*& ks, const float*& vs) {
    constexpr int kD = kAttnHeadDim;
    size_t idx;  // (block, head, row) of the row
    const KvFp8* src;
    if (j >= it.slice_start_pos) {
        idx = size_t(it.slice_first_token + j - it.slice_start_pos) * a.n_kv_heads + g;
        src = &a.step8;
    } else {
        idx = attention_cache_row(a, it, g, j);
        src = &a.cache8;
    }
    kp = src->k + idx * kD;
    vp = src->v + idx * kD;
    ks = src->k_scale + idx;
    vs = src->v_scale + idx;
}

}  // namespace osprey::cuda
