// Pages, prefix cache and window slots together (see kv_cache_manager.h).
#include "engine/kv_cache_manager.h"

#include "core/check.h"

namespace osprey::engine {

KvCacheManager::KvCacheManager(int n_pages, int page_size, int n_window_slots, bool prefix_caching,
                               int n_snapshot_slots)
    : page_size_(page_size),
      prefix_caching_(prefix_caching),
      allocator_(n_pages),
      prefix_(n_pages, page_size),
      slots_(n_window_slots),
      snapshots_(n_window_slots, prefix_caching ? n_snapshot_slots : 0),
      rings_(size_t(n_window_slots) + size_t(snapshots_.n_slots())) {}

RingSpan KvCacheManager::ring(int slot) const {
    OSPREY_CHECK(slot >= 0 && size_t(slot) < rings_.size(), "ring of window slot ", slot, " outside [0, ",
                 rings_.size(), ")");
    return rings_[size_t(slot)];
}

void KvCacheManager::start_ring(int slot, int32_t first) {
    (void)ring(slot);
    OSPREY_CHECK(first >= 0, "ring of window slot ", slot, " cannot start at ", first);
    rings_[size_t(slot)] = {first, first};
}

void KvCacheManager::advance_ring(int slot, int32_t from, int32_t to) {
    const RingSpan r = ring(slot);
    OSPREY_CHECK(r.end == from && to >= from, "ring of window slot ", slot, " holds [", r.first, ", ", r.end,
                 ") but a step wrote [", from, ", ", to, ")");
    rings_[size_t(slot)].end = to;
}

void KvCacheManager::copy_ring(int src, int dst) {
    const RingSpan r = ring(src);
    (void)ring(dst);
    rings_[size_t(dst)] = r;
}

PageId KvCacheManager::allocate_page() {
    if (allocator_.n_free() == 0) {
        const PageId victim = prefix_.evict_one();
        OSPREY_CHECK(victim >= 0, "KV cache out of pages: all ", n_pages(), " are in use");
        allocator_.release(victim);  // the cache's reference was the last one
    }
    return allocator_.allocate();
}

void KvCacheManager::share_page(PageId page) {
    OSPREY_CHECK(allocator_.ref_count(page) > 0, "share_page: page ", page, " is not held");
    allocator_.retain(page);
}

void KvCacheManager::release_pages(std::vector<PageId>& pages) {
    for (auto it = pages.rbegin(); it != pages.rend(); ++it) {
        allocator_.release(*it);
        if (prefix_.contains(*it) && allocator_.ref_count(*it) == 1) prefix_.set_evictable(*it, true);
    }
    pages.clear();
}

std::vector<PageId> KvCacheManager::match_prefix(std::span<const int32_t> tokens, int max_pages,
                                                 std::vector<uint64_t>& keys) {
    keys.clear();
    if (!prefix_caching_ || max_pages <= 0) return {};
    std::vector<PageId> pages = prefix_.match(tokens, max_pages, keys);
    for (PageId p : pages) {
        allocator_.retain(p);
        prefix_.set_evictable(p, false);
    }
    return pages;
}

int KvCacheManager::prefix_hit_tokens(std::span<const int32_t> tokens, int max_pages) const {
    if (!prefix_caching_ || max_pages <= 0) return 0;
    return prefix_.count_match(tokens, max_pages) * page_size_;
}

uint64_t KvCacheManager::offer_page(PageId page, uint64_t parent, std::span<const int32_t> tokens) {
    const uint64_t key = PrefixCache::chain_hash(parent, tokens);
    if (!prefix_caching_ || prefix_.contains(page)) return key;
    if (prefix_.insert(key, parent, tokens, page)) allocator_.retain(page);
    return key;
}

void KvCacheManager::check_invariants(std::span<const int> holders) const {
    allocator_.check_invariants();
    prefix_.check_invariants(allocator_);
    slots_.check_invariants();
    snapshots_.check_invariants();
    OSPREY_CHECK(int(holders.size()) == n_pages(), "holders has ", holders.size(), " entries for ", n_pages(),
                 " pages");
    for (PageId p = 0; p < n_pages(); ++p) {
        const int expected = holders[size_t(p)] + (prefix_.contains(p) ? 1 : 0);
        OSPREY_CHECK(allocator_.ref_count(p) == expected, "page ", p, " has ", allocator_.ref_count(p),
                     " references but ", holders[size_t(p)], " sequences",
                     (prefix_.contains(p) ? " and the cache" : ""), " hold it");
    }
}

}  // namespace osprey::engine
