// Index of full KV pages by the tokens they hold, for sharing between requests with a common
// prefix. A page is keyed by a hash chain: hash(parent page's key, this page's tokens), so a key
// names the whole prefix up to the page's end. Keys are verified against stored tokens (a hash
// collision cannot share wrong KV). The cache holds one reference on each indexed page; pages only
// it references are "evictable" and leave in least-recently-used order. Bookkeeping only.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/page_allocator.h"

namespace osprey::engine {

class PrefixCache {
public:
    PrefixCache(int n_pages, int page_size);

    static constexpr uint64_t kRootHash = 0x6f737072657921ull;  // parent key of a sequence's first page
    static uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens);

    int page_size() const { return page_size_; }
    int n_cached() const { return int(by_hash_.size()); }
    int n_evictable() const { return int(evictable_.size()); }
    bool contains(PageId page) const { return key_of_page_[size_t(page)].has_value; }
    uint64_t key_of(PageId page) const;

    // The longest run of indexed pages holding tokens[0, n * page_size), n <= max_pages, with their
    // keys. Marks them used (LRU). Does not take references.
    std::vector<PageId> match(std::span<const int32_t> tokens, int max_pages, std::vector<uint64_t>& keys);
    // How many pages match() would return, touching nothing (routing a request between caches).
    int count_match(std::span<const int32_t> tokens, int max_pages) const;

    // Indexes `page` as the page after `parent` holding `tokens` (page_size of them), under key
    // `key` (= chain_hash(parent, tokens)). False when the key is already indexed (the same prefix
    // computed by another sequence, or a collision): then nothing changes and the caller keeps
    // its page private. On true the caller must give the cache one reference.
    bool insert(uint64_t key, uint64_t parent, std::span<const int32_t> tokens, PageId page);

    // LRU bookkeeping, driven by the owner of the reference counts: a page becomes evictable when
    // only the cache references it, and stops being evictable when a sequence takes it again.
    void set_evictable(PageId page, bool evictable);
    bool is_evictable(PageId page) const { return evict_tick_[size_t(page)] != 0; }

    // Unindexes the least recently used evictable page and returns it (-1 if none); the caller
    // then drops the cache's reference.
    PageId evict_one();

    // Index and LRU agree with each other and with the allocator's reference counts.
    void check_invariants(const PageAllocator& allocator) const;

private:
    struct Entry {
        uint64_t parent = 0;
        std::vector<int32_t> tokens;  // [page_size]
        PageId page = -1;
    };
    struct Key {
        bool has_value = false;
        uint64_t key = 0;
    };
    void touch(PageId page);

    int page_size_;
    std::unordered_map<uint64_t, Entry> by_hash_;
    std::vector<Key> key_of_page_;          // [n_pages]
    std::map<uint64_t, PageId> evictable_;  // tick -> page, oldest first
    std::vector<uint64_t> evict_tick_;      // [n_pages] 0 when not evictable
    uint64_t tick_ = 0;
};

}  // namespace osprey::engine
