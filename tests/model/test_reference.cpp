// The CPU reference forward: KV-cache paths agree with a single prefill bit for bit (decode steps,
// chunks longer than the window, ragged batches, shuffled pages, window-slot replay), the dump hook
// sees every step, the synthetic model's known continuation comes out, and bad batches are errors.
#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include <gtest/gtest.h>

#include "core/check.h"
#include "model/batch_check.h"
#include "test_reference_util.h"

namespace osprey::model {
namespace {

using test::Seq;

constexpr uint64_t kSeed = 7;
constexpr int kPageSize = 8;

CpuReference make_reference(int n_pages = 64, int n_slots = 4) {
    CpuReference ref(Weights::load(test::synthetic_checkpoint("small", test::small_config(), kSeed)));
    ref.allocate_kv(kv_layout_for(ref, kPageSize, n_pages, n_slots));
    return ref;
}

// Runs a copy the way the engine does: planned against the layout make_reference allocated.
void copy_kv(CpuReference& ref, const KvCopy& copy, int n_pages = 64, int n_slots = 4) {
    ref.copy_kv(plan_kv_copy(copy, kv_layout_for(ref, kPageSize, n_pages, n_slots)));
}

std::vector<int32_t> prompt(int n, int salt = 0) {
    std::vector<int32_t> t(n);
    for (int i = 0; i < n; ++i) t[i] = int32_t((37 * i + 11 + salt * 101) % 500 + 2);
    return t;
}

std::vector<float> logits_of_prefill(const std::vector<int32_t>& tokens, const std::vector<int>& chunks,
                                     std::vector<int32_t> pages = test::pages_from(0, 8)) {
    CpuReference ref = make_reference();
    Seq s{.tokens = tokens, .pages = std::move(pages), .window_slot = 1};
    std::vector<float> logits;
    for (int n : chunks) logits = test::step(ref, s, n);
    return logits;
}

TEST(reference, decode_steps_equal_one_prefill) {
    const auto tokens = prompt(40);  // more than twice the window of 16
    const auto one = logits_of_prefill(tokens, {40});
    std::vector<int> steps = {25};
    steps.insert(steps.end(), 15, 1);
    const auto decoded = logits_of_prefill(tokens, steps);
    ASSERT_EQ(one.size(), size_t(512));
    EXPECT_EQ(one, decoded);
}

TEST(reference, chunks_longer_than_the_window_equal_one_prefill) {
    const auto tokens = prompt(53);
    EXPECT_EQ(logits_of_prefill(tokens, {53}), logits_of_prefill(tokens, {20, 19, 7, 1, 6}));
}

TEST(reference, page_order_does_not_matter) {
    const auto tokens = prompt(45);
    EXPECT_EQ(logits_of_prefill(tokens, {30, 15}), logits_of_prefill(tokens, {30, 15}, {17, 3, 60, 9, 22, 41, 5}));
}

TEST(reference, ragged_batch_equals_separate_runs) {
    const auto ta = prompt(35, 1), tb = prompt(19, 2);
    // Separately: A prefills 30 then 5; B prefills 18 then decodes 1.
    const auto want_a = logits_of_prefill(ta, {30, 5});
    const auto want_b = logits_of_prefill(tb, {18, 1}, test::pages_from(20, 3));

    CpuReference ref = make_reference();
    Seq a{.tokens = ta, .pages = test::pages_from(0, 5), .window_slot = 0};
    Seq b{.tokens = tb, .pages = test::pages_from(20, 3), .window_slot = 3};
    test::step(ref, a, 30);
    test::step(ref, b, 18);
    ForwardBatch batch;
    batch.tokens = {tb[18]};
    batch.tokens.insert(batch.tokens.end(), ta.begin() + 30, ta.end());
    batch.slices = {test::slice_for(b, 0, 1), test::slice_for(a, 1, 5)};
    ref.forward(batch);
    std::vector<float> logits;
    ref.logits_to_host(logits);
    ASSERT_EQ(logits.size(), 2 * size_t(512));
    EXPECT_TRUE(std::equal(want_b.begin(), want_b.end(), logits.begin()));
    EXPECT_TRUE(std::equal(want_a.begin(), want_a.end(), logits.begin() + 512));
}

TEST(reference, replay_into_a_reused_window_slot_never_reads_stale_rows) {
    // A prefix-cache hit: a second sequence shares the first 4 pages (32 positions) of the first one
    // and replays positions [17, 32) (window - 1 tokens) into its window slot, whose rows still hold
    // the first sequence's K/V. The result must equal the same replay into a never-used slot.
    const auto tokens = prompt(40, 3);
    auto replay_logits = [&](int slot) {
        CpuReference ref = make_reference();
        Seq first{.tokens = tokens, .pages = test::pages_from(0, 5), .window_slot = 2};
        test::step(ref, first, 40);
        // The ring starts empty at the replay's first position (what the engine says after a hit).
        Seq second{
            .tokens = tokens, .pages = {0, 1, 2, 3, 10}, .window_slot = slot, .window_first = 17, .n_computed = 17};
        ForwardBatch b;
        b.tokens.assign(tokens.begin() + 17, tokens.end());
        b.slices.push_back(test::slice_for(second, 0, 23, /*n_full_kv_cached=*/15));
        ref.forward(b);
        std::vector<float> logits;
        ref.logits_to_host(logits);
        return logits;
    };
    const auto reused = replay_logits(2), fresh = replay_logits(3);
    EXPECT_EQ(reused, fresh);
    // The shared pages were not rewritten by the replay, and the logits are finite.
    for (float v : reused) ASSERT_TRUE(std::isfinite(v));
}

TEST(reference, original_layout_gives_the_same_logits) {
    // OpenAI's original/ layout (fused qkv, other names) of the same seed is the same model.
    const auto tokens = prompt(20, 4);
    CpuReference original(Weights::load(
        test::synthetic_checkpoint("small-original", test::small_config(), kSeed, Layout::original)));
    original.allocate_kv(kv_layout_for(original, kPageSize, 8, 1));
    Seq s{.tokens = tokens, .pages = test::pages_from(0, 8)};
    EXPECT_EQ(test::step(original, s, 20), logits_of_prefill(tokens, {20}));
}

TEST(reference, dump_hook_sees_every_step) {
    CpuReference ref = make_reference();
    std::map<std::pair<std::string, int>, size_t> seen;
    std::vector<float> dumped_logits;
    ref.set_dump([&](std::string_view name, int layer, std::span<const float> v) {
        seen[{std::string(name), layer}] = v.size();
        if (name == "logits") dumped_logits.assign(v.begin(), v.end());
    });
    Seq s{.tokens = prompt(5), .pages = test::pages_from(0, 1)};
    const auto logits = test::step(ref, s, 5);
    const Config c = test::small_config();
    EXPECT_EQ(seen.at({"embedding", -1}), size_t(5 * c.d_model));
    for (int layer = 0; layer < c.n_layers; ++layer) {
        for (const char* name : {"attn_norm", "attn_out", "resid_attn", "mlp_norm", "moe", "resid_mlp"})
            EXPECT_EQ(seen.at({name, layer}), size_t(5 * c.d_model)) << name << " " << layer;
        EXPECT_EQ(seen.at({"q", layer}), size_t(5 * c.q_dim()));
        EXPECT_EQ(seen.at({"attn", layer}), size_t(5 * c.q_dim()));
        EXPECT_EQ(seen.at({"k", layer}), size_t(5 * c.kv_dim()));
        EXPECT_EQ(seen.at({"v", layer}), size_t(5 * c.kv_dim()));
        EXPECT_EQ(seen.at({"router_logits", layer}), size_t(5 * c.n_experts));
    }
    EXPECT_EQ(seen.at({"final_norm", -1}), size_t(c.d_model));  // only the row that wants logits
    EXPECT_EQ(dumped_logits, logits);
}

TEST(reference, greedy_continuation_of_the_synthetic_model) {
    // The synthetic unembedding makes synthetic_next_token() the greedy answer after a one-token prompt.
    CpuReference ref = make_reference();
    const Config c = test::small_config();
    int agree = 0;
    const int n = 12;
    for (int i = 0; i < n; ++i) {
        const int32_t t = int32_t(3 + 41 * i);
        Seq s{.tokens = {t}, .pages = test::pages_from(0, 1), .window_slot = 0};
        const auto logits = test::step(ref, s, 1);
        const int best = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
        agree += best == synthetic_next_token(c, kSeed, t);
    }
    EXPECT_EQ(agree, n);
}

TEST(reference, greedy_sample_with_log_probability) {
    CpuReference ref = make_reference();
    Seq s{.tokens = prompt(6), .pages = test::pages_from(0, 1)};
    const auto logits = test::step(ref, s, 6);
    SamplingParams p;
    p.temperature = 0.0f;
    p.logprobs = true;
    SamplingState st;
    SampleResult r;
    ref.sample({&p, 1}, {&st, 1}, {&r, 1});
    const int best = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(r.token, best);
    double sum = 0;
    for (float v : logits) sum += std::exp(double(v) - logits[best]);
    EXPECT_NEAR(r.logprob, -std::log(sum), 1e-5);
}

TEST(reference, copied_kv_continues_exactly_like_its_source) {
    // A fork: sequence A prefills 37 positions (longer than the window of 16, a partial last page),
    // its pages and ring are copied into B's (non-contiguous pages, another slot); B then decodes
    // as A would, bit for bit, and A is untouched by the copy.
    const auto tokens = prompt(42, 5);
    const auto want = logits_of_prefill(tokens, {37, 1, 1, 1, 1, 1});
    CpuReference ref = make_reference();
    Seq a{.tokens = tokens, .pages = test::pages_from(0, 6), .window_slot = 0};
    test::step(ref, a, 37);
    Seq b{.tokens = tokens, .pages = {40, 41, 12, 13, 14, 50}, .window_slot = 3, .n_computed = 37};
    copy_kv(ref,
            {.src_pages = test::pages_from(0, 5), .dst_pages = {40, 41, 12, 13, 14}, .src_slot = 0, .dst_slot = 3});
    std::vector<float> got_a, got_b;
    for (int i = 0; i < 5; ++i) {
        got_b = test::step(ref, b, 1);
        got_a = test::step(ref, a, 1);
    }
    EXPECT_EQ(got_b, want);
    EXPECT_EQ(got_a, want);
}

TEST(reference, bad_kv_copies_are_refused_and_change_nothing) {
    CpuReference ref = make_reference(/*n_pages=*/8, /*n_slots=*/2);
    Seq a{.tokens = prompt(20, 6), .pages = test::pages_from(0, 3), .window_slot = 0};
    test::step(ref, a, 19);
    const KvCopy bad[] = {
        {.src_pages = {0, 1}, .dst_pages = {4}},                              // lengths differ
        {.src_pages = {0, 1}, .dst_pages = {1, 2}},                           // page 1 on both sides
        {.src_pages = {0, 1}, .dst_pages = {4, 4}},                           // destination twice
        {.src_pages = {0}, .dst_pages = {8}},                                 // page out of range
        {.src_pages = {0}, .dst_pages = {4}, .src_slot = 0, .dst_slot = -1},  // half a slot copy
        {.src_pages = {0}, .dst_pages = {4}, .src_slot = 0, .dst_slot = 2},   // slot out of range
        {.src_pages = {0}, .dst_pages = {4}, .src_slot = 0, .dst_slot = 0},   // slot onto itself
    };
    for (size_t i = 0; i < std::size(bad); ++i) EXPECT_THROW(copy_kv(ref, bad[i], 8, 2), Error) << "case " << i;
    // Plans outside the allocated blocks, or overlapping themselves, are refused by the backend.
    const KvCopyPlan bad_plans[] = {
        {{{KvGroupKind::paged, 0, 8 * kPageSize, kPageSize}}},  // past the last page
        {{{KvGroupKind::ring, 0, 16, 17}}},                     // past the last ring row
        {{{KvGroupKind::paged, 0, 4, 8}}},                      // source and destination overlap
    };
    for (size_t i = 0; i < std::size(bad_plans); ++i) EXPECT_THROW(ref.copy_kv(bad_plans[i]), Error) << "plan " << i;
    // The failed copies wrote nothing: A continues as a fresh prefill would.
    const auto want = logits_of_prefill(prompt(20, 6), {19, 1});
    EXPECT_EQ(test::step(ref, a, 1), want);
}

TEST(reference, kv_copy_plan_merges_consecutive_pages) {
    const KvLayout layout{.spec = KvSpec(test::small_config(), KvDtype::f32, 4), .n_pages = 32, .n_window_slots = 2};
    auto as_tuple = [](const KvRowRun& r) { return std::make_tuple(r.group, r.src, r.dst, r.n); };
    const KvGroupKind paged = KvGroupKind::paged;
    const std::vector<KvRowRun> runs =
        plan_kv_copy({.src_pages = {0, 1, 2, 7, 8, 3}, .dst_pages = {10, 11, 12, 20, 22, 23}}, layout).runs;
    ASSERT_EQ(runs.size(), 4u);  // pages 0-2 -> 10-12 merged; 7 -> 20, 8 -> 22, 3 -> 23 alone (rows of 4 per page)
    EXPECT_EQ(as_tuple(runs[0]), std::make_tuple(paged, int64_t(0), int64_t(40), int64_t(12)));
    EXPECT_EQ(as_tuple(runs[1]), std::make_tuple(paged, int64_t(28), int64_t(80), int64_t(4)));
    EXPECT_EQ(as_tuple(runs[2]), std::make_tuple(paged, int64_t(32), int64_t(88), int64_t(4)));
    EXPECT_EQ(as_tuple(runs[3]), std::make_tuple(paged, int64_t(12), int64_t(92), int64_t(4)));
    EXPECT_TRUE(plan_kv_copy({}, layout).runs.empty());
    // A window slot is one run of the ring's rows (small_config's window is 16).
    const std::vector<KvRowRun> ring =
        plan_kv_copy({.src_pages = {}, .dst_pages = {}, .src_slot = 1, .dst_slot = 0}, layout).runs;
    ASSERT_EQ(ring.size(), 1u);
    EXPECT_EQ(as_tuple(ring[0]), std::make_tuple(KvGroupKind::ring, int64_t(16), int64_t(0), int64_t(16)));
}

TEST(reference, rejects_bad_batches) {
    CpuReference ref = make_reference(/*n_pages=*/4, /*n_slots=*/2);
    Seq s{.tokens = prompt(10), .pages = test::pages_from(0, 2)};
    auto batch_of = [&](const Seq& q, int n) {
        ForwardBatch b;
        b.tokens.assign(q.tokens.begin(), q.tokens.begin() + n);
        b.slices.push_back(test::slice_for(q, 0, n));
        return b;
    };
    ForwardBatch b = batch_of(s, 10);
    b.tokens[3] = 512;  // outside the vocabulary
    EXPECT_THROW(ref.forward(b), Error);
    b = batch_of(s, 10);
    b.slices[0].pages = {0};  // 10 positions need 2 pages of 8
    EXPECT_THROW(ref.forward(b), Error);
    b = batch_of(s, 10);
    b.slices[0].pages = {0, 4};  // page 4 does not exist
    EXPECT_THROW(ref.forward(b), Error);
    b = batch_of(s, 10);
    b.slices[0].window_slot = 2;  // slot 2 does not exist
    EXPECT_THROW(ref.forward(b), Error);
    b = batch_of(s, 10);
    b.slices[0].window_first = 1;  // the ring cannot hold positions after the slice's start
    EXPECT_THROW(ref.forward(b), Error);
    b = batch_of(s, 10);
    b.slices[0].n_tokens = 9;  // slices must cover every token
    EXPECT_THROW(ref.forward(b), Error);
    b = batch_of(s, 10);
    b.slices.push_back(b.slices[0]);  // second slice: same window slot, overlapping tokens
    b.slices[1].first_token = 10;
    b.tokens.insert(b.tokens.end(), s.tokens.begin(), s.tokens.end());
    EXPECT_THROW(ref.forward(b), Error);
    EXPECT_THROW(ref.forward(ForwardBatch{}), Error);
    // A KV layout over the budget is refused.
    CpuReference small(Weights::load(test::synthetic_checkpoint("small", test::small_config(), kSeed)),
                       {.kv_budget_bytes = 1000});
    EXPECT_THROW(small.allocate_kv(kv_layout_for(small, 8, 4, 1)), Error);
    // Nothing was written by the failed steps: a valid batch still works.
    ref.forward(batch_of(s, 10));
}

}  // namespace
}  // namespace osprey::model
