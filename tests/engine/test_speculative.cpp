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
