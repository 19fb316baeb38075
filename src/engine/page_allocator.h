// Owns the ids of the fixed-size pages of the paged KV cache (full-attention layers). Pure
// bookkeeping: no device memory, so every invariant is unit-tested on the CPU
// (tests/engine/test_kv_cache.cpp).
#pragma once

#include <cstdint>
#include <vector>

namespace osprey::engine {

using PageId = int32_t;

class PageAllocator {
public:
    explicit PageAllocator(int n_pages);

    int n_pages() const { return int(ref_count_.size()); }
    int n_free() const { return int(free_.size()); }
    int ref_count(PageId page) const;

    PageId allocate();          // precondition: n_free() > 0 (else osprey::Error); one reference
    void retain(PageId page);   // one more holder shares `page` (a sequence or the prefix cache)
    void release(PageId page);  // drops one reference; the page is free again at zero

    // Every page is either free with zero references or in use with at least one, never both, and
    // appears at most once in the free list.
    void check_invariants() const;

private:
    void check_id(PageId page) const;

    std::vector<int32_t> ref_count_;  // [n_pages]
    std::vector<PageId> free_;        // stack of free ids; allocation order is deterministic
};

}  // namespace osprey::engine
