// Causal attention with a per-head sink logit and an optional sliding window (spec §3.5), for the
// queries of one sequence, reading keys/values from a paged cache plus the step's fresh rows.
//
//   z_j  = (q · k_j) * scale                    for allowed keys j (p_j <= p_i, and p_i - p_j < window)
//   m    = max(sink_h, max_j z_j)
//   den  = exp(sink_h - m) + Σ_j exp(z_j - m)     the sink joins the denominator only (no value vector)
//   out  = Σ_j exp(z_j - m) / den · v_j
// Query head h reads kv head h / (n_heads / n_kv_heads).
#pragma once

#include <cstdint>
#include <span>

#include "core/thread_pool.h"

namespace osprey::cpu {

// Where the keys and values of one sequence live, position by position:
//   positions [0, n_cached) are in a layer's cache of fixed-size blocks, either pages listed in
//   position order (position p: block blocks[p / block_rows], row p % block_rows) or one ring
//   (ring = true: block blocks[0], row p % block_rows; only the last block_rows positions survive);
//   positions [n_cached, n_cached + n_fresh) are this step's rows, not yet in the cache;
//   positions [0, first_cached) are absent (a window ring refilled by a prefix-cache replay holds
//   nothing older than the replay's start): queries attend only to keys that exist.
//   The cache is FP32 (cache_k/cache_v) or FP8 E4M3 (cache_k8/cache_v8 with one F32 dequantisation
//   multiplier per row and KV head, core/fp8.h): key = e4m3(code) * scale[row, head].
struct KvSource {
    const float* cache_k = nullptr;    // [n_blocks_total, block_rows, n_kv_heads * head_dim]
    const float* cache_v = nullptr;    // same layout
    const uint8_t* cache_k8 = nullptr;  // FP8 instead: [n_blocks_total, block_rows, n_kv_heads * head_dim]
    const uint8_t* cache_v8 = nullptr;
    const float* cache_k_scale = nullptr;  // [n_blocks_total, block_rows, n_kv_heads]
    const float* cache_v_scale = nullptr;
    std::span<const int32_t> blocks = {};   // the sequence's page table, or its one window slot
    int block_rows = 0;
    bool ring = false;
    int n_cached = 0;
    int first_cached = 0;              // first position present in the cache (<= n_cached)
    const float* fresh_k = nullptr;    // [n_fresh, fresh_stride], kv head g at offset g * head_dim
    const float* fresh_v = nullptr;    // same layout
    int64_t fresh_stride = 0;
    int n_fresh = 0;
};

struct AttentionArgs {
    std::span<float> out = {};                // [n_queries, n_heads, head_dim]
    std::span<const float> q = {};            // [n_queries, n_heads, head_dim], after RoPE
    std::span<const int32_t> positions = {};  // [n_queries], absolute positions of the queries
    std::span<const float> sinks = {};        // [n_heads], one logit per query head, not scaled
    KvSource kv;
    int n_heads = 0;
    int n_kv_heads = 0;
    int head_dim = 0;
    int window = 0;       // 0: full causal; else a query sees the `window` keys ending at itself
    float scale = 0.0f;   // applied to q·k (1/sqrt(head_dim))
};

// Parallel over (query, head). Checks that every key a query needs is available.
void attention_sinks(const AttentionArgs& a, ThreadPool& pool = ThreadPool::global());

}  // namespace osprey::cpu
