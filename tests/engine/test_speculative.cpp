// Speculative decoding on the fake runner: n-gram lookup, the acceptance rule's exactness (a
// chi-square test), greedy and seeded-sampling identity with and without speculation, never past
// max_new_tokens, stop tokens inside an accepted run, the forced-acceptance test modes, and the KV
// rollback under the randomised stress run (every invariant after every step; the fake runner
// fails on any ring or page row that does not hold the position it should).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "engine/engine.h"
#include "engine/speculative.h"
#include "engine_test_util.h"
#include "kernels/cpu/sampling.h"

using namespace osprey;
using namespace osprey::engine;
using osprey::test::FakeRunner;
using osprey::test::FakeRunnerOptions;

namespace {

std::vector<test::SampleOutcome> run_one(FakeRunner& runner, const EngineOptions& o, const Request& r,
                                         EngineStats* stats = nullptr) {
    Engine engine(runner, o);
    auto s = engine.submit(r);
    engine.run_until_idle();
    if (stats) *stats = engine.stats();
    std::vector<test::SampleOutcome> out;
    test::drain(*s, out);
    return out;
}

}  // namespace

TEST(speculative, ngram_lookup) {
    const std::vector<int32_t> t = {1, 2, 3, 4, 9, 1, 2, 3};
    EXPECT_EQ(ngram_propose(t, 1, 3, 3), (std::vector<int32_t>{4, 9, 1})) << "the 3-gram 1 2 3 matched";
    EXPECT_EQ(ngram_propose(t, 1, 3, 1), (std::vector<int32_t>{4}));
    const std::vector<int32_t> u = {5, 6, 7, 6};
    EXPECT_EQ(ngram_propose(u, 1, 4, 4), (std::vector<int32_t>{7, 6})) << "the latest earlier 6";
    EXPECT_TRUE(ngram_propose(u, 2, 4, 4).empty()) << "no 2-gram repeats";
    EXPECT_TRUE(ngram_propose(std::vector<int32_t>{3}, 1, 2, 4).empty());
    // The latest of several matches wins.
    const std::vector<int32_t> w = {8, 1, 8, 2, 8};
    EXPECT_EQ(ngram_propose(w, 1, 1, 2), (std::vector<int32_t>{2, 8}));
}

// The general rule (accept min(1, p/q), else draw from max(0, p - q) normalised) gives exactly p:
// 200 000 draws of (d ~ q, then accept_draft) against p by Pearson's chi-square. The 7 tokens with
// p > 0 give 6 degrees of freedom; P(chi2_6 > 22.46) = 0.001, so a correct rule would fail for one
// seed in a thousand (the seed is fixed: the test is deterministic), while an error of 1% of one
// token's mass moves the statistic by about (0.01 n)^2 / (p n) = 20 / p, i.e. 70 to 400 here. The
// token with p = 0 must never appear.
TEST(speculative, rejection_rule_is_exact) {
    const std::vector<float> p = {0.30f, 0.05f, 0.15f, 0.0f, 0.20f, 0.10f, 0.12f, 0.08f};
    const std::vector<float> q = {0.05f, 0.30f, 0.15f, 0.20f, 0.0f, 0.10f, 0.08f, 0.12f};
    std::mt19937_64 rng(12345);
    std::uniform_real_distribution<double> uni(0.0, 1.0);
    const int n = 200000;
    std::vector<int> count(p.size(), 0);
    int n_accepted = 0;
    for (int i = 0; i < n; ++i) {
        double c = 0.0, u = uni(rng);
        int32_t d = 0;
        for (size_t v = 0; v < q.size(); ++v)
            if ((c += q[v]) > u) {
                d = int32_t(v);
                break;
            }
        bool accepted = false;
        const int32_t t = accept_draft(p, q, d, uni(rng), uni(rng), &accepted);
        ++count[size_t(t)];
        n_accepted += accepted ? 1 : 0;
    }
    double chi2 = 0.0;
    int dof = -1;
    for (size_t v = 0; v < p.size(); ++v) {
        const double e = double(p[v]) * n;
        if (e == 0.0) {
            EXPECT_EQ(count[v], 0) << "token " << v << " has p = 0";
            continue;
        }
        chi2 += (count[v] - e) * (count[v] - e) / e;
        ++dof;
    }
    EXPECT_EQ(dof, 6);
    // P(chi2_6 > 22.46) = 0.001.
    EXPECT_LT(chi2, 22.46) << "the accepted/resampled tokens are not distributed as p";
    // Acceptance probability is sum_v min(p, q) = 1 - TV(p, q).
    double overlap = 0.0;
    for (size_t v = 0; v < p.size(); ++v) overlap += std::min(p[v], q[v]);
    EXPECT_NEAR(double(n_accepted) / n, overlap, 0.005);
    // One-hot q: accept iff the target's own draw equals d (what the engine does).
    std::vector<float> onehot(p.size(), 0.0f);
    onehot[4] = 1.0f;
    bool acc = false;
    EXPECT_EQ(accept_draft(p, onehot, 4, 0.1, 0.5, &acc), 4);  // u < p(4) = 0.2
    EXPECT_TRUE(acc);
    EXPECT_NE(accept_draft(p, onehot, 4, 0.3, 0.5, &acc), 4);
    EXPECT_FALSE(acc);
}

// Greedy output with every proposer configuration equals plain decoding, token for token, and the
// proposals are verified (some accepted, some rolled back).
TEST(speculative, greedy_identity_fake_model) {
    FakeRunnerOptions fo;
    fo.vocab_size = 64;  // small: n-gram lookups find matches
    fo.sliding_window = 8;
    for (int k : {1, 3, 5}) {
        Request r;
        r.id = "g";
        for (int i = 0; i < 40; ++i) r.prompt.push_back(i % 7);
        r.max_new_tokens = 37;
        r.sampling.temperature = 0;
        r.stop_token_ids = {63};
        EngineOptions o;
        o.page_size = 4;
        o.check_invariants = true;
        FakeRunner plain_runner(fo);
        const auto plain = run_one(plain_runner, o, r);
        for (bool oracle : {false, true}) {
            EngineOptions so = o;
            so.speculative.method = SpecMethod::ngram;
            so.speculative.num_tokens = k;
            if (oracle) so.speculative.custom = std::make_shared<test::OracleProposer>(fo.vocab_size, fo.sliding_window);
            FakeRunner runner(fo);
            EngineStats st;
            const auto spec = run_one(runner, so, r, &st);
            ASSERT_EQ(spec[0].tokens, plain[0].tokens) << "k " << k << " oracle " << oracle;
            EXPECT_EQ(spec[0].finish.reason, plain[0].finish.reason);
            EXPECT_EQ(spec[0].finish.usage.completion_tokens, plain[0].finish.usage.completion_tokens);
            EXPECT_GT(st.n_spec_verifies, 0u);
            if (oracle) {
                EXPECT_GT(st.n_spec_accepted_tokens, 0u);
                EXPECT_LT(runner.n_forward_calls(), plain_runner.n_forward_calls()) << "fewer steps";
            }
            EXPECT_EQ(st.n_free_pages + st.n_cached_pages, st.n_pages) << "rollback returned every page";
        }
    }
}

// Seeded sampling with penalties, bias and logprobs: the same tokens and log-probabilities as
// without speculation (each verify row draws with its own output index).
TEST(speculative, seeded_sampling_identity_fake_model) {
    FakeRunnerOptions fo;
    fo.vocab_size = 64;
    fo.sliding_window = 8;
    Request r;
    r.id = "s";
    for (int i = 0; i < 30; ++i) r.prompt.push_back((i * 5) % 11);
    r.max_new_tokens = 50;
    r.sampling.temperature = 0.8f;
    r.sampling.top_k = 20;
    r.sampling.top_p = 0.95f;
    r.sampling.presence_penalty = 0.3f;
    r.sampling.frequency_penalty = 0.2f;
    r.sampling.repetition_penalty = 1.1f;
    r.sampling.logit_bias = {{3, 2.0f}};
    r.sampling.seed = 99;
    r.sampling.logprobs = true;
    r.n = 2;
    EngineOptions o;
    o.page_size = 4;
    o.check_invariants = true;
    FakeRunner plain_runner(fo);
    Engine plain_engine(plain_runner, o);
    auto ps = plain_engine.submit(r);
    plain_engine.run_until_idle();
    const auto plain = test::collect(*ps);
    EngineOptions so = o;
    so.speculative.method = SpecMethod::ngram;
    so.speculative.num_tokens = 4;
    so.speculative.custom = std::make_shared<test::OracleProposer>(fo.vocab_size, fo.sliding_window);
    FakeRunner runner(fo);
    Engine engine(runner, so);
    auto ss = engine.submit(r);
    engine.run_until_idle();
    const auto spec = test::collect(*ss);
    for (int s = 0; s < 2; ++s) {
        EXPECT_EQ(spec[size_t(s)].tokens, plain[size_t(s)].tokens) << "sample " << s;
        EXPECT_EQ(spec[size_t(s)].logprobs, plain[size_t(s)].logprobs) << "sample " << s;
    }
    EXPECT_GT(engine.stats().n_spec_accepted_tokens, 0u);
}

// Every proposal accepted by the forced mode: never more than max_new_tokens, exact counts, and
// mean accepted length L + 1 per verify.
TEST(speculative, forced_acceptance_respects_max_tokens) {
    FakeRunnerOptions fo;
    fo.vocab_size = 64;
    fo.sliding_window = 8;
    for (int max_new : {1, 2, 5, 11, 24}) {
        Request r;
        r.id = "f";
        r.prompt = {1, 2, 3};
        r.max_new_tokens = max_new;
        r.sampling.temperature = 0;
        EngineOptions o;
        o.page_size = 4;
        o.check_invariants = true;
        o.speculative.method = SpecMethod::ngram;
        o.speculative.num_tokens = 4;
        o.speculative.forced_accept_len = 3;
        FakeRunner runner(fo);
        EngineStats st;
        const auto out = run_one(runner, o, r, &st);
        ASSERT_EQ(int(out[0].tokens.size()), max_new);
        EXPECT_EQ(out[0].finish.reason, FinishReason::length);
        EXPECT_EQ(out[0].finish.usage.completion_tokens, max_new);
        EXPECT_LE(st.n_spec_accepted_tokens, 3 * st.n_spec_verifies);
        if (max_new == 24) {
            // Every verify accepts 3, except the last ones, whose proposals shrink to fit max_new_tokens.
            EXPECT_GE(st.n_spec_accepted_tokens + 4, 3 * st.n_spec_verifies);
            EXPECT_LE(st.n_spec_verifies, 24u / 4 + 2);
        }
    }
    // The fraction mode accepts about that share of proposals.
    Request r;
    r.id = "frac";
    r.prompt = {1, 2, 3};
    r.max_new_tokens = 400;
    r.sampling.temperature = 0;
    EngineOptions o;
    o.page_size = 4;
    o.speculative.method = SpecMethod::ngram;
    o.speculative.num_tokens = 1;
    o.speculative.forced_accept_fraction = 0.5;
    FakeRunner runner(fo);
    EngineStats st;
    run_one(runner, o, r, &st);
    const double rate = double(st.n_spec_accepted_tokens) / double(st.n_spec_draft_tokens);
    EXPECT_NEAR(rate, 0.5, 0.1);
}

// A stop token inside an accepted run ends the sample there: nothing after it is streamed.
TEST(speculative, stop_token_inside_accepted_run) {
    FakeRunnerOptions fo;
    fo.vocab_size = 64;
    fo.sliding_window = 8;
    Request r;
    r.id = "stop";
    for (int i = 0; i < 12; ++i) r.prompt.push_back(i % 5);
    r.max_new_tokens = 30;
    r.sampling.temperature = 0;
    // Stop at the plain run's 7th token.
    EngineOptions o;
    o.page_size = 4;
    FakeRunner plain_runner(fo);
    const auto plain = run_one(plain_runner, o, r);
    ASSERT_GE(plain[0].tokens.size(), 8u);
    r.stop_token_ids = {plain[0].tokens[6]};
    const int first = int(std::find(plain[0].tokens.begin(), plain[0].tokens.end(), r.stop_token_ids[0]) -
                          plain[0].tokens.begin());
    EngineOptions so = o;
    so.check_invariants = true;
    so.speculative.method = SpecMethod::ngram;
    so.speculative.num_tokens = 5;
    so.speculative.custom = std::make_shared<test::OracleProposer>(fo.vocab_size, fo.sliding_window);
    FakeRunner runner(fo);
    const auto spec = run_one(runner, so, r);
    EXPECT_EQ(spec[0].tokens, std::vector<int32_t>(plain[0].tokens.begin(), plain[0].tokens.begin() + first));
    EXPECT_EQ(spec[0].finish.reason, FinishReason::stop);
    EXPECT_EQ(spec[0].finish.stop_token, r.stop_token_ids[0]);
    EXPECT_EQ(spec[0].finish.usage.completion_tokens, first + 1);
}

// n-gram back-off: a lookup whose proposals the target keeps refusing pauses (1, 2, 4, ... 64
// tokens after two misses in a row), so a long generation pays a handful of wasted verifies, not one
// per token; the output is still plain decoding's.
TEST(speculative, ngram_backs_off_when_nothing_is_accepted) {
    FakeRunnerOptions fo;
    fo.vocab_size = 64;
    fo.sliding_window = 8;
    Request r;
    r.id = "b";
    for (int i = 0; i < 40; ++i) r.prompt.push_back(i % 7);
    r.max_new_tokens = 300;
    r.sampling.temperature = 0;
    EngineOptions o;
    o.page_size = 4;
    o.check_invariants = true;
    FakeRunner plain_runner(fo);
    const auto plain = run_one(plain_runner, o, r);
    EngineOptions so = o;
    so.speculative.method = SpecMethod::ngram;
    so.speculative.num_tokens = 4;
    FakeRunner runner(fo);
    EngineStats st;
    const auto spec = run_one(runner, so, r, &st);
    ASSERT_EQ(spec[0].tokens, plain[0].tokens);
    ASSERT_GT(st.n_spec_verifies, 0u);
    // Each verify that accepts nothing emits one token; with the back-off the misses are bounded by
    // ~2 + log2 of the output per run of misses, and runs are separated by accepted proposals.
    const uint64_t wasted = st.n_spec_verifies - std::min<uint64_t>(st.n_spec_verifies, st.n_spec_accepted_tokens);
    EXPECT_LT(wasted, uint64_t(r.max_new_tokens) / 4) << st.n_spec_verifies << " verifies, "
                                                     << st.n_spec_accepted_tokens << " accepted";
    std::printf("ngram back-off: %llu verifies, %llu proposed, %llu accepted over %d tokens\n",
                (unsigned long long)st.n_spec_verifies, (unsigned long long)st.n_spec_draft_tokens,
                (unsigned long long)st.n_spec_accepted_tokens, r.max_new_tokens);
}

// The adaptive policy's numbers (speculative.h, SpecPolicy): break-even yields from the cost model,
// closing after a batch-64 step whose proposals are all refused, the probe allowance holding probes
// to epsilon of the step time, and reopening when acceptance returns.
TEST(speculative, policy_closes_probes_and_reopens) {
    SpecPolicy p(/*verify_token_cost=*/0.1, /*probe_share=*/0.01);
    EXPECT_NEAR(p.break_even(1), 0.1 / 1.1, 1e-12);
    EXPECT_NEAR(p.break_even(64), 6.4 / 7.4, 1e-12);
    EXPECT_DOUBLE_EQ(p.yield(), 1.0) << "optimistic before any verify";
    EXPECT_EQ(p.step_budget(64, 4), INT_MAX) << "a new engine proposes for every sequence";
    p.spend(256);
    p.observe(256, 0);  // all 64 x 4 refused
    EXPECT_LT(p.yield(), 0.01);
    EXPECT_FALSE(p.pays(1));
    EXPECT_FALSE(p.pays(64));
    // Probing at batch 64 for 1000 steps: whole 4-token probes whenever the allowance holds one.
    int probe_tokens = 0;
    for (int step = 0; step < 1000; ++step) {
        const int budget = p.step_budget(64, 4);
        ASSERT_LT(budget, INT_MAX);
        const int n = budget >= 4 ? 4 : 0;
        p.spend(n);
        p.observe(n, 0);
        probe_tokens += n;
    }
    // epsilon (1 + B r) / r = 0.74 tokens per step; their cost n r / (1 + B r) per step is 1%.
    EXPECT_NEAR(probe_tokens / 1000.0, 0.74, 0.01);
    EXPECT_LE(probe_tokens * 0.1 / 7.4 / 1000.0, 0.0101);
    // At batch 1 the allowance grows by 0.11 tokens a step: a 4-token probe every ~36 steps.
    SpecPolicy q(0.1, 0.01);
    q.observe(64, 0);
    int first = -1;
    for (int step = 0; step < 100 && first < 0; ++step)
        if (q.step_budget(1, 4) >= 4) first = step;
    EXPECT_EQ(first, 36);
    // Acceptance returns: every probe accepted in full. Batch 8 reopens first (break-even 0.44),
    // batch 64 needs a yield above 0.865.
    int reopened8 = -1, reopened64 = -1;
    for (int v = 0; v < 200; ++v) {
        p.observe(4, 4);
        if (reopened8 < 0 && p.pays(8)) reopened8 = v;
        if (reopened64 < 0 && p.pays(64)) reopened64 = v;
    }
    EXPECT_GE(reopened8, 0);
    EXPECT_GT(reopened64, reopened8);
    EXPECT_EQ(p.step_budget(64, 4), INT_MAX);
    // Half of every proposal accepted (yield 0.5): pays at batch 8, not at 64.
    for (int v = 0; v < 200; ++v) p.observe(4, 2);
    EXPECT_NEAR(p.yield(), 0.5, 0.01);
    EXPECT_TRUE(p.pays(8));
    EXPECT_FALSE(p.pays(64));
}

// The back-off's pauses: about 2^(misses - 2) tokens (capped at 64), jittered per sequence so that
// sequences which miss together probe on different steps.
TEST(speculative, backoff_pauses_are_staggered) {
    for (int misses = 2; misses < 12; ++misses) {
        const int p = 1 << std::min(misses - 2, 6);
        std::vector<int> seen(size_t(2 * p), 0);
        for (uint64_t uid = 1; uid <= 256; ++uid) {
            const int pause = spec_backoff_pause(uid, misses);
            ASSERT_GE(pause, p - p / 2) << "misses " << misses;
            ASSERT_LT(pause, p + (p + 1) / 2) << "misses " << misses;
            ++seen[size_t(pause)];
            EXPECT_EQ(pause, spec_backoff_pause(uid, misses)) << "deterministic";
        }
        // 256 sequences over p distinct pauses: none holds more than ~3x its share.
        if (p >= 8) {
            for (int v = p - p / 2; v < p + p / 2; ++v) EXPECT_LE(seen[size_t(v)], 3 * 256 / p) << "pause " << v;
        }
    }
}

namespace {

// Proposes tokens the fake model's greedy decoding never takes first (its greedy token plus one),
// so every verify accepts nothing: the no-acceptance cost.
class WrongProposer : public Proposer {
public:
    WrongProposer(int vocab, int window) : vocab_(vocab), window_(window) {}
    std::string name() const override { return "wrong"; }
    void propose(std::span<DraftRequest> requests) override {
        for (DraftRequest& r : requests) {
            const std::vector<int32_t> history(r.tokens.begin(), r.tokens.end());
            const auto l = FakeRunner::reference_logits(history, vocab_, window_);
            const int32_t t = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
            r.out->assign(size_t(r.max_tokens), (t + 1) % vocab_);
        }
    }

private:
    int vocab_, window_;
};

struct BatchRun {
    std::vector<std::vector<int32_t>> tokens;
    EngineStats stats;
    int steps = 0;
};

BatchRun run_batch(const FakeRunnerOptions& fo, EngineOptions o, int batch, int max_new) {
    FakeRunner runner(fo);
    o.page_size = 4;
    o.max_num_seqs = batch;
    o.max_batch_tokens = batch * 8;
    o.enable_prefix_caching = false;
    Engine engine(runner, o);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < batch; ++i) {
        Request r;
        r.id = std::to_string(i);
        for (int j = 0; j < 12; ++j) r.prompt.push_back((i * 13 + j * 5) % fo.vocab_size);
        r.max_new_tokens = max_new;
        r.sampling.temperature = 0;
        streams.push_back(engine.submit(r));
    }
    BatchRun out;
    while (engine.step()) ++out.steps;
    out.stats = engine.stats();
    for (auto& s : streams) {
        std::vector<test::SampleOutcome> o2;
        test::drain(*s, o2);
        out.tokens.push_back(o2[0].tokens);
    }
    return out;
}

}  // namespace

// Batch 64, every proposal refused: the adaptive policy stops proposing after the first verify step
// and probes within its allowance (~0.74 tokens a step at batch 64), where proposing on every step
// would carry 4 wasted tokens per sequence; the output is plain decoding's either way. The forced
// test mode still proposes (and verifies) on every step.
TEST(speculative, adaptive_policy_limits_wasted_verifies_at_batch_64) {
    FakeRunnerOptions fo;
    fo.vocab_size = 64;
    fo.sliding_window = 8;
    fo.kv_budget_bytes = size_t(64) << 20;
    const int batch = 64, max_new = 100;
    EngineOptions plain_o;
    const BatchRun plain = run_batch(fo, plain_o, batch, max_new);
    EngineOptions o;
    o.check_invariants = true;
    o.speculative.method = SpecMethod::ngram;
    o.speculative.num_tokens = 4;
    o.speculative.custom = std::make_shared<WrongProposer>(fo.vocab_size, fo.sliding_window);
    const BatchRun adaptive = run_batch(fo, o, batch, max_new);
    EXPECT_EQ(adaptive.tokens, plain.tokens);
    EXPECT_EQ(adaptive.stats.n_spec_accepted_tokens, 0u);
    // One full step of proposals (the optimistic start), then the allowance.
    EXPECT_LE(adaptive.stats.n_spec_draft_tokens, uint64_t(batch * 4 + 0.75 * adaptive.steps + 8))
        << adaptive.steps << " steps";
    EXPECT_GT(adaptive.stats.n_spec_draft_tokens, 0u) << "it did try";

    EngineOptions always = o;
    always.speculative.adaptive = false;
    const BatchRun every = run_batch(fo, always, batch, max_new);
    EXPECT_EQ(every.tokens, plain.tokens);
    EXPECT_GT(every.stats.n_spec_draft_tokens, uint64_t(batch) * (max_new - 2) * 3) << "a proposal every step";
    std::printf("batch 64, nothing accepted, %d steps: %llu verify tokens adaptive, %llu always\n", adaptive.steps,
                (unsigned long long)adaptive.stats.n_spec_draft_tokens, (unsigned long long)every.stats.n_spec_draft_tokens);

    EngineOptions forced = o;
    forced.speculative.forced_accept_len = 0;  // the test mode: proposes every step whatever the policy
    const BatchRun f = run_batch(fo, forced, batch, max_new);
    EXPECT_GE(f.stats.n_spec_verifies, uint64_t(batch) * (max_new - 5)) << "a verify on every decode step";
}
