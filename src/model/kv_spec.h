// The KV cache's layout as data, computed once from the model config, the element type and the
// page size. It is the only code that knows which layers slide (is_sliding_layer) and how many
// bytes a page or a window slot takes; the engine sizes and addresses the cache with it and the
// backends allocate their storage from it.
//
// Two groups of layers, each an ordinary cache of fixed-size blocks (as vLLM's FullAttentionSpec /
// SlidingWindowSpec or llama.cpp's iswa cache, two caches chosen by one predicate):
//   - paged: the full-attention layers (odd). A block is a page of `page_size` positions; a
//     sequence's page table lists its pages in position order (position p lives in
//     pages[p / page_size], row p % page_size). Pages are shared between sequences by prefix reuse.
//   - ring: the sliding-window layers (even), which only ever read the last `sliding_window` (128)
//     positions. A block is one sequence's ring of `sliding_window` rows (plus `ring_slack` spare
//     rows, below), position p at row p % ring_rows, so a sequence holds one ring whatever its length.
//     Speculative decoding writes 1 + k positions in a verify step and may take back all but the
//     first: with k - 1 spare rows or more, those writes never overwrite a row the rolled-back
//     sequence still needs (engine/speculative.h), so a rollback is bookkeeping only.
// A row is one position of one layer: its K and V for every KV head.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace osprey::model {

// gpt-oss's rule (shared/spec/gpt-oss-model.md §2.1): even layers attend over a sliding window,
// odd layers over the whole context. Config parsing checks `layer_types` against it.
bool is_sliding_layer(int layer);

// The element type of cached K and V. fp8_e4m3 (--kv-cache-dtype fp8, docs/fp8.md): each row holds
// its K (or V) as E4M3 codes plus one F32 dequantisation multiplier per KV head (amax / 448 of that
// head's head_dim values at that position), so a row never changes after it is written.
enum class KvDtype : uint8_t { f32, bf16, fp8_e4m3 };
size_t kv_dtype_bytes(KvDtype dtype);  // bytes of one element (the fp8 scales are counted per row)
std::string_view kv_dtype_name(KvDtype dtype);
// "fp8" (also "fp8_e4m3"), "bf16", "f32"/"float32", or "auto" (nullopt: the backend's own). Throws naming `flag`.
std::optional<KvDtype> parse_kv_dtype(std::string_view name, std::string_view flag = "--kv-cache-dtype");

// Tokens per page: the one place the bounds live (CLI flags, the engine and the benchmarks check here).
inline constexpr int kMinPageSize = 1;
inline constexpr int kMaxPageSize = 1024;
// Throws osprey::Error naming `what` (a flag or option name) when page_size is outside the bounds.
void check_page_size(int page_size, std::string_view what = "page_size");

enum class KvGroupKind : uint8_t { paged = 0, ring = 1 };
inline constexpr int kKvGroups = 2;

struct KvGroup {
    KvGroupKind kind = KvGroupKind::paged;
    std::vector<int> layers;   // model layers whose K/V live in this group, ascending
    int rows_per_block = 0;    // page_size (paged) or sliding_window + ring slack (ring)
    size_t bytes_per_row = 0;  // one position of one layer: K and V of every KV head
    size_t bytes_per_block() const { return size_t(rows_per_block) * bytes_per_row * layers.size(); }
};

class KvSpec {
public:
    KvSpec() = default;  // no groups: nothing allocated yet
    // tp > 1: the spec of one tensor-parallel rank, which holds n_kv_heads / tp whole KV heads
    // (model/parallel_layout.h); pages and slots keep the same ids on every rank, only rows narrow.
    KvSpec(const Config& config, KvDtype dtype, int page_size, int tp = 1);

    // This spec with `extra` spare rows per ring (sliding_window + extra rows per block): room for
    // speculative positions that a verify step writes and a rollback takes back. extra >= 0.
    KvSpec with_ring_slack(int extra) const;
    int ring_slack() const { return ring().rows_per_block - sliding_window_; }

    KvDtype dtype() const { return dtype_; }
    int page_size() const { return page_size_; }
    int sliding_window() const { return sliding_window_; }
    int n_layers() const { return int(kind_of_.size()); }
    int kv_dim() const { return kv_dim_; }
    int n_kv_heads() const { return n_kv_heads_; }  // this rank's KV heads (kv_dim / head_dim)
    // Bytes of one position of one layer's K (or V): kv_dim elements, and with fp8 one F32 scale per
    // KV head.
    size_t tensor_row_bytes() const {
        return size_t(kv_dim_) * kv_dtype_bytes(dtype_) + (dtype_ == KvDtype::fp8_e4m3 ? size_t(n_kv_heads_) * 4 : 0);
    }

    const KvGroup& group(KvGroupKind kind) const { return groups_[size_t(kind)]; }
    const KvGroup& paged() const { return group(KvGroupKind::paged); }
    const KvGroup& ring() const { return group(KvGroupKind::ring); }
    KvGroupKind kind_of(int layer) const;
    bool is_ring(int layer) const { return kind_of(layer) == KvGroupKind::ring; }

    size_t bytes_per_page() const { return paged().bytes_per_block(); }
    size_t bytes_per_window_slot() const { return ring().bytes_per_block(); }
    // Tokens a prefix-cache hit replays to rebuild a ring exactly: a ring layer's K/V at position p
    // depends on the windowed attention of every earlier ring layer over [p - window + 1, p], so
    // the error of a truncated start dies out after ring layers × (window - 1) positions.
    int window_replay() const { return int(ring().layers.size()) * (sliding_window_ - 1); }

private:
    KvDtype dtype_ = KvDtype::f32;
    int page_size_ = 0;
    int sliding_window_ = 0;
    int kv_dim_ = 0;
    int n_kv_heads_ = 0;
    KvGroup groups_[kKvGroups];
    std::vector<KvGroupKind> kind_of_;  // [n_layers]
};

// A spec with how many blocks of each group exist: what a backend allocates.
struct KvLayout {
    KvSpec spec;
    int n_pages = 0;         // pages shared by all sequences
    int n_window_slots = 0;  // rings: one per running sequence, plus saved ones

    int page_size() const { return spec.page_size(); }
    int n_blocks(KvGroupKind kind) const { return kind == KvGroupKind::paged ? n_pages : n_window_slots; }
    // Rows of one layer of the group: n_blocks × rows_per_block.
    int64_t rows(KvGroupKind kind) const { return int64_t(n_blocks(kind)) * spec.group(kind).rows_per_block; }
    size_t bytes() const {
        return size_t(n_pages) * spec.bytes_per_page() + size_t(n_window_slots) * spec.bytes_per_window_slot();
    }
    // Throws osprey::Error naming `who` when the counts are negative or no spec is set.
    void check(std::string_view who) const;
};

// A copy of cached K/V that the engine decides: whole pages src_pages[i] -> dst_pages[i], and
// optionally one ring slot. Afterwards a sequence using dst_pages and dst_slot continues exactly as
// the source would (a forked sample, a saved or restored ring, a benchmark's distinct copies).
struct KvCopy {
    std::vector<int32_t> src_pages, dst_pages;  // same length; no page on both sides
    int src_slot = -1, dst_slot = -1;           // both -1: no ring copied
    int dp_group = 0;                           // the data-parallel group whose cache holds both sides
};

// The copy as runs of contiguous rows of one group, valid for every layer of that group (rows are
// layer-local: block × rows_per_block + row). Runs cover whole blocks, so they hold for any order
// of heads and rows inside a block. What ModelRunner::copy_kv executes.
struct KvRowRun {
    KvGroupKind group = KvGroupKind::paged;
    int64_t src = 0, dst = 0, n = 0;  // first source row, first destination row, rows
};
struct KvCopyPlan {
    std::vector<KvRowRun> runs;
    int dp_group = 0;  // runs inside this data-parallel group's cache (KvCopy::dp_group)
};

// Checks `copy` against the layout (equal lengths, pages and slots in range, no page or slot on both
// sides, no destination twice) and returns its runs, consecutive pages merged. Throws osprey::Error
// naming the fault.
KvCopyPlan plan_kv_copy(const KvCopy& copy, const KvLayout& layout);
// Checks that every run of a plan lies inside the layout's blocks (what a backend calls before it
// moves memory). Throws osprey::Error naming the run.
// dp_groups: the backend's data-parallel groups (plan.dp_group must be one of them).
void check_kv_copy_plan(const KvCopyPlan& plan, const KvLayout& layout, int dp_groups = 1);

}  // namespace osprey::model
