// The in-process communicator: every collective on groups of 1..8 ranks (one thread each), sums in
// rank order with the same bits on every rank, uneven all-gathers, broadcast, split into TP/EP-like
// sub-groups, and abort waking a rank blocked on a peer that failed.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <thread>

#include "comm/in_process.h"
#include "core/check.h"

namespace osprey::comm {
namespace {

// Runs fn(comm) on one thread per rank; returns the first exception's message per rank ("" if none).
std::vector<std::string> run_ranks(int n, const std::function<void(Communicator&)>& fn) {
    auto comms = make_in_process_group(n);
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
            try {
                fn(*comms[size_t(r)]);
            } catch (const std::exception& e) {
                errors[size_t(r)] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    return errors;
}

float value(int rank, size_t i) {
    return 1.0f / float(3 + rank * 7 + int(i % 13)) + float(i) * 1e-3f;
}

TEST(InProcess, AllReduceSumsInRankOrderWithTheSameBitsEverywhere) {
    for (int n : {1, 2, 3, 4, 8}) {
        for (size_t len : {size_t(0), size_t(1), size_t(5), size_t(1000)}) {
            std::vector<std::vector<float>> got(static_cast<size_t>(n));
            const auto errors = run_ranks(n, [&](Communicator& c) {
                std::vector<float> x(len);
                for (size_t i = 0; i < len; ++i) x[i] = value(c.rank(), i);
                for (int rep = 0; rep < 3; ++rep) {  // repeated: state is reused correctly
                    std::vector<float> y = x;
                    c.all_reduce_sum(y);
                    if (rep == 2) got[size_t(c.rank())] = y;
                }
            });
            for (const auto& e : errors) EXPECT_EQ(e, "");
            for (size_t i = 0; i < len; ++i) {
                float expect = value(0, i);
                for (int r = 1; r < n; ++r) expect += value(r, i);
                for (int r = 0; r < n; ++r)
                    ASSERT_EQ(std::memcmp(&got[size_t(r)][i], &expect, sizeof(float)), 0)
                        << "n " << n << " rank " << r << " element " << i;
            }
        }
    }
}

TEST(InProcess, AllGatherEvenAndUneven) {
    const int n = 4;
    run_ranks(n, [&](Communicator& c) {
        const int r = c.rank();
        std::vector<int32_t> in = {r * 10, r * 10 + 1};
        std::vector<int32_t> out(size_t(2 * n));
        c.all_gather<int32_t>(in, out);
        for (int k = 0; k < n; ++k) {
            EXPECT_EQ(out[size_t(2 * k)], k * 10);
            EXPECT_EQ(out[size_t(2 * k + 1)], k * 10 + 1);
        }
        // rank k sends k elements
        const std::vector<size_t> counts = {0, 1, 2, 3};
        std::vector<float> mine(static_cast<size_t>(r), float(r));
        std::vector<float> all(6);
        c.all_gather_v<float>(mine, all, counts);
        EXPECT_EQ(all, (std::vector<float>{1, 2, 2, 3, 3, 3}));
    });
}

TEST(InProcess, BroadcastAndBarrier) {
    run_ranks(3, [&](Communicator& c) {
        std::vector<double> x(4, double(c.rank()));
        c.broadcast<double>(x, 2);
        EXPECT_EQ(x, std::vector<double>(4, 2.0));
        c.barrier();
    });
}

TEST(InProcess, SplitMakesTpAndEpLikeSubGroups) {
    // 8 ranks as 2 groups of 4 (colour rank / 4) and 4 groups of 2 (colour rank % 4), reversed keys.
    const auto errors = run_ranks(8, [&](Communicator& c) {
        const int r = c.rank();
        auto blocks = c.split(r / 4, r);
        auto strided = c.split(r % 4, -r);
        EXPECT_EQ(blocks->size(), 4);
        EXPECT_EQ(blocks->rank(), r % 4);
        EXPECT_EQ(strided->size(), 2);
        EXPECT_EQ(strided->rank(), r < 4 ? 1 : 0);  // key -r: the higher world rank comes first
        std::vector<float> x = {float(r)};
        blocks->all_reduce_sum(x);
        EXPECT_EQ(x[0], r < 4 ? 0 + 1 + 2 + 3 : 4 + 5 + 6 + 7);
        std::vector<float> y = {float(r)};
        strided->all_reduce_sum(y);
        EXPECT_EQ(y[0], float(2 * (r % 4) + 4));
        c.all_reduce_sum(x);  // the parent still works after the split
    });
    for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(InProcess, MismatchedSizesThrowOnEveryRank) {
    const auto errors = run_ranks(2, [&](Communicator& c) {
        std::vector<float> x(size_t(c.rank() + 1));
        c.all_reduce_sum(x);
    });
    for (const auto& e : errors) EXPECT_NE(e.find("all_reduce_sum"), std::string::npos) << e;
}

TEST(InProcess, AbortWakesRanksBlockedOnAFailedPeer) {
    auto comms = make_in_process_group(3);
    auto sub = std::vector<std::unique_ptr<Communicator>>();
    std::vector<std::string> errors(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r)
        threads.emplace_back([&, r] {
            try {
                if (r == 2) throw Error("rank 2 failed");  // never reaches the collective
                std::vector<float> x(8, 1.0f);
                comms[size_t(r)]->all_reduce_sum(x);
            } catch (const std::exception& e) {
                errors[size_t(r)] = e.what();
                if (r == 2) comms[size_t(r)]->abort();
            }
        });
    for (auto& t : threads) t.join();
    EXPECT_EQ(errors[2], "rank 2 failed");
    for (int r = 0; r < 2; ++r) EXPECT_NE(errors[size_t(r)].find("aborted"), std::string::npos) << errors[size_t(r)];
    // Later collectives fail at once.
    EXPECT_THROW(comms[0]->barrier(), Error);
}

TEST(InProcess, SingleRankIsTheIdentity) {
    auto c = make_single_rank();
    std::vector<float> x = {1.5f, -2.0f};
    c->all_reduce_sum(x);
    EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f}));
    std::vector<float> out(2);
    c->all_gather<float>(x, out);
    EXPECT_EQ(out, x);
    c->barrier();
    EXPECT_EQ(c->split(7, 0)->size(), 1);
}

}  // namespace
}  // namespace osprey::comm
