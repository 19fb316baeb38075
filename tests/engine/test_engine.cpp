// The engine on the fake runner: outputs equal the greedy oracle and the solo runs whatever the
// batch (chunked prefill, prefix hits, preemption), stop/length/abort, n > 1, the request API.
#include <gtest/gtest.h>
#include <poll.h>

#include <random>
#include <thread>

#include "core/check.h"
#include "engine/engine.h"
#include "engine_test_util.h"

using namespace osprey;
using namespace osprey::engine;
using osprey::test::FakeRunner;
using osprey::test::FakeRunnerOptions;

namespace {

std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int vocab) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(rng() % uint32_t(vocab - 1));  // the last id is the stop token
    return t;
}

Request greedy_request(std::vector<int32_t> prompt, int max_new, std::vector<int32_t> stops = {}) {
    Request r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0;
    r.max_new_tokens = max_new;
    r.stop_token_ids = std::move(stops);
    return r;
}

EngineOptions small_options() {
    EngineOptions o;
    o.page_size = 8;
    o.max_num_seqs = 8;
    o.max_batch_tokens = 64;
    o.check_invariants = true;
    return o;
}

}  // namespace

TEST(engine, greedy_matches_the_oracle) {
    FakeRunner runner;
    Engine engine(runner, small_options());
    std::mt19937 rng(1);
    const auto prompt = random_tokens(rng, 300, 384);  // > sliding window, several chunks
    auto s = engine.submit(greedy_request(prompt, 40));
    engine.run_until_idle();
    const auto out = test::collect(*s);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].tokens, test::greedy_oracle(prompt, 40, {}, 384, 128));
    EXPECT_EQ(out[0].finish.reason, FinishReason::length);
    EXPECT_EQ(out[0].finish.usage.prompt_tokens, 300);
    EXPECT_EQ(out[0].finish.usage.completion_tokens, 40);
    EXPECT_GT(runner.n_forward_calls(), 40) << "the prompt was chunked";
    EXPECT_LE(runner.max_batch_seen(), 64);
}

TEST(engine, stop_token_ends_the_sample_and_is_reported) {
    FakeRunner runner;
    Engine engine(runner, small_options());
    std::mt19937 rng(2);
    const auto prompt = random_tokens(rng, 20, 384);
    const auto free_run = test::greedy_oracle(prompt, 30, {}, 384, 128);
    const int32_t stop = free_run[10];
    const auto first = std::find(free_run.begin(), free_run.end(), stop) - free_run.begin();
    auto s = engine.submit(greedy_request(prompt, 30, {stop}));
    engine.run_until_idle();
    const auto out = test::collect(*s);
    EXPECT_EQ(out[0].tokens, std::vector<int32_t>(free_run.begin(), free_run.begin() + first));
    EXPECT_EQ(out[0].finish.reason, FinishReason::stop);
    EXPECT_EQ(out[0].finish.stop_token, stop);
    EXPECT_EQ(out[0].finish.usage.completion_tokens, int(first) + 1) << "the stop token counts";
}

TEST(engine, bad_requests_are_refused_with_a_clear_error) {
    FakeRunner runner;
    EngineOptions o = small_options();
    o.max_model_len = 100;
    Engine engine(runner, o);
    auto expect_error = [&](Request r, const std::string& words) {
        try {
            engine.submit(std::move(r));
            ADD_FAILURE() << "accepted a request that should fail with: " << words;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
        }
    };
    expect_error(greedy_request({}, 5), "prompt is empty");
    expect_error(greedy_request({1, 384}, 5), "outside the vocabulary");
    expect_error(greedy_request({1, -1}, 5), "outside the vocabulary");
    expect_error(greedy_request(std::vector<int32_t>(90, 1), 11), "exceeds max_model_len 100");
    expect_error(greedy_request(std::vector<int32_t>(101, 1), 1), "exceeds max_model_len");
    expect_error(greedy_request({1}, 0), "max_new_tokens");
    Request r = greedy_request({1}, 5);
    r.sampling.top_p = 0;
    expect_error(r, "top_p");
    r = greedy_request({1}, 5);
    r.sampling.temperature = -1;
    expect_error(r, "temperature");
    r = greedy_request({1}, 5);
    r.sampling.logit_bias = {{999, 1.0f}};
    expect_error(r, "logit_bias");
    r = greedy_request({1}, 5);
    r.n = 0;
    expect_error(r, "n must be");
    r = greedy_request({1}, 5);
    r.sampling.top_logprobs = 21;
    expect_error(r, "top_logprobs");
    r = greedy_request({1}, 5);
    r.stop_token_ids = {400};
    expect_error(r, "stop token");
    // 90 + 10 fits exactly.
    auto s = engine.submit(greedy_request(std::vector<int32_t>(90, 1), 10));
    engine.run_until_idle();
    EXPECT_EQ(test::collect(*s)[0].tokens.size(), 10u);
}

TEST(engine, max_model_len_is_capped_by_the_cache) {
    FakeRunner runner;
    EngineOptions o = small_options();
    o.max_kv_tokens = 256;
    Engine engine(runner, o);
    EXPECT_EQ(engine.max_model_len(), 256);
    EXPECT_THROW(engine.submit(greedy_request(std::vector<int32_t>(250, 1), 10)), Error);
}

// The central property: every request's tokens are those it gets alone, however it was batched,
// chunked, prefix-shared or preempted.
TEST(engine, batch_invariance_with_chunks_prefix_hits_and_preemption) {
    std::mt19937 rng(3);
    const int vocab = 384;
    const auto common = random_tokens(rng, 150, vocab);  // shared system prompt
    std::vector<Request> requests;
    for (int i = 0; i < 24; ++i) {
        std::vector<int32_t> p;
        if (i % 3 != 2) p = common;
        const auto tail = random_tokens(rng, 1 + int(rng() % 200), vocab);
        p.insert(p.end(), tail.begin(), tail.end());
        Request r = greedy_request(p, 5 + int(rng() % 60), {vocab - 1});
        r.priority = i % 4 == 0 ? 1 : 0;
        if (i % 5 == 0) {  // seeded sampling must be batch-invariant too
            r.sampling.temperature = 0.9f;
            r.sampling.top_p = 0.95f;
            r.sampling.seed = uint64_t(i);
        }
        requests.push_back(r);
    }
    // Solo runs on a roomy engine.
    std::vector<std::vector<int32_t>> solo;
    for (const Request& r : requests) {
        FakeRunner runner;
        EngineOptions o = small_options();
        o.max_batch_tokens = 1024;
        Engine engine(runner, o);
        auto s = engine.submit(r);
        engine.run_until_idle();
        solo.push_back(test::collect(*s)[0].tokens);
        if (r.sampling.is_greedy()) {
            EXPECT_EQ(solo.back(), test::greedy_oracle(r.prompt, r.max_new_tokens, r.stop_token_ids, vocab, 128));
        }
    }
    // All at once, staggered, on a tight engine: small budget (chunks), few pages (preemption).
    FakeRunner runner;
    EngineOptions o = small_options();
    o.max_batch_tokens = 48;
    o.max_kv_tokens = 8 * 90;  // 90 pages for 24 requests of up to ~410 tokens
    Engine engine(runner, o);
    std::vector<std::shared_ptr<RequestStream>> streams;
    std::vector<std::vector<test::SampleOutcome>> got(requests.size());
    size_t next = 0;
    for (int step = 0; next < requests.size() || engine.step(); ++step) {
        if (next < requests.size() && step % 3 == 0) streams.push_back(engine.submit(requests[next++]));
        for (size_t i = 0; i < streams.size(); ++i) test::drain(*streams[i], got[i]);
    }
    for (size_t i = 0; i < streams.size(); ++i) test::drain(*streams[i], got[i]);
    for (size_t i = 0; i < requests.size(); ++i) {
        ASSERT_TRUE(got[i][0].finished) << "request " << i;
        EXPECT_EQ(got[i][0].tokens, solo[i]) << "request " << i;
        EXPECT_NE(got[i][0].finish.reason, FinishReason::error) << got[i][0].finish.error;
    }
    const EngineStats st = engine.stats();
    EXPECT_GT(st.n_preemptions, 0u) << "the test must exercise preemption";
    EXPECT_GT(st.n_prefix_hit_tokens, 0u) << "the test must exercise prefix hits";
    EXPECT_GT(runner.n_window_only_tokens(), 0) << "prefix hits replay the window";
    EXPECT_EQ(st.n_running + st.n_waiting, 0);
    EXPECT_EQ(st.n_free_pages + st.n_cached_pages, st.n_pages) << "every page is back";
}

TEST(engine, prefix_hit_skips_prefill_and_reports_cached_tokens) {
    FakeRunner runner;
    EngineOptions o = small_options();
    o.max_batch_tokens = 4096;
    Engine engine(runner, o);
    std::mt19937 rng(4);
    const auto prompt = random_tokens(rng, 400, 384);
    auto a = engine.submit(greedy_request(prompt, 3));
    engine.run_until_idle();
    const int64_t tokens_first = runner.n_tokens_run();
    auto b = engine.submit(greedy_request(prompt, 3));
    engine.run_until_idle();
    const auto oa = test::collect(*a), ob = test::collect(*b);
    EXPECT_EQ(oa[0].tokens, ob[0].tokens);
    EXPECT_EQ(oa[0].finish.usage.cached_tokens, 0);
    EXPECT_EQ(ob[0].finish.usage.cached_tokens, 392) << "49 full pages of 8; the last token is recomputed";
    // Second run: 2 sliding layers x 127 replayed + 8 recomputed + 2 decodes.
    EXPECT_EQ(runner.n_tokens_run() - tokens_first, 254 + 8 + 2);
}

TEST(engine, later_prefix_hits_restore_the_saved_window_ring_instead_of_replaying) {
    FakeRunner runner;
    EngineOptions o = small_options();
    o.max_batch_tokens = 4096;
    Engine engine(runner, o);
    std::mt19937 rng(6);
    const auto prefix = random_tokens(rng, 400, 384);  // 50 pages of 8
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 4; ++i) {
        std::vector<int32_t> p = prefix;
        const auto tail = random_tokens(rng, 5 + i, 384);
        p.insert(p.end(), tail.begin(), tail.end());
        prompts.push_back(p);
    }
    std::vector<int64_t> run, window_only;
    for (const auto& p : prompts) {
        const int64_t t0 = runner.n_tokens_run(), w0 = runner.n_window_only_tokens();
        auto s = engine.submit(greedy_request(p, 3));
        engine.run_until_idle();
        EXPECT_EQ(test::collect(*s)[0].tokens, test::greedy_oracle(p, 3, {}, 384, 128)) << "prompt " << run.size();
        run.push_back(runner.n_tokens_run() - t0);
        window_only.push_back(runner.n_window_only_tokens() - w0);
    }
    // 1st: the whole prompt. 2nd: hits the 50 shared pages, replays 2 x 127 window-only tokens, then
    // saves the rebuilt ring. 3rd and 4th: copy the saved ring, so they compute only their tails.
    EXPECT_EQ(run[0], 405 + 2);
    EXPECT_EQ(window_only[1], 254);
    EXPECT_EQ(run[1], 254 + 6 + 2);
    EXPECT_EQ(window_only[2], 0);
    EXPECT_EQ(run[2], 7 + 2);
    EXPECT_EQ(run[3], 8 + 2);
    EXPECT_EQ(engine.stats().n_window_restores, 2u);
}

TEST(engine, n_samples_share_the_prompt_and_draw_independently) {
    FakeRunner runner;
    EngineOptions o = small_options();
    o.max_batch_tokens = 512;
    Engine engine(runner, o);
    std::mt19937 rng(5);
    Request r;
    r.prompt = random_tokens(rng, 200, 384);
    r.n = 4;
    r.max_new_tokens = 20;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 99;
    auto s = engine.submit(r);
    engine.run_until_idle();
    const auto out = test::collect(*s);
    ASSERT_EQ(out.size(), 4u);
    for (const auto& o2 : out) EXPECT_EQ(o2.tokens.size(), 20u);
    EXPECT_NE(out[0].tokens, out[1].tokens);
    EXPECT_NE(out[1].tokens, out[2].tokens);
    // Samples 1-3 fork from sample 0 once it has computed 199 of the 200 prompt positions: each
    // computes only the last prompt token. Tokens run: 200 (sample 0's prompt) + 3 (the forks' last
    // prompt token) + 4 x 19 decodes, and nothing is replayed.
    for (int i = 1; i < 4; ++i) EXPECT_EQ(out[size_t(i)].finish.usage.cached_tokens, 199);
    EXPECT_EQ(runner.n_tokens_run(), 200 + 3 + 4 * 19);
    EXPECT_EQ(runner.n_window_only_tokens(), 0);
    EXPECT_EQ(engine.stats().n_forked_tokens, 3u * 199u);
    // Sample 0 is the request with its own seed, alone.
    FakeRunner solo_runner;
    Engine solo(solo_runner, o);
    r.n = 1;
    auto s1 = solo.submit(r);
    solo.run_until_idle();
    EXPECT_EQ(test::collect(*s1)[0].tokens, out[0].tokens);
}

TEST(engine, logprobs_are_streamed_when_asked) {
    FakeRunner runner;
    Engine engine(runner, small_options());
    Request r = greedy_request({1, 2, 3}, 4);
    r.sampling.logprobs = true;
    r.sampling.top_logprobs = 3;
    auto s = engine.submit(r);
    engine.run_until_idle();
    int n = 0;
    while (auto e = s->try_pop()) {
        if (e->kind != Event::Kind::token) continue;
        ++n;
        ASSERT_EQ(e->top.size(), 3u);
        EXPECT_EQ(e->top[0].first, e->token) << "greedy picks the most likely";
        EXPECT_FLOAT_EQ(e->top[0].second, e->logprob);
        EXPECT_LT(e->logprob, 0.0f);
    }
    EXPECT_EQ(n, 4);
}

TEST(engine, cancel_ends_with_abort_and_frees_everything) {
    FakeRunner runner;
    Engine engine(runner, small_options());
    auto a = engine.submit(greedy_request(std::vector<int32_t>(50, 3), 100));
    Request rb = greedy_request(std::vector<int32_t>(60, 4), 100);
    rb.id = "b";
    rb.n = 2;
    auto b = engine.submit(rb);
    for (int i = 0; i < 10; ++i) engine.step();
    a->cancel();
    EXPECT_TRUE(engine.cancel("b"));
    EXPECT_FALSE(engine.cancel("nobody"));
    engine.step();
    const auto oa = test::collect(*a), ob = test::collect(*b);
    EXPECT_EQ(oa[0].finish.reason, FinishReason::abort);
    EXPECT_EQ(ob[0].finish.reason, FinishReason::abort);
    EXPECT_EQ(ob[1].finish.reason, FinishReason::abort);
    EXPECT_GT(oa[0].tokens.size(), 0u);
    EXPECT_FALSE(engine.step()) << "nothing left";
    const EngineStats st = engine.stats();
    EXPECT_EQ(st.n_free_pages + st.n_cached_pages, st.n_pages);
    a->cancel();  // after the end: no effect
}

TEST(engine, backend_failure_ends_requests_with_error_and_engine_recovers) {
    FakeRunner runner;
    Engine engine(runner, small_options());
    auto a = engine.submit(greedy_request({1, 2, 3}, 10));
    engine.step();
    runner.fail_next_forward = true;
    engine.step();
    const auto oa = test::collect(*a);
    EXPECT_EQ(oa[0].finish.reason, FinishReason::error);
    EXPECT_NE(oa[0].finish.error.find("injected failure"), std::string::npos);
    auto b = engine.submit(greedy_request({1, 2, 3}, 10));
    engine.run_until_idle();
    EXPECT_EQ(test::collect(*b)[0].tokens, test::greedy_oracle({1, 2, 3}, 10, {}, 384, 128));
}

TEST(engine, threaded_engine_serves_many_clients) {
    FakeRunner runner;
    EngineOptions o = small_options();
    o.check_invariants = true;
    Engine engine(runner, o);
    engine.start();
    std::atomic<int> mismatches{0};
    std::vector<std::thread> clients;
    for (int c = 0; c < 4; ++c) {
        clients.emplace_back([&, c] {
            std::mt19937 rng(uint32_t(100 + c));
            for (int i = 0; i < 6; ++i) {
                const auto prompt = random_tokens(rng, 1 + int(rng() % 100), 384);
                auto s = engine.submit(greedy_request(prompt, 12));
                if (i == 5 && c == 0) {  // one client uses the eventfd
                    const int fd = s->notify_fd();
                    int seen = 0;
                    while (!s->done()) {
                        pollfd p{fd, POLLIN, 0};
                        ::poll(&p, 1, 1000);
                        while (auto e = s->try_pop()) seen += e->kind == Event::Kind::token;
                    }
                    if (seen != 12) ++mismatches;
                    continue;
                }
                const auto out = test::collect(*s);
                if (out[0].tokens != test::greedy_oracle(prompt, 12, {}, 384, 128)) ++mismatches;
            }
        });
    }
    for (auto& t : clients) t.join();
    EXPECT_EQ(mismatches.load(), 0);
    // A request cancelled from another thread while it runs.
    auto s = engine.submit(greedy_request({5, 6, 7}, 2000 - 3));
    while (s->pop().kind != Event::Kind::token) {
    }
    std::thread([&] { s->cancel(); }).join();
    const auto out = test::collect(*s);
    EXPECT_EQ(out[0].finish.reason, FinishReason::abort);
    engine.stop();
}

TEST(engine, destruction_aborts_unfinished_requests) {
    FakeRunner runner;
    std::shared_ptr<RequestStream> s;
    {
        Engine engine(runner, small_options());
        s = engine.submit(greedy_request({1, 2}, 50));
        engine.step();
    }
    const auto out = test::collect(*s);
    EXPECT_EQ(out[0].finish.reason, FinishReason::abort);
    s->cancel();  // the engine is gone: must not crash
}

TEST(engine, kv_plan_reports_window_savings) {
    FakeRunnerOptions fo;
    fo.kv_budget_bytes = size_t(64) << 20;
    FakeRunner runner(fo);
    EngineOptions o;
    o.page_size = 16;
    o.max_num_seqs = 32;
    o.kv_memory_fraction = 0.5;
    const KvPlan plan = plan_kv_cache(runner, o);
    // 32 MiB: 32 running + 16 snapshot slots of 128 rows x 64 B = 384 KiB, the rest in pages of 16 x 64 B.
    EXPECT_EQ(plan.layout.n_window_slots, 32 + 16);
    EXPECT_EQ(plan.n_snapshot_slots, 16);
    EXPECT_EQ(plan.layout.n_pages, int(((size_t(32) << 20) - 48 * 128 * 64) / (16 * 64)));
    EXPECT_GT(plan.window_saved_bytes, 0);
    o.enable_prefix_caching = false;  // no saved rings without the prefix cache
    EXPECT_EQ(plan_kv_cache(runner, o).layout.n_window_slots, 32);
    o.enable_prefix_caching = true;
    o.window_snapshots = -1;
    EXPECT_THROW(plan_kv_cache(runner, o), Error);
    o.window_snapshots = 16;
    o.max_num_seqs = 1 << 20;
    EXPECT_THROW(plan_kv_cache(runner, o), Error);
    o.max_num_seqs = 4;
    o.kv_memory_fraction = 1.5;
    EXPECT_THROW(plan_kv_cache(runner, o), Error);
}

TEST(engine, queue_limit_refuses_requests_clearly) {
    FakeRunner runner;
    EngineOptions o = small_options();
    o.max_queued_requests = 2;
    Engine engine(runner, o);
    auto a = engine.submit(greedy_request({1}, 3));
    auto b = engine.submit(greedy_request({2}, 3));
    try {
        engine.submit(greedy_request({3}, 3));
        ADD_FAILURE() << "a third request was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("at capacity"), std::string::npos) << e.what();
    }
    engine.run_until_idle();
    EXPECT_TRUE(a->finished() && b->finished());
    auto c = engine.submit(greedy_request({3}, 3));  // room again
    engine.run_until_idle();
    EXPECT_EQ(test::collect(*c)[0].tokens.size(), 3u);
}

TEST(engine, callbacks_run_per_event_and_stop_once_cleared) {
    FakeRunner runner;
    Engine engine(runner, small_options());
    auto s = engine.submit(greedy_request({1, 2, 3}, 5));
    int calls = 0;
    s->set_callback([&] { ++calls; });
    engine.step();
    engine.step();
    EXPECT_EQ(calls, 2);
    s->set_callback({});
    engine.run_until_idle();
    EXPECT_EQ(calls, 2);
    EXPECT_EQ(test::collect(*s)[0].tokens.size(), 5u);
}
