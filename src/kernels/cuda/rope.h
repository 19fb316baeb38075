// Rotary position embedding, half-split style (spec §3.4), in place on the fused q/k/v activation:
// every q head and every k head of token t is rotated by its position positions[t]; v is untouched.
// Within a head, dimension d < head_dim/2 rotates with d + head_dim/2, using a cos/sin table with
// YaRN's frequencies and concentration already applied (model/ builds it). The rotation is done in
// FP32 from the BF16 inputs and rounded to BF16 once.
//
// Optionally (store != nullptr) the same kernel also appends the token's roped K and its V to one
// layer's KV cache, as kv_store() would (layout in kv_store.h): store[t] is token t's destination.
// Used for decode-only steps, where storing before attention is equivalent (a one-token slice
// overwrites only a ring row outside its window, and attention reads the step's own key from qkv)
// and saves one launch per layer.
//
// FP8 KV cache (step8 set, head_dim 64): after the rotation every K and V head of the token is
// quantised (amax / 448 multiplier, E4M3 codes, as the CPU reference: kv_fp8.h) into step8 (rows = 1,
// block = token), which the attention of this step reads; with a store the codes and multipliers go
// to cache8 instead of k_cache/v_cache. qkv itself keeps the unrounded BF16 values.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/bf16.h"
#include "kernels/cuda/kv_fp8.h"
#include "kernels/cuda/kv_store.h"

namespace osprey::cuda {

struct RopeArgs {
    bf16* qkv = nullptr;                 // [n_tokens, ld] bf16: q heads, then k heads, then v heads
    const int32_t* positions = nullptr;  // [n_tokens] device, each < n_positions (checked by the caller)
    const float* cos = nullptr;          // [n_positions, head_dim / 2] f32
    const float* sin = nullptr;          // [n_positions, head_dim / 2] f32
    int n_tokens = 0;
    int ld = 0;                          // row stride of qkv in elements (>= (n_q + n_kv) * head_dim)
    int n_q_heads = 0;
    int n_kv_heads = 0;
    int head_dim = 0;                    // even
    // Fused K/V store (see above); all null/0 for rope only.
    const KvStoreRow* store = nullptr;   // [n_tokens] device: store[t].token == t
    bf16* k_cache = nullptr;             // [n_blocks, n_kv_heads, rows, head_dim]
    bf16* v_cache = nullptr;
    int rows = 0;                        // rows per block of that layer's cache
    // FP8 KV cache (see above): the step's quantised rows [n_tokens, n_kv_heads, head_dim] and, with a
    // store, the layer's FP8 cache (then k_cache/v_cache stay null).
    KvFp8 step8 = {};
    KvFp8 cache8 = {};
};

void rope(const RopeArgs& a, cudaStream_t stream);

}  // namespace osprey::cuda
