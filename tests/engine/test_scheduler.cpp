// The scheduler alone: what a step plan holds (decodes first, chunked prefill within the token
// budget, admission order by priority then arrival, preemption of the lowest-ranked sequence).
#include <gtest/gtest.h>

#include "core/check.h"
#include "engine/scheduler.h"

using namespace osprey;
using namespace osprey::engine;

namespace {

std::shared_ptr<RequestInfo> info(uint64_t uid, int n_prompt, int max_new, int priority = 0) {
    auto r = std::make_shared<RequestInfo>();
    r->uid = uid;
    r->stream = std::make_shared<RequestStream>(uid, "", 1);
    r->max_new_tokens = max_new;
    r->priority = priority;
    r->n_prompt = n_prompt;
    return r;
}

// Commits a plan with token 7 sampled for every row that wants one.
std::vector<SeqOutput> commit_all(Scheduler& s, const StepPlan& plan) {
    std::vector<SampleResult> results;
    for (const auto& c : plan.chunks)
        if (c.want_logits) results.push_back(SampleResult{7, 0.0f, {}});
    auto out = s.commit(plan, results);
    s.check_invariants();
    return out;
}

}  // namespace

TEST(scheduler, long_prompt_is_chunked_and_mixed_with_decodes) {
    KvCacheManager kv(64, 4, 4, true);
    Scheduler s({.max_num_seqs = 4, .max_batch_tokens = 10, .window_replay = 7}, kv);
    s.add_request(info(1, 3, 50), {1, 2, 3}, {SamplingParams{}});
    StepPlan p = s.schedule();
    ASSERT_EQ(p.chunks.size(), 1u);
    EXPECT_EQ(p.chunks[0].n_tokens, 3);
    EXPECT_TRUE(p.chunks[0].want_logits);
    commit_all(s, p);

    std::vector<int32_t> long_prompt(25, 5);
    s.add_request(info(2, 25, 5), long_prompt, {SamplingParams{}});
    p = s.schedule();
    ASSERT_EQ(p.chunks.size(), 2u);
    EXPECT_EQ(p.chunks[0].seq->request->uid, 1u) << "decode first";
    EXPECT_EQ(p.chunks[0].n_tokens, 1);
    EXPECT_EQ(p.chunks[1].n_tokens, 9) << "the rest of the budget";
    EXPECT_FALSE(p.chunks[1].want_logits);
    EXPECT_EQ(p.n_tokens(), 10);
    commit_all(s, p);
    p = s.schedule();
    ASSERT_EQ(p.chunks.size(), 2u);
    EXPECT_EQ(p.chunks[1].start_pos, 9);
    EXPECT_EQ(p.chunks[1].n_tokens, 9);
    commit_all(s, p);
    p = s.schedule();
    EXPECT_EQ(p.chunks[1].n_tokens, 7);
    EXPECT_TRUE(p.chunks[1].want_logits) << "last chunk samples the first token";
    commit_all(s, p);
}

TEST(scheduler, admission_follows_priority_then_arrival) {
    KvCacheManager kv(64, 4, 2, true);
    Scheduler s({.max_num_seqs = 2, .max_batch_tokens = 100, .window_replay = 7}, kv);
    s.add_request(info(1, 4, 5, 0), {1, 1, 1, 1}, {SamplingParams{}});
    s.add_request(info(2, 4, 5, 0), {2, 2, 2, 2}, {SamplingParams{}});
    s.add_request(info(3, 4, 5, 2), {3, 3, 3, 3}, {SamplingParams{}});
    const StepPlan p = s.schedule();
    ASSERT_EQ(p.chunks.size(), 2u) << "two window slots";
    EXPECT_EQ(p.chunks[0].seq->request->uid, 3u);
    EXPECT_EQ(p.chunks[1].seq->request->uid, 1u);
    EXPECT_EQ(s.n_waiting(), 1);
    commit_all(s, p);
}

TEST(scheduler, a_higher_priority_arrival_preempts_the_lowest_ranked_running_sequence) {
    KvCacheManager kv(64, 4, 2, true);
    Scheduler s({.max_num_seqs = 2, .max_batch_tokens = 100, .window_replay = 7}, kv);
    s.add_request(info(1, 4, 50, 0), {1, 1, 1, 1}, {SamplingParams{}});
    s.add_request(info(2, 4, 50, 1), {2, 2, 2, 2}, {SamplingParams{}});
    commit_all(s, s.schedule());  // both run; the two slots are taken
    // Same priority as the lowest running one: waits, nothing is preempted.
    s.add_request(info(3, 4, 50, 0), {3, 3, 3, 3}, {SamplingParams{}});
    StepPlan p = s.schedule();
    EXPECT_EQ(p.n_preempted, 0);
    EXPECT_EQ(s.n_waiting(), 1);
    commit_all(s, p);
    // Higher priority than request 1: request 1 is preempted and the arrival runs in this step.
    s.add_request(info(4, 4, 50, 2), {4, 4, 4, 4}, {SamplingParams{}});
    p = s.schedule();
    EXPECT_EQ(p.n_preempted, 1);
    bool admitted = false;
    for (const ScheduledChunk& c : p.chunks) {
        EXPECT_NE(c.seq->request->uid, 1u) << "the preempted request is not scheduled";
        admitted = admitted || c.seq->request->uid == 4u;
    }
    EXPECT_TRUE(admitted);
    EXPECT_EQ(s.n_waiting(), 2);  // requests 1 and 3
    commit_all(s, p);
    s.check_invariants();
}

TEST(scheduler, out_of_pages_preempts_the_lowest_ranked_and_recomputes_it) {
    KvCacheManager kv(4, 2, 4, false);  // 8 tokens of cache in all
    Scheduler s({.max_num_seqs = 4, .max_batch_tokens = 100, .window_replay = 7}, kv);
    s.add_request(info(1, 3, 4, 1), {1, 2, 3}, {SamplingParams{}});
    s.add_request(info(2, 3, 4, 0), {4, 5, 6}, {SamplingParams{}});
    commit_all(s, s.schedule());  // both prefill: 2 pages each, all pages used
    EXPECT_EQ(kv.n_available_pages(), 0);
    // Both decode position 3 (still in their second page).
    commit_all(s, s.schedule());
    // Position 4 needs a third page each: request 2 (lower priority) is preempted.
    StepPlan p = s.schedule();
    EXPECT_EQ(p.n_preempted, 1);
    ASSERT_EQ(p.chunks.size(), 1u);
    EXPECT_EQ(p.chunks[0].seq->request->uid, 1u);
    EXPECT_EQ(s.n_waiting(), 1);
    commit_all(s, p);
    // Request 1 ends (max 4 new tokens) after one more step; then request 2 recomputes prompt +
    // its 2 generated tokens in one chunk and continues.
    auto out = commit_all(s, s.schedule());
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.back().event.kind, Event::Kind::finish);
    p = s.schedule();
    ASSERT_EQ(p.chunks.size(), 1u);
    EXPECT_EQ(p.chunks[0].start_pos, 0);
    EXPECT_EQ(p.chunks[0].n_tokens, 5);
    EXPECT_TRUE(p.chunks[0].want_logits);
    commit_all(s, p);
    while (!s.idle()) commit_all(s, s.schedule());
    EXPECT_EQ(s.counters().n_preemptions, 1u);
    EXPECT_EQ(kv.n_free_pages(), 4);
}

TEST(scheduler, commit_rejects_mismatched_results) {
    KvCacheManager kv(8, 4, 2, true);
    Scheduler s({.max_num_seqs = 2, .max_batch_tokens = 100, .window_replay = 7}, kv);
    s.add_request(info(1, 2, 5), {1, 2}, {SamplingParams{}});
    const StepPlan p = s.schedule();
    EXPECT_THROW(s.commit(p, {}), Error);
}
