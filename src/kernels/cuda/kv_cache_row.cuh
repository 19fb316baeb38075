// The row index of the K/V caches, for every kernel that reads or writes them (attention.h, rope.h,
// kv_store.h): k, v [n_blocks, n_kv_heads, rows, head_dim] where a block is a page (rows = page_size)
// or a sliding-window ring slot (rows = window). The FP8 cache (kv_fp8.h) indexes its code rows (times
// head_dim) and its multipliers (one a row) by the same number.
// Plain C++ apart from the qualifiers, so that the CPU emulation harnesses (scripts/emulate_attention_*.sh)
// include it as it is.
#pragma once

#include <cstddef>

namespace osprey::cuda {

// Row 0 of KV head g in cache block `block` (rows per block); row r of the block is this + r. The
// attention kernels (attention_kv.cuh) add their row j % rows to it themselves: as an argument of
// kv_cache_row the remainder would be computed ahead of the product and the kernels' code reordered.
__device__ __forceinline__ size_t kv_cache_head_row(int block, int n_kv_heads, int g, int rows) {
    return (size_t(block) * n_kv_heads + g) * rows;
}

// Row `row` of KV head g in cache block `block`, counted in rows (times head_dim: in elements). The
// K/V stores (rope.cu, kv_store.cu) take block and row from a KvStoreRow (kv_store.h).
__device__ __forceinline__ size_t kv_cache_row(int block, int n_kv_heads, int g, int rows, int row) {
    return kv_cache_head_row(block, n_kv_heads, g, rows) + row;
}

}  // namespace osprey::cuda
