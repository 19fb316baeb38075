// Page allocator, window slots, prefix cache and their manager: reference counts, LRU eviction,
// hash-chain matching, ring spans, invariants.
#include <gtest/gtest.h>

#include <numeric>

#include "core/check.h"
#include "engine/kv_cache_manager.h"

using namespace osprey;
using namespace osprey::engine;

TEST(page_allocator, shared_page_is_freed_by_last_release) {
    PageAllocator a(2);
    const PageId p = a.allocate();
    a.retain(p);
    a.release(p);
    EXPECT_EQ(a.n_free(), 1) << "still referenced once";
    a.release(p);
    EXPECT_EQ(a.n_free(), 2);
    a.check_invariants();
}

TEST(page_allocator, exhaustion_and_misuse_are_errors_not_crashes) {
    PageAllocator a(1);
    const PageId p = a.allocate();
    EXPECT_EQ(p, 0);
    EXPECT_THROW(a.allocate(), Error);
    a.release(p);
    EXPECT_THROW(a.release(p), Error);
    EXPECT_THROW(a.retain(p), Error);
    EXPECT_THROW(a.retain(7), Error);
    EXPECT_THROW(PageAllocator(0), Error);
    a.check_invariants();
}

TEST(window_slots, allocate_release) {
    WindowSlots s(2);
    const int a = s.allocate(), b = s.allocate();
    EXPECT_NE(a, b);
    EXPECT_THROW(s.allocate(), Error);
    s.release(a);
    EXPECT_THROW(s.release(a), Error);
    EXPECT_EQ(s.allocate(), a);
    s.check_invariants();
}

TEST(kv_cache_manager, rings_record_which_positions_they_hold) {
    // 3 running slots and 2 snapshot slots: every one has a span, snapshots included.
    KvCacheManager kv(/*n_pages=*/8, /*page_size=*/4, /*n_window_slots=*/3, /*prefix_caching=*/true,
                      /*n_snapshot_slots=*/2);
    const int a = kv.allocate_slot();
    kv.start_ring(a, 0);
    kv.advance_ring(a, 0, 40);
    kv.advance_ring(a, 40, 41);
    EXPECT_EQ(kv.ring(a).first, 0);
    EXPECT_EQ(kv.ring(a).end, 41);
    // A replay after a prefix hit starts an empty ring at its first position.
    const int b = kv.allocate_slot();
    kv.start_ring(b, 17);
    EXPECT_EQ(kv.ring(b).first, 17);
    EXPECT_EQ(kv.ring(b).end, 17);
    // A step must continue where the ring ends.
    EXPECT_THROW(kv.advance_ring(b, 16, 20), Error);
    EXPECT_THROW(kv.advance_ring(b, 18, 20), Error);
    kv.advance_ring(b, 17, 32);
    // Copies carry the span: a saved ring (slot 3 is the first snapshot slot) and a restore from it.
    kv.copy_ring(b, 3);
    EXPECT_EQ(kv.ring(3).first, 17);
    EXPECT_EQ(kv.ring(3).end, 32);
    const int c = kv.allocate_slot();
    kv.copy_ring(3, c);
    EXPECT_EQ(kv.ring(c).first, 17);
    EXPECT_EQ(kv.ring(c).end, 32);
    EXPECT_THROW(kv.ring(5), Error);
    EXPECT_THROW(kv.start_ring(-1, 0), Error);
    EXPECT_THROW(kv.start_ring(a, -3), Error);
}

TEST(prefix_cache, match_follows_the_chain_and_verifies_tokens) {
    const int ps = 4;
    KvCacheManager kv(8, ps, 2, true);
    std::vector<int32_t> t(12);
    std::iota(t.begin(), t.end(), 100);
    std::vector<PageId> pages;
    std::vector<uint64_t> keys;
    uint64_t parent = PrefixCache::kRootHash;
    for (int i = 0; i < 3; ++i) {
        pages.push_back(kv.allocate_page());
        parent = kv.offer_page(pages.back(), parent, std::span(t).subspan(size_t(i * ps), ps));
        keys.push_back(parent);
    }
    EXPECT_EQ(kv.n_cached_pages(), 3);
    for (PageId p : pages) EXPECT_EQ(kv.ref_count(p), 2) << "sequence + cache";

    std::vector<uint64_t> got_keys;
    auto hit = kv.match_prefix(t, 3, got_keys);
    EXPECT_EQ(hit, pages);
    EXPECT_EQ(got_keys, keys);
    kv.release_pages(hit);

    // A different second page stops the match after the first page.
    std::vector<int32_t> u = t;
    u[5] = 7;
    hit = kv.match_prefix(u, 3, got_keys);
    ASSERT_EQ(hit.size(), 1u);
    EXPECT_EQ(hit[0], pages[0]);
    kv.release_pages(hit);
    // The same tokens at another offset (a different parent) do not match.
    std::vector<int32_t> shifted(t.begin() + 4, t.end());
    hit = kv.match_prefix(shifted, 2, got_keys);
    EXPECT_TRUE(hit.empty());
    // max_pages bounds the hit.
    hit = kv.match_prefix(t, 2, got_keys);
    EXPECT_EQ(hit.size(), 2u);
    kv.release_pages(hit);

    std::vector<int> holders(8, 0);
    for (PageId p : pages) holders[size_t(p)] = 1;
    kv.check_invariants(holders);
    kv.release_pages(pages);
    std::fill(holders.begin(), holders.end(), 0);
    kv.check_invariants(holders);
    EXPECT_EQ(kv.n_free_pages(), 5);
    EXPECT_EQ(kv.n_available_pages(), 8) << "cached pages nobody uses can be evicted";
}

TEST(prefix_cache, lru_eviction_takes_tails_and_oldest_first) {
    const int ps = 2;
    KvCacheManager kv(4, ps, 1, true);
    // Two chains of two pages each fill the cache: A = [a0 a1], B = [b0 b1].
    auto fill = [&](int32_t base) {
        std::vector<int32_t> t = {base, base + 1, base + 2, base + 3};
        std::vector<PageId> pages;
        uint64_t parent = PrefixCache::kRootHash;
        for (int i = 0; i < 2; ++i) {
            pages.push_back(kv.allocate_page());
            parent = kv.offer_page(pages.back(), parent, std::span(t).subspan(size_t(i * ps), ps));
        }
        kv.release_pages(pages);
        return t;
    };
    const auto a = fill(10);
    const auto b = fill(20);
    EXPECT_EQ(kv.n_free_pages(), 0);
    EXPECT_EQ(kv.n_available_pages(), 4);
    // Touch A, so B is older; a new page must come from B's tail.
    std::vector<uint64_t> keys;
    auto hit = kv.match_prefix(a, 2, keys);
    EXPECT_EQ(hit.size(), 2u);
    kv.release_pages(hit);
    const PageId fresh = kv.allocate_page();
    EXPECT_EQ(kv.n_cached_pages(), 3);
    auto hb = kv.match_prefix(b, 2, keys);
    EXPECT_EQ(hb.size(), 1u) << "B lost its tail page, its head still matches";
    kv.release_pages(hb);
    auto ha = kv.match_prefix(a, 2, keys);
    EXPECT_EQ(ha.size(), 2u) << "A was used more recently";
    // All remaining cached pages are in use by `ha` or evictable; allocate until exhausted.
    std::vector<PageId> more;
    while (kv.n_available_pages() > 0) more.push_back(kv.allocate_page());
    EXPECT_THROW(kv.allocate_page(), Error);
    std::vector<int> holders(4, 0);
    holders[size_t(fresh)] = 1;
    for (PageId p : ha) holders[size_t(p)] += 1;
    for (PageId p : more) holders[size_t(p)] += 1;
    kv.check_invariants(holders);
    kv.release_pages(ha);
    kv.release_pages(more);
}

TEST(prefix_cache, disabled_cache_never_matches) {
    KvCacheManager kv(4, 2, 1, false);
    std::vector<int32_t> t = {1, 2, 3, 4};
    std::vector<PageId> pages = {kv.allocate_page()};
    kv.offer_page(pages[0], PrefixCache::kRootHash, std::span(t).subspan(0, 2));
    std::vector<uint64_t> keys;
    EXPECT_TRUE(kv.match_prefix(t, 2, keys).empty());
    EXPECT_EQ(kv.n_cached_pages(), 0);
    kv.release_pages(pages);
}

TEST(prefix_cache, duplicate_content_stays_private) {
    KvCacheManager kv(4, 2, 1, true);
    std::vector<int32_t> t = {5, 6};
    const PageId p = kv.allocate_page(), q = kv.allocate_page();
    const uint64_t k1 = kv.offer_page(p, PrefixCache::kRootHash, t);
    const uint64_t k2 = kv.offer_page(q, PrefixCache::kRootHash, t);
    EXPECT_EQ(k1, k2);
    EXPECT_TRUE(kv.is_cached(p));
    EXPECT_FALSE(kv.is_cached(q));
    EXPECT_EQ(kv.ref_count(q), 1);
    std::vector<int> holders(4, 0);
    holders[size_t(p)] = holders[size_t(q)] = 1;
    kv.check_invariants(holders);
}
