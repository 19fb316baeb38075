// Sink attention (spec §3.5) over the paged KV cache for a ragged batch: prefill chunks and single
// decode tokens of many sequences in one call, grouped-query (each K/V row is loaded once for the
// kGroup query heads that share it), with an optional sliding window (exact: a query at position p
// sees keys p - window + 1 .. p), FP32 scores, softmax and accumulation, BF16 in and out.
//
// Where keys come from. Keys at positions before the slice's start_pos are read from the cache;
// keys of the current step (positions >= start_pos) are read from the step's own roped qkv
// activation. So attention runs BEFORE the step's K/V are stored (kv_store.h), which lets a
// sliding-window ring of `window` rows serve a prefill chunk longer than the window.
//
// Cache layout of one layer (bf16), `rows` = page_size (paged) or window (ring):
//   paged: k, v [n_pages, n_kv_heads, page_size, head_dim]; position j of a sequence lives in page
//          page_table[page_offset + j / page_size], row j % page_size;
//   ring:  k, v [n_slots, n_kv_heads, window, head_dim]; position j lives in slot window_slot,
//          row j % window.
//
// Work decomposition (plan_attention): a decode token (slice of one token) is one item per KV
// head and KV split; long contexts are split over the KV length so that the grid fills the GPU,
// each split writes an unnormalised partial (running max, sum, accumulator) and a merge kernel
// combines the partials, adding the sink's exp(s - m) to the denominator exactly once. Decode items
// run on tensor cores with the group's 8 query heads as the rows of one mma fragment and a cp.async
// pipeline over key tiles (attention.cu); with merge counters the last split of a token merges them
// itself (counting the sink once) instead of a merge kernel. Prefill slices are cut into items of kPrefillTokens
// consecutive query tokens (no split), also on tensor cores (attention_prefill.h). Both round the
// softmax weights to bf16 before P·V (FP32 scores, sums and accumulators).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "core/bf16.h"
#include "kernels/cuda/kv_fp8.h"

namespace osprey::cuda {

inline constexpr int kAttnHeadDim = 64;     // the only head_dim compiled (gpt-oss)
inline constexpr int kAttnGroup = 8;        // query heads per KV head compiled (gpt-oss)
inline constexpr int kAttnKeyTile = 64;     // keys per shared-memory tile
inline constexpr int kPrefillTokens = 8;    // query tokens per prefill item
inline constexpr int kMinKeysPerSplit = 64; // smallest KV split of a decode token
inline constexpr int kWgmmaPrefillTokens = 16;  // query tokens per prefill item of wgmma variant 0

// Compile-time configurations ("variants") of the one wgmma prefill kernel (attention_prefill_wgmma.cu),
// chosen at run time so that an H200 run can A/B them: $OSPREY_ATTN_WGMMA_VARIANT=<n> (default
// kAttnWgmmaDefaultVariant), or per plan (plan_attention's wgmma_variant). docs/architecture.md says what
// each one is for.
struct AttnWgmmaVariant {
    int consumers;      // consumer warpgroups of 64 query rows (8 tokens x 8 heads): items of 8 x consumers tokens
    int block_n;        // keys per K/V tile (128 or 64)
    int stages;         // K/V tiles in the shared-memory ring (>= 3)
    bool persistent;    // one CTA per SM looping over (item, KV head) units, Q double-buffered
    int producer_regs;  // setmaxnreg for the producer / each consumer warpgroup (0: none)
    int consumer_regs;
    bool wait_pv;   // wait for the previous tile's P·V before the softmax (frees P's registers)
    bool poly_exp;  // a quarter of the softmax's exp2 on the FMA pipe (polynomial) instead of MUFU
};
inline constexpr AttnWgmmaVariant kAttnWgmmaVariants[] = {
    {2, 128, 3, false, 0, 0, false, false},    // 0: the kernel as first measured (default)
    {2, 128, 6, false, 0, 0, false, false},    // 1: deep ring: loads run 3 tiles ahead of the step needing them
    {2, 128, 6, true, 0, 0, false, false},     // 2: 1 + persistent CTAs (next unit's loads overlap this tail)
    {2, 128, 6, true, 24, 240, false, false},  // 3: 2 + setmaxnreg (producer 24, consumers 240 registers)
    {3, 128, 5, true, 24, 160, true, false},   // 4: 3 consumers: items of 24 tokens (192 rows per K/V tile)
    {2, 64, 12, true, 32, 232, false, false},  // 5: 3 with 64-key tiles (window layers), setmaxnreg 32/232
    {2, 128, 6, true, 24, 240, false, true},   // 6: 3 + a quarter of exp2 as a polynomial on the FMA pipe
};
inline constexpr int kAttnWgmmaVariantCount = int(sizeof(kAttnWgmmaVariants) / sizeof(kAttnWgmmaVariants[0]));
// Query tokens per prefill item of wgmma variant v.
constexpr int wgmma_prefill_tokens(int v) {
    return kAttnWgmmaVariants[v].consumers * kAttnGroup;
}
// The default: variant 4 (three consumer warpgroups, items of 24 tokens), the fastest on every full-layer
// and window shape but the 1k prompt without a prefix in its first H200 A/B (bench_attention, 2026-12-01):
// new 8192 1338 us (52.0% of 790 TFLOP/s) against 1606 on v0; new 32768 20.3 ms (54.9%) against 23.8;
// 24576 cached + 8192 new 15.0 ms against 19.8; window layers 8192 136 against 211 us; new 1024 57 against
// 52 us (v1: 50).
inline constexpr int kAttnWgmmaDefaultVariant = 4;
// $OSPREY_ATTN_WGMMA_VARIANT (read once per process), kAttnWgmmaDefaultVariant when unset; a value out
// of range is an error.
int attention_wgmma_variant_default();

// Which kernel runs the prefill items (the plan's item size depends on it):
//   mma_sync  attention_prefill.h: items of kPrefillTokens, mma.sync m16n8k16 (the default)
//   wgmma     attention_prefill_wgmma.h: items of kWgmmaPrefillTokens, Hopper wgmma + warp
//             specialisation (FlashAttention-3 style)
enum class AttnPrefillKernel : int32_t { mma_sync, wgmma };
// wgmma by default; $OSPREY_ATTN_WGMMA=0 selects mma_sync (read once per process).
AttnPrefillKernel attention_prefill_kernel_default();

// The FP8-KV decode kernel's MMA operands (attention.cu, attention_decode_fp8_kernel): f16 (the
// default: one cvt per pair of codes, exact S, P·V with P in FP16 against the tile's largest V
// multiplier) or bf16 (three more instructions per pair, P rounded as bf16(p · s_v)). For A/B runs:
// $OSPREY_ATTN_FP8_DECODE=f16|bf16 (read once per process; the default of AttnDevicePlan::fp8_decode).
enum class AttnFp8DecodeMma : int32_t { f16, bf16 };
AttnFp8DecodeMma attention_fp8_decode_mma();

struct AttnSlice {
    int32_t first_token = 0;  // first row of the slice in the step's activations
    int32_t n_tokens = 0;
    int32_t start_pos = 0;    // position of the first token; keys [0, start_pos) are in the cache
    int32_t window_slot = 0;  // ring slot (ring layers)
    int32_t page_offset = 0;  // index of the slice's first page id in page_table (paged layers)
    // First position present at all: keys before it are skipped (a ring refilled by a prefix-cache
    // replay holds nothing older than the replay's start). 0 for paged layers.
    int32_t first_key = 0;
};

struct AttnItem {
    int32_t q_token = 0;      // first query token (row in the step's activations)
    int32_t n_q = 0;          // query tokens in this item (1 for decode, <= kPrefillTokens)
    int32_t pos0 = 0;         // position of the first query token
    int32_t slice_first_token = 0;
    int32_t slice_start_pos = 0;
    int32_t window_slot = 0;
    int32_t page_offset = 0;
    int32_t key_begin = 0;    // keys [key_begin, key_end) of this item (a split of the full range)
    int32_t key_end = 0;
    int32_t partial = -1;     // -1: write the normalised output; else index of this split's partial
    int32_t merge = -1;       // split items: index of their token's AttnMerge (for the fused merge)
};

struct AttnMerge {
    int32_t token = 0;          // output row
    int32_t first_partial = 0;  // partials [first_partial, first_partial + n_partials)
    int32_t n_partials = 0;
};

struct AttnPlan {
    std::vector<AttnItem> decode;   // one-token items (some split)
    std::vector<AttnItem> prefill;  // multi-token items
    std::vector<AttnMerge> merges;  // decode tokens whose KV was split
    int n_partials = 0;
    AttnPrefillKernel prefill_kernel = AttnPrefillKernel::mma_sync;  // what the prefill items were cut for
    int wgmma_variant = 0;  // the wgmma kernel's variant they were cut for (kAttnWgmmaVariants)
};

// window: 0 for full causal attention, else the sliding window (keys p - window + 1 .. p).
// target_ctas: how many CTAs decode items should fill (e.g. 2 x SM count); splits are made only
// while the grid is smaller than that. fixed_splits: every decode token gets the same number of
// splits (some may be empty): the power of two at or above what the longest context needs, capped
// by the target, so that a decode step's grid sizes change only when a context crosses a power of
// two and the step can be replayed from a CUDA graph keyed by those sizes. prefill: the kernel the
// prefill items are cut for (AttnDevicePlan::prefill_kernel must say the same); wgmma_variant: which
// configuration of the wgmma kernel (its item size; AttnDevicePlan::wgmma_variant must say the same).
// The fewest keys a decode split takes: OSPREY_ATTN_MIN_KEYS (a positive multiple of kAttnKeyTile) if set,
// else kMinKeysPerSplit. Fewer, longer splits mean fewer partials to merge and fewer CTAs (A/B knob).
int attention_min_keys_per_split();

AttnPlan plan_attention(std::span<const AttnSlice> slices, int window, int n_kv_heads, int target_ctas,
                        bool fixed_splits = false, AttnPrefillKernel prefill = attention_prefill_kernel_default(),
                        int wgmma_variant = attention_wgmma_variant_default(),
                        int min_keys_per_split = attention_min_keys_per_split());

// The plan's arrays in device memory (uploaded by the caller).
struct AttnDevicePlan {
    const AttnItem* decode = nullptr;    // [n_decode]
    int n_decode = 0;
    const AttnItem* prefill = nullptr;   // [n_prefill]
    int n_prefill = 0;
    const AttnMerge* merges = nullptr;   // [n_merges]
    int n_merges = 0;
    AttnPrefillKernel prefill_kernel = AttnPrefillKernel::mma_sync;  // AttnPlan::prefill_kernel
    int wgmma_variant = 0;                                           // AttnPlan::wgmma_variant
    AttnFp8DecodeMma fp8_decode = attention_fp8_decode_mma();        // FP8 KV decode kernel's MMA type
};

struct AttnArgs {
    bf16* out = nullptr;               // [n_tokens, ld_out] bf16; head h at columns [64h, 64h + 64)
    int ld_out = 0;
    const bf16* qkv = nullptr;         // [n_tokens, ld_qkv] bf16 roped q heads, k heads, v heads
    int ld_qkv = 0;
    const bf16* k_cache = nullptr;     // layout above
    const bf16* v_cache = nullptr;
    int rows = 0;                      // page_size (paged) or window (ring)
    bool ring = false;
    int window = 0;                    // 0 full causal, else sliding window size
    const int32_t* page_table = nullptr;  // [*] device page ids (paged)
    const bf16* sinks = nullptr;       // [n_q_heads] bf16, one logit per query head
    int n_q_heads = 0;
    int n_kv_heads = 0;
    int head_dim = 0;
    float* partial_acc = nullptr;      // [n_partials, n_kv_heads, kGroup, head_dim] f32 scratch
    float2* partial_ml = nullptr;      // [n_partials, n_kv_heads, kGroup] (max, sum) scratch
    // [n_merges, n_kv_heads] arrival counters, zeroed once by the owner and left at zero by every call.
    // Non-null: the last split CTA of a (token, KV head) to finish merges its partials itself (no
    // merge kernel: one launch fewer per layer); null: attention_merge_kernel does it.
    int32_t* merge_counters = nullptr;
    // FP8 KV cache (kv_fp8.h; --kv-cache-dtype fp8): with cache8 set, k_cache/v_cache are unused; keys
    // before the slice's start come from cache8 and the step's own from step8 (its rows quantised by
    // rope(), one block of one row per token) instead of from qkv. Decode reads the codes directly
    // (16-byte loads, the multipliers applied to the scores and to P); prefill dequantises K/V tiles to
    // BF16 while staging them into shared memory.
    KvFp8 cache8 = {};
    KvFp8 step8 = {};
    // RoPE fused into decode (BF16 cache, every item one decode token; rope() is then not run): qkv
    // holds this step's q and k UNROTATED. Each CTA rotates its group's query heads as it loads them and
    // the token's own key as it stages it (rope_pair.cuh: the bits rope() gives), and the CTA whose keys
    // include the token's own position appends that roped K row and the V row to the cache (k_store /
    // v_store: the layer's k_cache / v_cache, or null for no store), as rope()'s store would: one launch
    // fewer per layer in decode steps. Null rope_cos: qkv is already roped.
    const float* rope_cos = nullptr;   // [n_positions, head_dim / 2] f32, rope.h's tables
    const float* rope_sin = nullptr;
    bf16* k_store = nullptr;
    bf16* v_store = nullptr;
};

// Raises the kernels' shared-memory limits; called by attention() itself, and by owners of CUDA
// graphs before their first capture (it is not a stream operation).
void attention_configure();

// Runs the plan: decode items, prefill items, then the merge of split decode tokens.
void attention(const AttnArgs& a, const AttnDevicePlan& plan, cudaStream_t stream);

}  // namespace osprey::cuda
