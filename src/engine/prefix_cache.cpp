// Hash-chain index of full KV pages with LRU eviction (see prefix_cache.h).
#include "engine/prefix_cache.h"

#include <algorithm>

#include "core/check.h"

namespace osprey::engine {

namespace {
uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}
}  // namespace

PrefixCache::PrefixCache(int n_pages, int page_size)
    : page_size_(page_size), key_of_page_(size_t(n_pages)), evict_tick_(size_t(n_pages), 0) {
    OSPREY_CHECK(page_size > 0, "page_size must be positive, got ", page_size);
}

uint64_t PrefixCache::chain_hash(uint64_t parent, std::span<const int32_t> tokens) {
    uint64_t h = mix(parent ^ 0x9E3779B97F4A7C15ull);
    for (int32_t t : tokens) h = mix(h ^ (uint64_t(uint32_t(t)) + 0x2545F4914F6CDD1Dull));
    return h;
}

uint64_t PrefixCache::key_of(PageId page) const {
    OSPREY_CHECK(contains(page), "page ", page, " is not in the prefix cache");
    return key_of_page_[size_t(page)].key;
}

void PrefixCache::touch(PageId page) {
    if (evict_tick_[size_t(page)] == 0) return;
    evictable_.erase(evict_tick_[size_t(page)]);
    evict_tick_[size_t(page)] = ++tick_;
    evictable_.emplace(tick_, page);
}

std::vector<PageId> PrefixCache::match(std::span<const int32_t> tokens, int max_pages, std::vector<uint64_t>& keys) {
    std::vector<PageId> pages;
    keys.clear();
    uint64_t parent = kRootHash;
    for (int i = 0; i < max_pages && size_t(i + 1) * size_t(page_size_) <= tokens.size(); ++i) {
        const auto page_tokens = tokens.subspan(size_t(i) * size_t(page_size_), size_t(page_size_));
        const uint64_t key = chain_hash(parent, page_tokens);
        const auto it = by_hash_.find(key);
        if (it == by_hash_.end() || it->second.parent != parent ||
            !std::equal(page_tokens.begin(), page_tokens.end(), it->second.tokens.begin()))
            break;
        pages.push_back(it->second.page);
        keys.push_back(key);
        parent = key;
    }
    // Later pages of a chain become older in the LRU than earlier ones: a chain is evicted from
    // its tail, so what stays indexed is still reachable from the root.
    for (auto it = pages.rbegin(); it != pages.rend(); ++it) touch(*it);
    return pages;
}

int PrefixCache::count_match(std::span<const int32_t> tokens, int max_pages) const {
    uint64_t parent = kRootHash;
    int n = 0;
    for (; n < max_pages && size_t(n + 1) * size_t(page_size_) <= tokens.size(); ++n) {
        const auto page_tokens = tokens.subspan(size_t(n) * size_t(page_size_), size_t(page_size_));
        const uint64_t key = chain_hash(parent, page_tokens);
        const auto it = by_hash_.find(key);
        if (it == by_hash_.end() || it->second.parent != parent ||
            !std::equal(page_tokens.begin(), page_tokens.end(), it->second.tokens.begin()))
            break;
        parent = key;
    }
    return n;
}

bool PrefixCache::insert(uint64_t key, uint64_t parent, std::span<const int32_t> tokens, PageId page) {
    OSPREY_CHECK(int(tokens.size()) == page_size_, "prefix cache pages hold ", page_size_, " tokens, got ",
                 tokens.size());
    OSPREY_CHECK(!contains(page), "page ", page, " is already in the prefix cache");
    if (by_hash_.count(key)) return false;
    by_hash_.emplace(key, Entry{parent, std::vector<int32_t>(tokens.begin(), tokens.end()), page});
    key_of_page_[size_t(page)] = Key{true, key};
    return true;
}

void PrefixCache::set_evictable(PageId page, bool evictable) {
    OSPREY_CHECK(contains(page), "page ", page, " is not in the prefix cache");
    uint64_t& tick = evict_tick_[size_t(page)];
    if (evictable == (tick != 0)) return;
    if (evictable) {
        tick = ++tick_;
        evictable_.emplace(tick, page);
    } else {
        evictable_.erase(tick);
        tick = 0;
    }
}

PageId PrefixCache::evict_one() {
    if (evictable_.empty()) return -1;
    const PageId page = evictable_.begin()->second;
    evictable_.erase(evictable_.begin());
    evict_tick_[size_t(page)] = 0;
    by_hash_.erase(key_of_page_[size_t(page)].key);
    key_of_page_[size_t(page)] = Key{};
    return page;
}

void PrefixCache::check_invariants(const PageAllocator& allocator) const {
    OSPREY_CHECK(int(key_of_page_.size()) == allocator.n_pages(), "prefix cache and allocator disagree on n_pages");
    int n_indexed = 0;
    for (PageId p = 0; p < allocator.n_pages(); ++p) {
        const Key& k = key_of_page_[size_t(p)];
        if (!k.has_value) {
            OSPREY_CHECK(evict_tick_[size_t(p)] == 0, "page ", p, " is evictable but not cached");
            continue;
        }
        ++n_indexed;
        const auto it = by_hash_.find(k.key);
        OSPREY_CHECK(it != by_hash_.end() && it->second.page == p, "cached page ", p, " is not indexed by its key");
        OSPREY_CHECK(chain_hash(it->second.parent, it->second.tokens) == k.key, "cached page ", p,
                     " has a key that does not match its tokens");
        const int refs = allocator.ref_count(p);
        OSPREY_CHECK(refs >= 1, "cached page ", p, " has no reference");
        OSPREY_CHECK((refs == 1) == (evict_tick_[size_t(p)] != 0), "cached page ", p, " with ", refs,
                     " references has the wrong evictable state");
        if (evict_tick_[size_t(p)] != 0) {
            const auto e = evictable_.find(evict_tick_[size_t(p)]);
            OSPREY_CHECK(e != evictable_.end() && e->second == p, "evictable page ", p, " is missing from the LRU");
        }
    }
    OSPREY_CHECK(n_indexed == int(by_hash_.size()), "prefix cache index has ", by_hash_.size(), " keys for ", n_indexed,
                 " pages");
    int n_evict = 0;
    for (uint64_t t : evict_tick_) n_evict += t != 0;
    OSPREY_CHECK(n_evict == int(evictable_.size()), "LRU has ", evictable_.size(), " entries for ", n_evict,
                 " evictable pages");
}

}  // namespace osprey::engine
