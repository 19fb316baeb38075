// Routing between data-parallel groups (engine/dp_router.h): longest prefix hit, then least load,
// then the lowest index; and the dry-run prefix match it reads (KvCacheManager::prefix_hit_tokens),
// which takes no reference and leaves the LRU alone. The engine-level routing is tested on a DP
// runner in tests/model/test_parallel.cpp (EngineRoutesByPrefixThenLoad).
#include <gtest/gtest.h>

#include <vector>

#include "core/check.h"
#include "engine/dp_router.h"
#include "engine/kv_cache_manager.h"

using namespace osprey;
using namespace osprey::engine;

TEST(dp_router, longest_prefix_hit_wins_over_load) {
    const std::vector<DpCandidate> g = {{.hit_tokens = 16, .load_tokens = 900},
                                        {.hit_tokens = 32, .load_tokens = 5000},
                                        {.hit_tokens = 0, .load_tokens = 0}};
    EXPECT_EQ(pick_dp_group(g), 1);
}

TEST(dp_router, equal_hits_go_to_the_least_loaded_then_the_lowest_index) {
    EXPECT_EQ(pick_dp_group(std::vector<DpCandidate>{{0, 300}, {0, 100}, {0, 200}}), 1);
    EXPECT_EQ(pick_dp_group(std::vector<DpCandidate>{{8, 300}, {8, 300}, {0, 0}}), 0);
    EXPECT_EQ(pick_dp_group(std::vector<DpCandidate>{{0, 7}, {0, 7}}), 0);
    EXPECT_EQ(pick_dp_group(std::vector<DpCandidate>{{0, 7}}), 0);
    EXPECT_THROW(pick_dp_group({}), Error);
}

TEST(dp_router, prefix_hit_tokens_is_a_dry_run) {
    const int ps = 4;
    KvCacheManager kv(/*n_pages=*/3, ps, /*n_window_slots=*/1, /*prefix_caching=*/true);
    const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    std::vector<PageId> pages = {kv.allocate_page(), kv.allocate_page()};
    uint64_t parent = PrefixCache::kRootHash;
    for (size_t i = 0; i < pages.size(); ++i)
        parent = kv.offer_page(pages[i], parent, std::span(tokens).subspan(i * ps, ps));
    kv.release_pages(pages);  // only the cache holds them now: both evictable
    EXPECT_EQ(kv.prefix_hit_tokens(tokens, 2), 8);
    EXPECT_EQ(kv.prefix_hit_tokens(tokens, 1), 4);
    EXPECT_EQ(kv.prefix_hit_tokens(std::vector<int32_t>{1, 2, 3, 9, 5}, 2), 0);
    EXPECT_EQ(kv.n_available_pages(), 3) << "no reference taken";
    std::vector<int> holders(3, 0);
    kv.check_invariants(holders);
    KvCacheManager off(3, ps, 1, /*prefix_caching=*/false);
    EXPECT_EQ(off.prefix_hit_tokens(tokens, 2), 0);
}
