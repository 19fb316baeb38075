// The CPU sampler: one test per parameter, exact where the outcome is determined, statistical with
// fixed seeds and generous bounds where it is random.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "core/check.h"
#include "kernels/cpu/sampling.h"

using namespace osprey;

namespace {

SampleResult draw(const std::vector<float>& logits, const SamplingParams& p, uint64_t step = 0,
                  const std::vector<int32_t>& prompt = {}, const std::vector<int32_t>& output = {}) {
    SamplingState s;
    s.prompt_tokens = prompt.data();
    s.n_prompt_tokens = int32_t(prompt.size());
    s.output_tokens = output.data();
    s.n_output_tokens = int32_t(output.size());
    s.step = step;
    SampleResult r;
    cpu::sample_row(logits, p, s, r);
    return r;
}

// Frequencies of tokens over `n` draws with steps 0..n-1.
std::map<int32_t, int> histogram(const std::vector<float>& logits, SamplingParams p, int n) {
    std::map<int32_t, int> h;
    for (int i = 0; i < n; ++i) ++h[draw(logits, p, uint64_t(i)).token];
    return h;
}

std::vector<float> softmax(const std::vector<float>& x, float t = 1.0f) {
    double m = -1e30, z = 0;
    for (float v : x) m = std::max(m, double(v));
    std::vector<float> p(x.size());
    for (size_t i = 0; i < x.size(); ++i) z += std::exp((x[i] - m) / t);
    for (size_t i = 0; i < x.size(); ++i) p[i] = float(std::exp((x[i] - m) / t) / z);
    return p;
}

const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 0.5f, 2.9f, -1.0f, 0.0f, 1.5f};

}  // namespace

TEST(sampling, uniform_depends_only_on_seed_and_step) {
    EXPECT_EQ(cpu::sample_uniform(1, 2), cpu::sample_uniform(1, 2));
    EXPECT_NE(cpu::sample_uniform(1, 2), cpu::sample_uniform(1, 3));
    EXPECT_NE(cpu::sample_uniform(1, 2), cpu::sample_uniform(2, 2));
    double mean = 0;
    for (int i = 0; i < 10000; ++i) {
        const double u = cpu::sample_uniform(42, uint64_t(i));
        ASSERT_GE(u, 0.0);
        ASSERT_LT(u, 1.0);
        mean += u / 10000;
    }
    EXPECT_NEAR(mean, 0.5, 0.02);
}

TEST(sampling, greedy_is_argmax_with_lowest_id_on_ties) {
    SamplingParams p;
    p.temperature = 0;
    EXPECT_EQ(draw(kLogits, p).token, 1);
    EXPECT_EQ(draw({1.0f, 2.0f, 2.0f}, p).token, 1);
    p.logprobs = true;
    const auto r = draw(kLogits, p);
    EXPECT_NEAR(r.logprob, std::log(softmax(kLogits)[1]), 1e-5);
}

TEST(sampling, temperature_matches_softmax_frequencies) {
    SamplingParams p;
    p.seed = 7;
    for (float t : {1.0f, 0.5f, 2.0f}) {
        p.temperature = t;
        const int n = 20000;
        const auto h = histogram(kLogits, p, n);
        const auto prob = softmax(kLogits, t);
        for (size_t i = 0; i < kLogits.size(); ++i) {
            const double expected = prob[i] * n;
            const double sd = std::sqrt(expected * (1 - prob[i])) + 1;
            const int got = h.count(int32_t(i)) ? h.at(int32_t(i)) : 0;
            EXPECT_NEAR(got, expected, 5 * sd) << "token " << i << " at temperature " << t;
        }
    }
}

TEST(sampling, low_temperature_approaches_greedy) {
    SamplingParams p;
    p.temperature = 0.01f;
    const auto h = histogram(kLogits, p, 500);
    EXPECT_EQ(h.size(), 1u);
    EXPECT_EQ(h.begin()->first, 1);
}

TEST(sampling, top_k_keeps_exactly_the_k_best) {
    SamplingParams p;
    p.top_k = 3;
    const auto h = histogram(kLogits, p, 3000);
    EXPECT_EQ(std::set<int32_t>({1, 2, 4}), [&] {
        std::set<int32_t> s;
        for (auto& [t, c] : h) s.insert(t);
        return s;
    }());
    p.top_k = 1;
    EXPECT_EQ(histogram(kLogits, p, 200).size(), 1u);
}

TEST(sampling, top_p_keeps_the_smallest_set_reaching_p) {
    const auto prob = softmax(kLogits);  // order: 1 (3.0), 4 (2.9), 2 (2.0), 7 (1.5), ...
    SamplingParams p;
    p.top_p = float(prob[1] + prob[4] - 1e-3);  // needs tokens 1 and 4
    auto h = histogram(kLogits, p, 3000);
    EXPECT_EQ(h.size(), 2u);
    EXPECT_TRUE(h.count(1) && h.count(4));
    // Relative frequencies are renormalised within the kept set.
    EXPECT_NEAR(double(h[1]) / 3000, prob[1] / (prob[1] + prob[4]), 0.05);
    p.top_p = float(prob[1] + prob[4] + 1e-3);  // one more
    h = histogram(kLogits, p, 3000);
    EXPECT_EQ(h.size(), 3u);
    EXPECT_TRUE(h.count(2));
    p.top_p = 1e-6f;  // at least one token stays
    EXPECT_EQ(histogram(kLogits, p, 100).size(), 1u);
}

TEST(sampling, top_p_over_a_large_vocabulary) {
    // Flat-ish distribution over 5000 tokens: the sorted prefix must grow past its first chunks.
    std::vector<float> x(5000);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(double(i)) * 0.1);
    SamplingParams p;
    p.top_p = 0.5f;
    std::set<int32_t> seen;
    for (int i = 0; i < 600; ++i) seen.insert(draw(x, p, uint64_t(i)).token);
    // Every sampled token is among the top half-mass set: logit above the set's cut-off.
    std::vector<float> sorted = x;
    std::sort(sorted.rbegin(), sorted.rend());
    const auto prob = softmax(sorted);
    double acc = 0;
    size_t k = 0;
    while (acc < 0.5) acc += prob[k++];
    const float cut = sorted[k - 1];
    for (int32_t t : seen) EXPECT_GE(x[size_t(t)], cut);
    EXPECT_GT(seen.size(), 300u);
}

TEST(sampling, min_p_drops_unlikely_tokens) {
    SamplingParams p;
    p.min_p = 0.3f;  // keep tokens with prob >= 0.3 * p(max): logit >= 3 + ln 0.3 = 1.796
    const auto h = histogram(kLogits, p, 3000);
    std::set<int32_t> s;
    for (auto& [t, c] : h) s.insert(t);
    EXPECT_EQ(s, std::set<int32_t>({1, 2, 4}));
}

TEST(sampling, logit_bias_is_added) {
    SamplingParams p;
    p.temperature = 0;
    p.logit_bias = {{5, 10.0f}};
    EXPECT_EQ(draw(kLogits, p).token, 5);
    p.logit_bias = {{1, -100.0f}, {4, -100.0f}};
    EXPECT_EQ(draw(kLogits, p).token, 2);
}

TEST(sampling, repetition_penalty_divides_positive_and_multiplies_negative) {
    SamplingParams p;
    p.temperature = 0;
    p.repetition_penalty = 2.0f;
    // Token 1 (3.0) seen in the prompt -> 1.5; token 4 (2.9) wins.
    EXPECT_EQ(draw(kLogits, p, 0, {1}).token, 4);
    // Seen in output too, and both: still penalised once each.
    EXPECT_EQ(draw(kLogits, p, 0, {1}, {4}).token, 2);
    // Negative logits get more negative: with a bias making all logits negative.
    std::vector<float> neg = {-1.0f, -1.5f};
    EXPECT_EQ(draw(neg, p, 0, {}, {0}).token, 1) << "-1 * 2 = -2 < -1.5";
    p.logprobs = true;
    const auto r = draw({2.0f, 0.0f}, p, 0, {0});
    EXPECT_NEAR(r.logprob, std::log(softmax({1.0f, 0.0f})[0]), 1e-5);
}

TEST(sampling, frequency_and_presence_penalties) {
    SamplingParams p;
    p.temperature = 0;
    p.frequency_penalty = 0.06f;
    // Token 1 appears twice in the output: 3.0 - 0.12 = 2.88 < 2.9.
    EXPECT_EQ(draw(kLogits, p, 0, {}, {1}).token, 1);
    EXPECT_EQ(draw(kLogits, p, 0, {}, {1, 1}).token, 4);
    // Prompt occurrences do not count for OpenAI-style penalties.
    EXPECT_EQ(draw(kLogits, p, 0, {1, 1, 1}, {}).token, 1);
    p.frequency_penalty = 0;
    p.presence_penalty = 0.2f;  // once, however many times
    EXPECT_EQ(draw(kLogits, p, 0, {}, {1}).token, 4);
    p.presence_penalty = 0.05f;
    EXPECT_EQ(draw(kLogits, p, 0, {}, {1, 1, 1, 1}).token, 1);
    p.logprobs = true;
    p.presence_penalty = 1.0f;
    p.frequency_penalty = 0.5f;
    const auto r = draw({2.0f, 0.0f}, p, 0, {}, {0, 0});
    EXPECT_NEAR(r.logprob, std::log(softmax({0.0f, 0.0f})[0]), 1e-5) << "2 - 1 - 2 * 0.5 = 0";
}

TEST(sampling, seed_makes_draws_reproducible) {
    SamplingParams p;
    p.seed = 1234;
    std::vector<int32_t> a, b, c;
    for (int i = 0; i < 50; ++i) {
        a.push_back(draw(kLogits, p, uint64_t(i)).token);
        b.push_back(draw(kLogits, p, uint64_t(i)).token);
    }
    p.seed = 1235;
    for (int i = 0; i < 50; ++i) c.push_back(draw(kLogits, p, uint64_t(i)).token);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
}

TEST(sampling, logprobs_and_top_logprobs) {
    SamplingParams p;
    p.temperature = 0.5f;
    p.top_logprobs = 3;
    p.logprobs = true;
    p.top_k = 2;  // truncation does not change the reported log-probabilities
    const auto r = draw(kLogits, p, 3);
    const auto prob = softmax(kLogits, 0.5f);
    ASSERT_EQ(r.top.size(), 3u);
    EXPECT_EQ(r.top[0].first, 1);
    EXPECT_EQ(r.top[1].first, 4);
    EXPECT_EQ(r.top[2].first, 2);
    for (const auto& [t, lp] : r.top) EXPECT_NEAR(lp, std::log(prob[size_t(t)]), 1e-5);
    EXPECT_NEAR(r.logprob, std::log(prob[size_t(r.token)]), 1e-5);
    p.top_logprobs = 100;  // more than the vocabulary: all of it
    EXPECT_EQ(draw(kLogits, p).top.size(), kLogits.size());
}

TEST(sampling, nan_and_all_masked_rows_do_not_crash) {
    SamplingParams p;
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(draw({std::nanf(""), 1.0f, std::nanf("")}, p).token, 1);
    const auto r = draw({-inf, -inf, -inf}, p);
    EXPECT_GE(r.token, 0);
    EXPECT_LT(r.token, 3);
    p.logit_bias = {{9, 1.0f}};
    EXPECT_THROW(draw(kLogits, p), Error);
}

TEST(sampling, rows_in_parallel_match_rows_alone) {
    const int vocab = 1000, rows = 16;
    std::vector<float> logits(size_t(vocab * rows));
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(std::cos(double(i) * 0.37) * 3);
    std::vector<SamplingParams> params(rows);
    std::vector<SamplingState> states(rows);
    for (int r = 0; r < rows; ++r) {
        params[size_t(r)].seed = uint64_t(r);
        params[size_t(r)].top_k = r % 3 == 0 ? 50 : 0;
        params[size_t(r)].top_p = r % 2 == 0 ? 0.9f : 1.0f;
        params[size_t(r)].temperature = r == 5 ? 0.0f : 0.8f;
        states[size_t(r)].step = uint64_t(r * 3);
    }
    std::vector<SampleResult> out(rows);
    cpu::sample_rows(logits, vocab, params, states, out);
    for (int r = 0; r < rows; ++r) {
        SampleResult alone;
        cpu::sample_row(std::span(logits).subspan(size_t(r * vocab), size_t(vocab)), params[size_t(r)],
                        states[size_t(r)], alone);
        EXPECT_EQ(out[size_t(r)].token, alone.token);
    }
}

// Constrained decoding's mask (step 0): refused tokens are never chosen, whatever their logit or bias.
TEST(sampling, allowed_mask_is_applied_first) {
    std::vector<float> logits(100, 0.0f);
    logits[3] = 10.0f;   // the best, but refused
    logits[64] = 1.0f;
    std::vector<uint32_t> mask(4, 0);
    for (int t : {40, 64, 70}) mask[size_t(t) / 32] |= 1u << (t % 32);
    SamplingState s;
    s.allowed = mask.data();
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    greedy.logit_bias = {{3, 50.0f}, {41, 100.0f}};
    SampleResult r;
    cpu::sample_row(logits, greedy, s, r);
    EXPECT_EQ(r.token, 64);
    SamplingParams p;
    p.temperature = 2.0f;
    p.top_p = 0.9f;
    for (uint64_t step = 0; step < 200; ++step) {
        s.step = step;
        p.seed = step;
        cpu::sample_row(logits, p, s, r);
        EXPECT_TRUE(r.token == 40 || r.token == 64 || r.token == 70) << r.token;
    }
    // All allowed logits at -inf: still an allowed token.
    std::vector<float> dead(100, -INFINITY);
    s.step = 0;
    cpu::sample_row(dead, greedy, s, r);
    EXPECT_EQ(r.token, 40);
}
