// bench_forward --timeline's summary (bench/timeline_summary.h) on synthetic stamps whose answers are
// known: four replays of two layers of qkv -> attention -> out-projection, each call's warps landing,
// waiting and leaving at fixed offsets from the previous call's last exit.
#include "timeline_summary.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace osprey {
namespace {

constexpr uint32_t kQkv = cuda::kTlGemv | (5120u << 8), kOut = cuda::kTlGemv | (2880u << 8);
constexpr uint32_t kAttn = cuda::kTlAttention;

// Call i of replay r: 3 CTAs x 2 warps (warp j = 0..5), starting S = r * 2 ms + i * 10 us. Warp j enters
// at S - 2000 + 100 j ns, passes its wait at S + 500 + 50 j and leaves at S + 5000 + 200 j, so the call's
// last exit is S + 6000, i.e. 4 us before the next call's S: relative to it, entries 2.0 .. 2.5 us
// (median of six: 2.3), waits 4.5 .. 4.75, exits median 9.6 and last 10.0.
std::vector<cuda::TimelineRec> synthetic(int replays) {
    static const int keys[2][3] = {};
    const uint32_t tags[3] = {kQkv, kAttn, kOut};
    std::vector<cuda::TimelineRec> recs;
    for (int r = 0; r < replays; ++r)
        for (int layer = 0; layer < 2; ++layer)
            for (int k = 0; k < 3; ++k) {
                const int i = layer * 3 + k;
                const unsigned long long s = 1000000000ull + r * 2000000ull + i * 10000ull;
                for (uint32_t j = 0; j < 6; ++j)
                    recs.push_back({s - 2000 + 100 * j, s + 500 + 50 * j, s + 5000 + 200 * j, &keys[layer][k],
                                    tags[k], j / 2, 7 + j / 2, j % 2});
            }
    std::shuffle(recs.begin(), recs.end(), std::mt19937(3));  // the buffers' order is the atomics' order
    return recs;
}

const bench::TimelineRow* find(const std::vector<bench::TimelineRow>& rows, const std::string& name) {
    for (const auto& r : rows)
        if (r.kernel == name) return &r;
    return nullptr;
}

TEST(timeline_summary, boundaries_from_the_previous_calls_last_exit) {
    const auto rows = bench::summarize_timeline(synthetic(4), 4);
    ASSERT_EQ(rows.size(), 3u);
    for (const char* name : {"attention", "gemv n_out 2880"}) {
        const bench::TimelineRow* r = find(rows, name);
        ASSERT_NE(r, nullptr) << name;
        EXPECT_EQ(r->calls, 4) << name;  // two layers in each of the two middle replays
        EXPECT_EQ(r->ctas, 3) << name;
        EXPECT_EQ(r->sms, 3) << name;
        EXPECT_NEAR(r->enter0, 2.0, 1e-9) << name;
        EXPECT_NEAR(r->enter50, 2.3, 1e-9) << name;
        EXPECT_NEAR(r->enter1, 2.5, 1e-9) << name;
        EXPECT_NEAR(r->wait0, 4.5, 1e-9) << name;
        EXPECT_NEAR(r->wait1, 4.75, 1e-9) << name;
        EXPECT_NEAR(r->exit50, 9.6, 1e-9) << name;
        EXPECT_NEAR(r->exit1, 10.0, 1e-9) << name;
    }
    EXPECT_EQ(find(rows, "attention")->after, "gemv n_out 5120 x4");
    EXPECT_EQ(find(rows, "gemv n_out 2880")->after, "attention x4");
    // qkv follows the out-projection of its replay's previous layer, or the previous replay's last call.
    EXPECT_EQ(find(rows, "gemv n_out 5120")->after, "gemv n_out 2880 x4");
}

TEST(timeline_summary, no_records_no_rows) { EXPECT_TRUE(bench::summarize_timeline({}, 4).empty()); }

}  // namespace
}  // namespace osprey
