// The FP8 KV cache on the GPU (--kv-cache-dtype fp8, docs/fp8.md "FP8 KV cache"): where a layer's E4M3
// codes and their multipliers live. The same rows as model/kv_spec.h counts (kv_dim codes and one F32
// multiplier per KV head for K, the same for V), held as two arrays per tensor so that the codes stay
// 16-byte aligned whatever the page size or ring length:
//   codes  [n_blocks, n_kv_heads, rows, head_dim] e4m3 (one byte each)
//   scales [n_blocks, n_kv_heads, rows] f32, amax / 448 of that head's head_dim values (1 when all zero)
// A block is a page (rows = page_size) or a ring slot (rows = sliding window + slack), as for BF16
// (attention.h). The step's own K/V rows are quantised once (by the RoPE kernel, rope.h) into the same
// layout with rows = 1 and one "block" per token, and every attention kernel reads them from there
// instead of from the qkv activation: a prefill chunk sees exactly the keys that later steps read back.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define OSPREY_KV_FP8_HD __host__ __device__
#else
#define OSPREY_KV_FP8_HD
#endif

namespace osprey::cuda {

struct KvFp8 {
    uint8_t* k = nullptr;        // codes, layout above
    uint8_t* v = nullptr;
    float* k_scale = nullptr;    // multipliers, layout above
    float* v_scale = nullptr;
    OSPREY_KV_FP8_HD bool on() const { return k != nullptr; }
};

}  // namespace osprey::cuda
