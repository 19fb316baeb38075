#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "core/thread_pool.h"

TEST(thread_pool, covers_every_index_once) {
    osprey::ThreadPool pool(4);
    for (int64_t n : {1, 7, 1000, 100003}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
        });
        for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
}

TEST(thread_pool, rethrows_the_first_error) {
    osprey::ThreadPool pool(3);
    EXPECT_THROW(pool.parallel_for(100, [](int64_t b, int64_t) {
        if (b == 0) throw std::runtime_error("boom");
    }),
                 std::runtime_error);
    // The pool still works afterwards.
    std::atomic<int64_t> sum{0};
    pool.parallel_for(10, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) sum += i;
    });
    EXPECT_EQ(sum.load(), 45);
}
