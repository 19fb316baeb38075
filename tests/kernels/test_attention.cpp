// attention_sinks against a double-precision loop over contiguous keys: the sink joins only the
// denominator, the sliding window holds exactly `window` keys including the query's own, query
// head h reads kv head h / group, and paged, ring and fresh key sources all give the same result.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "kernel_test_util.h"
#include "kernels/cpu/attention.h"

namespace osprey::cpu {
namespace {

struct Problem {
    int n_heads = 8, n_kv_heads = 2, head_dim = 16;
    int n_positions = 0;        // keys at positions [0, n_positions)
    std::vector<float> k, v;    // [n_positions, n_kv_heads * head_dim]
    std::vector<float> sinks;   // [n_heads]
    int kv_width() const { return n_kv_heads * head_dim; }
};

Problem make_problem(int n_positions, uint32_t seed, int n_heads = 8) {
    Problem p;
    p.n_heads = n_heads;
    p.n_positions = n_positions;
    p.k = test::random_floats(size_t(n_positions) * p.kv_width(), seed, -2.0f, 2.0f);
    p.v = test::random_floats(size_t(n_positions) * p.kv_width(), seed + 1);
    p.sinks = test::random_floats(p.n_heads, seed + 2, -1.0f, 3.0f);
    return p;
}

std::vector<double> naive(const Problem& p, const std::vector<float>& q, const std::vector<int32_t>& pos, int window,
                          int first_present = 0) {
    const int d = p.head_dim, group = p.n_heads / p.n_kv_heads;
    std::vector<double> out(q.size());
    for (size_t i = 0; i < pos.size(); ++i)
        for (int h = 0; h < p.n_heads; ++h) {
            const int g = h / group;
            std::vector<double> z;
            std::vector<int> keys;
            for (int j = 0; j <= pos[i]; ++j) {
                if ((window > 0 && pos[i] - j >= window) || j < first_present) continue;
                double s = 0;
                for (int c = 0; c < d; ++c) s += double(q[(i * p.n_heads + h) * d + c]) * p.k[j * p.kv_width() + g * d + c];
                z.push_back(s / std::sqrt(double(d)));
                keys.push_back(j);
            }
            double m = p.sinks[h];
            for (double s : z) m = std::max(m, s);
            double den = std::exp(p.sinks[h] - m);
            for (double s : z) den += std::exp(s - m);
            for (size_t t = 0; t < keys.size(); ++t)
                for (int c = 0; c < d; ++c)
                    out[(i * p.n_heads + h) * d + c] += std::exp(z[t] - m) / den * p.v[keys[t] * p.kv_width() + g * d + c];
        }
    return out;
}

// All keys as fresh rows (a prefill from an empty cache).
std::vector<float> run_fresh(const Problem& p, const std::vector<float>& q, const std::vector<int32_t>& pos, int window) {
    std::vector<float> out(q.size());
    attention_sinks({.out = out, .q = q, .positions = pos, .sinks = p.sinks,
                     .kv = {.fresh_k = p.k.data(), .fresh_v = p.v.data(), .fresh_stride = p.kv_width(),
                            .n_fresh = p.n_positions},
                     .n_heads = p.n_heads, .n_kv_heads = p.n_kv_heads, .head_dim = p.head_dim, .window = window,
                     .scale = 1.0f / std::sqrt(float(p.head_dim))});
    return out;
}

TEST(cpu_attention, full_causal_matches_double_loop) {
    const Problem p = make_problem(40, 1);
    std::vector<int32_t> pos(40);
    std::iota(pos.begin(), pos.end(), 0);
    const auto q = test::random_floats(pos.size() * p.n_heads * p.head_dim, 4, -2.0f, 2.0f);
    test::expect_close(run_fresh(p, q, pos, 0), naive(p, q, pos, 0), 1e-6, 1e-5, "full causal");
}

TEST(cpu_attention, sink_only_enlarges_the_denominator) {
    // One key: out = v * e^z / (e^z + e^sink). With a huge sink the output vanishes, it is not renormalised.
    Problem p = make_problem(1, 2);
    const auto q = test::random_floats(p.n_heads * p.head_dim, 5);
    const std::vector<int32_t> pos = {0};
    auto out = run_fresh(p, q, pos, 0);
    for (int h = 0; h < p.n_heads; ++h) {
        const int g = h / 4;
        double z = 0;
        for (int c = 0; c < p.head_dim; ++c) z += double(q[h * p.head_dim + c]) * p.k[g * p.head_dim + c];
        z *= 0.25;
        const double prob = 1.0 / (1.0 + std::exp(p.sinks[h] - z));
        for (int c = 0; c < p.head_dim; ++c)
            EXPECT_NEAR(out[h * p.head_dim + c], prob * p.v[g * p.head_dim + c], 1e-6);
    }
    std::fill(p.sinks.begin(), p.sinks.end(), 60.0f);
    out = run_fresh(p, q, pos, 0);
    for (float o : out) EXPECT_LT(std::abs(o), 1e-20f);
}

TEST(cpu_attention, window_holds_exactly_window_keys_including_self) {
    const int window = 128;
    Problem p = make_problem(200, 3);
    const std::vector<int32_t> pos = {150, 199, 127, 128};
    const auto q = test::random_floats(pos.size() * p.n_heads * p.head_dim, 6, -2.0f, 2.0f);
    test::expect_close(run_fresh(p, q, pos, window), naive(p, q, pos, window), 1e-6, 1e-5, "window 128");

    const std::vector<float> q150(q.begin(), q.begin() + p.n_heads * p.head_dim);  // the query at 150
    const auto base = run_fresh(p, q150, {150}, window);

    // The key just outside the window of query 150 (position 22) must not matter ...
    Problem outside = p;
    for (int c = 0; c < p.kv_width(); ++c) outside.v[22 * p.kv_width() + c] += 100.0f;
    const auto o1 = run_fresh(outside, q150, {150}, window);
    for (size_t i = 0; i < o1.size(); ++i) EXPECT_EQ(o1[i], base[i]);
    // ... and the oldest key inside it (position 23) must.
    Problem inside = p;
    for (int c = 0; c < p.kv_width(); ++c) inside.v[23 * p.kv_width() + c] += 100.0f;
    const auto o2 = run_fresh(inside, q150, {150}, window);
    EXPECT_NE(o2[0], base[0]);
}

TEST(cpu_attention, query_head_reads_kv_head_h_over_group) {
    // gpt-oss's grouping: 8 query heads per kv head. Zero the values of kv head 1: heads 0..7 (kv head 0)
    // keep their outputs, heads 8..15 read zeros.
    Problem p = make_problem(5, 4, /*n_heads=*/16);
    const int group = p.n_heads / p.n_kv_heads;
    ASSERT_EQ(group, 8);
    const std::vector<int32_t> pos = {4};
    const auto q = test::random_floats(p.n_heads * p.head_dim, 7);
    for (int j = 0; j < 5; ++j)
        for (int c = 0; c < p.head_dim; ++c) p.v[j * p.kv_width() + p.head_dim + c] = 0.0f;
    const auto out = run_fresh(p, q, pos, 0);
    for (int h = 0; h < p.n_heads; ++h) {
        double mag = 0;
        for (int c = 0; c < p.head_dim; ++c) mag += std::abs(out[h * p.head_dim + c]);
        if (h < group) EXPECT_GT(mag, 1e-3) << h;
        else EXPECT_EQ(mag, 0.0) << h;
    }
    test::expect_close(run_fresh(make_problem(5, 4, 16), q, pos, 0), naive(make_problem(5, 4, 16), q, pos, 0), 1e-6,
                       1e-5, "group of 8");
}

TEST(cpu_attention, paged_cache_with_fresh_rows_matches_contiguous) {
    const int page = 4, n_cached = 13, n_new = 6;
    const Problem p = make_problem(n_cached + n_new, 5);
    // Pages of the sequence in a shuffled order inside a bigger store.
    const std::vector<int32_t> pages = {6, 2, 0, 5};  // covers positions 0..15
    const int n_pages_total = 8;
    std::vector<float> ck(size_t(n_pages_total) * page * p.kv_width(), NAN), cv = ck;
    for (int j = 0; j < n_cached; ++j)
        for (int c = 0; c < p.kv_width(); ++c) {
            const size_t row = size_t(pages[j / page]) * page + j % page;
            ck[row * p.kv_width() + c] = p.k[j * p.kv_width() + c];
            cv[row * p.kv_width() + c] = p.v[j * p.kv_width() + c];
        }
    std::vector<int32_t> pos(n_new);
    std::iota(pos.begin(), pos.end(), n_cached);
    const auto q = test::random_floats(pos.size() * p.n_heads * p.head_dim, 8, -2.0f, 2.0f);
    for (int window : {0, 5}) {
        std::vector<float> out(q.size());
        attention_sinks({.out = out, .q = q, .positions = pos, .sinks = p.sinks,
                         .kv = {.cache_k = ck.data(), .cache_v = cv.data(), .blocks = pages, .block_rows = page,
                                .n_cached = n_cached, .fresh_k = p.k.data() + n_cached * p.kv_width(),
                                .fresh_v = p.v.data() + n_cached * p.kv_width(), .fresh_stride = p.kv_width(),
                                .n_fresh = n_new},
                         .n_heads = p.n_heads, .n_kv_heads = p.n_kv_heads, .head_dim = p.head_dim, .window = window,
                         .scale = 0.25f});
        test::expect_close(out, naive(p, q, pos, window), 1e-6, 1e-5, "paged, window " + std::to_string(window));
    }
}

TEST(cpu_attention, ring_window_slot_matches_contiguous_and_rejects_lost_keys) {
    const int ring = 8, window = 8, n_cached = 21, n_new = 3;
    const Problem p = make_problem(n_cached + n_new, 6);
    const std::vector<int32_t> slot = {2};  // third ring of the store
    std::vector<float> ck(size_t(4) * ring * p.kv_width(), NAN), cv = ck;
    for (int j = 0; j < n_cached; ++j)  // written in order: only the last 8 positions survive
        for (int c = 0; c < p.kv_width(); ++c) {
            const size_t row = size_t(slot[0]) * ring + j % ring;
            ck[row * p.kv_width() + c] = p.k[j * p.kv_width() + c];
            cv[row * p.kv_width() + c] = p.v[j * p.kv_width() + c];
        }
    std::vector<int32_t> pos(n_new);
    std::iota(pos.begin(), pos.end(), n_cached);
    const auto q = test::random_floats(pos.size() * p.n_heads * p.head_dim, 9, -2.0f, 2.0f);
    AttentionArgs a{.q = q, .positions = pos, .sinks = p.sinks,
                    .kv = {.cache_k = ck.data(), .cache_v = cv.data(), .blocks = slot, .block_rows = ring,
                           .ring = true, .n_cached = n_cached, .fresh_k = p.k.data() + n_cached * p.kv_width(),
                           .fresh_v = p.v.data() + n_cached * p.kv_width(), .fresh_stride = p.kv_width(),
                           .n_fresh = n_new},
                    .n_heads = p.n_heads, .n_kv_heads = p.n_kv_heads, .head_dim = p.head_dim, .window = window,
                    .scale = 0.25f};
    std::vector<float> out(q.size());
    a.out = out;
    attention_sinks(a);
    test::expect_close(out, naive(p, q, pos, window), 1e-6, 1e-5, "ring");

    // A ring refilled from position n_cached - 3 on (a prefix-cache replay): older keys are absent.
    a.kv.first_cached = n_cached - 3;
    attention_sinks(a);
    test::expect_close(out, naive(p, q, pos, window, n_cached - 3), 1e-6, 1e-5, "ring with absent keys");
    a.kv.first_cached = n_cached + 1;  // past the cached range: rejected
    EXPECT_THROW(attention_sinks(a), Error);
    a.kv.first_cached = 0;

    a.window = 0;  // full attention would need positions the ring no longer has
    EXPECT_THROW(attention_sinks(a), Error);
}

TEST(cpu_attention, rejects_query_without_keys) {
    const Problem p = make_problem(3, 7);
    const auto q = test::random_floats(p.n_heads * p.head_dim, 10);
    EXPECT_THROW(run_fresh(p, q, {3}, 0), Error);
}

}  // namespace
}  // namespace osprey::cpu
