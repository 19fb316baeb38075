// The engine's view of the KV cache, its only bookkeeper: page ids (reference-counted), the
// prefix-cache index over them, the sliding-window slots and which positions each slot's ring
// holds. All references go through here so that the prefix cache's LRU always knows which pages
// only it holds. Bookkeeping only; the storage is the backend's (model/kv_spec.h, ModelRunner).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/page_allocator.h"
#include "engine/prefix_cache.h"
#include "engine/window_slots.h"
#include "engine/window_snapshots.h"

namespace osprey::engine {

// Positions whose K/V a ring holds: [first, end), the last sliding_window of them in its rows.
// A sequence's forward slices say `first` (SequenceSlice::window_first) and start at `end`.
struct RingSpan {
    int32_t first = 0, end = 0;
};

class KvCacheManager {
public:
    // Window slots [0, n_window_slots) are for running sequences, the next n_snapshot_slots hold
    // window snapshots for prefix-cache hits (window_snapshots.h; none without prefix caching).
    KvCacheManager(int n_pages, int page_size, int n_window_slots, bool prefix_caching, int n_snapshot_slots = 0);

    int page_size() const { return page_size_; }
    int n_pages() const { return allocator_.n_pages(); }
    bool prefix_caching() const { return prefix_caching_; }
    // Pages that allocate_page() can hand out now: free ones plus evictable cached ones.
    int n_available_pages() const { return allocator_.n_free() + prefix_.n_evictable(); }
    int n_free_pages() const { return allocator_.n_free(); }
    int n_cached_pages() const { return prefix_.n_cached(); }
    int n_free_slots() const { return slots_.n_free(); }
    int ref_count(PageId page) const { return allocator_.ref_count(page); }
    bool is_cached(PageId page) const { return prefix_.contains(page); }
    uint64_t cache_key(PageId page) const { return prefix_.key_of(page); }

    // A fresh private page (one reference), evicting the least recently used cached page when no
    // page is free. Throws osprey::Error when none is available (callers check first).
    PageId allocate_page();
    // One more reference to a page another sequence holds (a forked sample shares its leader's full
    // prompt pages).
    void share_page(PageId page);
    // Drops a sequence's references, last page first (so the LRU evicts chains from their tail).
    void release_pages(std::vector<PageId>& pages);

    // Cached pages holding tokens[0, n * page_size) for the largest n <= max_pages, each with one
    // new reference for the caller; `keys` gets their chain keys. Empty when caching is off.
    std::vector<PageId> match_prefix(std::span<const int32_t> tokens, int max_pages, std::vector<uint64_t>& keys);
    // Tokens match_prefix() would hit now (whole pages, at most max_pages), without taking or
    // touching anything: what routing between data-parallel groups compares. 0 when caching is off.
    int prefix_hit_tokens(std::span<const int32_t> tokens, int max_pages) const;
    // Offers a full, written page to the prefix cache (the caller keeps its own reference).
    // Returns the page's key; nothing is cached when caching is off or the key is already taken.
    uint64_t offer_page(PageId page, uint64_t parent, std::span<const int32_t> tokens);

    WindowSnapshots& snapshots() { return snapshots_; }
    const WindowSnapshots& snapshots() const { return snapshots_; }

    int allocate_slot() { return slots_.allocate(); }
    void release_slot(int slot) { slots_.release(slot); }
    bool slot_in_use(int slot) const { return slots_.in_use(slot); }

    // Ring contents of any slot (running sequences' and snapshots'). A ring starts empty at the
    // position its first chunk starts at, grows with each step, and a copy gives the destination
    // the source's span (copy_kv copies the rows alike).
    RingSpan ring(int slot) const;
    void start_ring(int slot, int32_t first);
    void advance_ring(int slot, int32_t from, int32_t to);  // a step wrote [from, to); from must be the end
    void copy_ring(int src, int dst);

    // Internal consistency, and that each page's references equal `holders[page]` (how many
    // sequences list it) plus one if it is cached. holders: [n_pages].
    void check_invariants(std::span<const int> holders) const;

private:
    int page_size_;
    bool prefix_caching_;
    PageAllocator allocator_;
    PrefixCache prefix_;
    WindowSlots slots_;
    WindowSnapshots snapshots_;
    std::vector<RingSpan> rings_;  // [running slots + snapshot slots]
};

}  // namespace osprey::engine
