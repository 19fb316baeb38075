// The scheduler alone: what a step plan holds (decodes first, chunked prefill within the token
// budget, admission order by priority then arrival, preemption of the lowest-ranked sequence).
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

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

// The mixed-prefill limit (SchedulerOptions::max_mixed_prefill_tokens): the prefill part of a step
// that also decodes.
namespace {

// Commits a plan with token 7 for every row it samples (verify chunks have 1 + n_draft rows).
std::vector<SeqOutput> commit_rows(Scheduler& s, const StepPlan& plan) {
    std::vector<SampleResult> results;
    for (const auto& c : plan.chunks)
        if (c.want_logits) results.resize(results.size() + size_t(1 + c.n_draft), SampleResult{7, 0.0f, {}});
    auto out = s.commit(plan, results);
    s.check_invariants();
    return out;
}

bool is_decode_chunk(const ScheduledChunk& c) {
    return c.start_pos >= c.seq->n_prompt();
}

int prefill_tokens(const StepPlan& p) {
    int n = 0;
    for (const auto& c : p.chunks) n += is_decode_chunk(c) ? 0 : c.n_tokens;
    return n;
}

int decode_chunks(const StepPlan& p) {
    int n = 0;
    for (const auto& c : p.chunks) n += is_decode_chunk(c) ? 1 : 0;
    return n;
}

// `n` short requests (uids from `first_uid`), prefilled and decoding after one step.
void start_decoders(Scheduler& s, int n, uint64_t first_uid, int max_new = 1000) {
    for (int i = 0; i < n; ++i)
        s.add_request(info(first_uid + uint64_t(i), 4, max_new), {1, 2, 3, 4}, {SamplingParams{}});
    commit_rows(s, s.schedule());
}

}  // namespace

TEST(scheduler_mixed_prefill, caps_prefill_while_decoding_and_decodes_first) {
    KvCacheManager kv(4096, 16, 8, false);
    Scheduler s({.max_num_seqs = 8, .max_batch_tokens = 2048, .window_replay = 7, .max_mixed_prefill_tokens = 256}, kv);
    start_decoders(s, 3, 1);
    s.add_request(info(10, 1000, 5), std::vector<int32_t>(1000, 5), {SamplingParams{}});
    int prefilled = 0;
    std::vector<int> chunks;
    while (prefilled < 1000) {
        const StepPlan p = s.schedule();
        ASSERT_EQ(decode_chunks(p), 3) << "every decode runs, whatever the prefill";
        for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(is_decode_chunk(p.chunks[i])) << "decodes first";
        EXPECT_LE(prefill_tokens(p), 256);
        chunks.push_back(prefill_tokens(p));
        prefilled += prefill_tokens(p);
        commit_rows(s, p);
    }
    EXPECT_EQ(chunks, (std::vector<int>{256, 256, 256, 232})) << "the last chunk is the prompt's rest";
}

TEST(scheduler_mixed_prefill, nothing_decoding_gets_the_full_budget) {
    // Low load: the prompt that arrives alone is prefilled as fast as without the limit.
    KvCacheManager kv(4096, 16, 8, false);
    Scheduler s({.max_num_seqs = 8, .max_batch_tokens = 2048, .window_replay = 7, .max_mixed_prefill_tokens = 256}, kv);
    s.add_request(info(1, 1500, 5), std::vector<int32_t>(1500, 5), {SamplingParams{}});
    StepPlan p = s.schedule();
    ASSERT_EQ(p.chunks.size(), 1u);
    EXPECT_EQ(p.chunks[0].n_tokens, 1500);
    EXPECT_TRUE(p.chunks[0].want_logits) << "first token after one step";
    commit_rows(s, p);
    // A burst of arrivals with nothing decoding: admitted up to the step budget, not the limit.
    KvCacheManager kv2(4096, 16, 8, false);
    Scheduler s2({.max_num_seqs = 8, .max_batch_tokens = 2048, .window_replay = 7, .max_mixed_prefill_tokens = 256},
                 kv2);
    for (uint64_t i = 0; i < 3; ++i)
        s2.add_request(info(i + 1, 900, 5), std::vector<int32_t>(900, 5), {SamplingParams{}});
    p = s2.schedule();
    ASSERT_EQ(p.chunks.size(), 3u);
    EXPECT_EQ(p.chunks[2].n_tokens, 192) << "the third prompt's chunk: the 248 tokens left, in whole tiles";
    commit_rows(s2, p);
}

TEST(scheduler_mixed_prefill, applies_from_min_decodes_on) {
    KvCacheManager kv(4096, 16, 8, false);
    Scheduler s({.max_num_seqs = 8,
                 .max_batch_tokens = 2048,
                 .window_replay = 7,
                 .max_mixed_prefill_tokens = 128,
                 .mixed_prefill_min_decodes = 3},
                kv);
    start_decoders(s, 2, 1);
    s.add_request(info(10, 1000, 5), std::vector<int32_t>(1000, 5), {SamplingParams{}});
    StepPlan p = s.schedule();
    EXPECT_EQ(prefill_tokens(p), 1000) << "2 decodes: under the threshold, the whole budget";
    commit_rows(s, p);
    s.add_request(info(11, 1000, 5), std::vector<int32_t>(1000, 5), {SamplingParams{}});
    p = s.schedule();
    EXPECT_EQ(decode_chunks(p), 3);
    EXPECT_EQ(prefill_tokens(p), 128) << "3 decodes: the limit";
    commit_rows(s, p);
}

TEST(scheduler_mixed_prefill, split_chunks_are_whole_tiles_and_off_is_the_old_rule) {
    for (const int limit : {0, 600}) {
        KvCacheManager kv(4096, 16, 8, false);
        Scheduler s(
            {.max_num_seqs = 8, .max_batch_tokens = 1000, .window_replay = 7, .max_mixed_prefill_tokens = limit}, kv);
        start_decoders(s, 3, 1);
        s.add_request(info(10, 3000, 5), std::vector<int32_t>(3000, 5), {SamplingParams{}});
        const StepPlan p = s.schedule();
        // Off: the 997 tokens the decodes leave. On: min(997, 600) rounded down to 9 tiles of 64.
        EXPECT_EQ(prefill_tokens(p), limit == 0 ? 997 : 576) << "limit " << limit;
        commit_rows(s, p);
    }
}

TEST(scheduler_mixed_prefill, a_prefill_advances_every_step_even_when_proposals_could_fill_it) {
    // 40 decodes with 4 proposals each would take all 200 tokens of the step: the limit keeps a
    // tile for the waiting prompt. Without it the prompt waits until the proposals leave room.
    struct Fours : Proposer {
        std::string name() const override { return "fours"; }
        void propose(std::span<DraftRequest> requests) override {
            for (DraftRequest& r : requests) r.out->assign(size_t(r.max_tokens), 7);
        }
    };
    for (const int limit : {0, 64}) {
        KvCacheManager kv(4096, 16, 48, false);
        Scheduler s(
            {.max_num_seqs = 48, .max_batch_tokens = 200, .window_replay = 7, .max_mixed_prefill_tokens = limit}, kv);
        Fours proposer;
        SpeculativeOptions spec;
        spec.method = SpecMethod::ngram;
        spec.num_tokens = 4;
        s.set_speculation(&proposer, spec, 1 << 20);
        start_decoders(s, 40, 1);
        commit_rows(s, s.schedule());  // proposals start from the second output token
        s.add_request(info(100, 300, 5), std::vector<int32_t>(300, 5), {SamplingParams{}});
        int steps = 0, prefilled = 0;
        for (; prefilled < 300 && steps < 5; ++steps) {
            const StepPlan p = s.schedule();
            EXPECT_EQ(decode_chunks(p), 40);
            EXPECT_LE(p.n_tokens(), 200);
            if (limit > 0) {
                EXPECT_EQ(prefill_tokens(p), std::min(64, 300 - prefilled)) << "step " << steps;
            }
            prefilled += prefill_tokens(p);
            commit_rows(s, p);
        }
        if (limit == 0) {
            EXPECT_EQ(prefilled, 0) << "starved by the proposals";
        } else {
            EXPECT_EQ(prefilled, 300) << "a tile per step: 64, 64, 64, 64, then the last 44";
        }
    }
}

TEST(scheduler_mixed_prefill, a_higher_priority_arrival_gets_the_prefill_budget_first) {
    KvCacheManager kv(4096, 16, 8, false);
    Scheduler s({.max_num_seqs = 8, .max_batch_tokens = 2048, .window_replay = 7, .max_mixed_prefill_tokens = 128}, kv);
    start_decoders(s, 2, 1);
    s.add_request(info(10, 2000, 5, 0), std::vector<int32_t>(2000, 5), {SamplingParams{}});  // long, priority 0
    commit_rows(s, s.schedule());                                                            // its first chunk
    s.add_request(info(11, 300, 5, 3), std::vector<int32_t>(300, 3), {SamplingParams{}});    // priority 3
    // The priority-3 prompt takes the prefill budget (128, 128, then its last 44); the priority-0
    // one gets only what is left after it: nothing, nothing, then a tile of the last 84 tokens.
    const std::vector<std::vector<std::pair<uint64_t, int>>> want = {
        {{11, 128}}, {{11, 128}}, {{11, 44}, {10, 64}}, {{10, 128}}};
    for (size_t i = 0; i < want.size(); ++i) {
        const auto& step = want[i];
        const StepPlan p = s.schedule();
        EXPECT_EQ(decode_chunks(p), i < 3 ? 2 : 3) << "the priority-3 request decodes after its prompt";
        std::vector<std::pair<uint64_t, int>> got;
        for (const auto& c : p.chunks)
            if (!is_decode_chunk(c)) got.emplace_back(c.seq->request->uid, c.n_tokens);
        EXPECT_EQ(got, step);
        commit_rows(s, p);
    }
}

TEST(scheduler_mixed_prefill, randomized_load_respects_the_budget_and_starves_nothing) {
    constexpr int kLimit = 192, kStepTokens = 512;
    KvCacheManager kv(8192, 16, 32, false);
    Scheduler s(
        {.max_num_seqs = 32, .max_batch_tokens = kStepTokens, .window_replay = 7, .max_mixed_prefill_tokens = kLimit},
        kv);
    std::mt19937 rng(5);
    std::map<uint64_t, int> first_token_step;  // request -> step of its first token
    std::map<uint64_t, int> arrival;
    std::set<uint64_t> decoding;  // requests with a first token, not finished
    uint64_t uid = 0;
    for (int step = 0; step < 3000 && (step < 400 || !s.idle()); ++step) {
        if (step < 400 && rng() % 3 == 0) {
            const int n_prompt = 1 + int(rng() % 700);
            ++uid;
            s.add_request(info(uid, n_prompt, 1 + int(rng() % 40), int(rng() % 3)),
                          std::vector<int32_t>(size_t(n_prompt), int32_t(uid % 50)), {SamplingParams{}});
            arrival[uid] = step;
        }
        const StepPlan p = s.schedule();
        if (p.empty()) continue;
        const int n_decodes = decode_chunks(p);
        EXPECT_EQ(n_decodes, int(decoding.size())) << "every decode, every step";
        EXPECT_LE(p.n_tokens(), kStepTokens);
        if (n_decodes > 0) {
            EXPECT_LE(prefill_tokens(p), kLimit) << "step " << step;
        }
        bool mid_prompt = false;  // a running prompt, or one admitted: prefill must have progressed
        for (const auto& c : p.chunks) {
            if (is_decode_chunk(c)) continue;
            mid_prompt = true;
            if (c.want_logits) {
                first_token_step.emplace(c.seq->request->uid, step);
            } else {
                // Whole tiles, or the step's last tokens when less than a tile is left.
                EXPECT_TRUE(c.n_tokens % kPrefillChunkAlign == 0 || c.n_tokens < kPrefillChunkAlign)
                    << "split chunk of " << c.n_tokens;
            }
        }
        if (s.n_waiting() > 0 && s.n_running() < 32) {
            EXPECT_TRUE(mid_prompt) << "step " << step;
        }
        for (const SeqOutput& o : commit_rows(s, p)) {
            if (o.event.kind == Event::Kind::finish)
                decoding.erase(o.stream->uid());
            else
                decoding.insert(o.stream->uid());
        }
    }
    EXPECT_TRUE(s.idle()) << "every request finished";
    EXPECT_EQ(first_token_step.size(), arrival.size());
    EXPECT_EQ(s.counters().n_preemptions, 0u);
}
