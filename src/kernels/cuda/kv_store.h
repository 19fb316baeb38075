// Stores the step's roped K and V rows (from the fused qkv activation) into one layer's KV cache,
// after that layer's attention ran (attention.h explains why). Cache layout as in attention.h:
// k, v [n_blocks, n_kv_heads, rows, head_dim] bf16 where a block is a page (rows = page_size) or a
// sliding-window ring slot (rows = window).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "core/bf16.h"
#include "kernels/cuda/kv_fp8.h"

namespace osprey::cuda {

struct KvStoreRow {
    int32_t token = 0;  // row of the step's qkv activation
    int32_t block = 0;  // page id or ring slot
    int32_t row = 0;    // row inside the block
};

struct KvStoreSlice {
    int32_t first_token = 0;
    int32_t n_tokens = 0;
    int32_t start_pos = 0;
    int32_t n_skip = 0;           // leading tokens already cached (paged layers only; rings ignore it)
    int32_t window_slot = 0;      // ring slot
    std::span<const int32_t> pages;  // page ids in position order (paged layers)
};

// Destinations for every token that must be written. A ring keeps only the last `rows` positions
// of the slice (earlier ones would be overwritten in the same step, a write race); a paged layer
// writes every token after the first n_skip. Throws when a position has no page.
std::vector<KvStoreRow> plan_kv_store(std::span<const KvStoreSlice> slices, bool ring, int rows);

struct KvStoreArgs {
    const bf16* qkv = nullptr;  // [n_tokens, ld_qkv] bf16: q heads, k heads, v heads
    int ld_qkv = 0;
    int n_q_heads = 0;
    int n_kv_heads = 0;
    int head_dim = 0;           // n_kv_heads * head_dim must be a multiple of 8
    bf16* k_cache = nullptr;    // [n_blocks, n_kv_heads, rows, head_dim]
    bf16* v_cache = nullptr;
    int rows = 0;
    const KvStoreRow* dst = nullptr;  // [n] device
    int n = 0;
    // FP8 KV cache (kv_fp8.h): with cache8 set, the rows are copied from the step's quantised rows
    // step8 (written by rope(), block = token) into cache8, and qkv/k_cache/v_cache are unused.
    KvFp8 step8 = {};
    KvFp8 cache8 = {};
};

void kv_store(const KvStoreArgs& a, cudaStream_t stream);

}  // namespace osprey::cuda
