// Randomised engine runs on the fake runner: thousands of arrivals with shared prefixes, random
// priorities, n > 1, cancellations, a cache small enough to preempt often, every invariant
// checked after every step; at the end no request is lost and every uncancelled sample equals
// its oracle (greedy or seeded sampling replayed without the engine).
// OSPREY_ENGINE_STRESS_SCALE=k multiplies the number of arrivals (default 1: ~2000, a few seconds).
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "kernels/cpu/sampling.h"

using namespace osprey;
using namespace osprey::engine;
using osprey::test::FakeRunner;
using osprey::test::FakeRunnerOptions;

namespace {

int stress_scale() {
    const char* s = std::getenv("OSPREY_ENGINE_STRESS_SCALE");
    return s ? std::max(1, std::atoi(s)) : 1;
}

// Added to every configuration's seed, to explore other trajectories offline (CI uses 0).
uint32_t stress_seed_offset() {
    const char* s = std::getenv("OSPREY_ENGINE_STRESS_SEED");
    return s ? uint32_t(std::strtoul(s, nullptr, 10)) : 0u;
}

// What sample `sample` of `r` must produce on the fake model (no engine involved).
std::vector<int32_t> oracle(const Request& r, int sample, int vocab, int window, int32_t* stop) {
    std::vector<int32_t> history = r.prompt, out;
    SamplingParams p = r.sampling;
    p.seed = sample_seed(r.sampling.seed, sample);
    *stop = -1;
    for (int i = 0; i < r.max_new_tokens; ++i) {
        const auto logits = FakeRunner::reference_logits(history, vocab, window);
        SamplingState st;
        st.prompt_tokens = r.prompt.data();
        st.n_prompt_tokens = int32_t(r.prompt.size());
        st.output_tokens = history.data() + r.prompt.size();
        st.n_output_tokens = int32_t(history.size() - r.prompt.size());
        st.step = uint64_t(i);
        SampleResult res;
        cpu::sample_row(logits, p, st, res);
        history.push_back(res.token);
        if (std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), res.token) != r.stop_token_ids.end()) {
            *stop = res.token;
            break;
        }
        out.push_back(res.token);
    }
    return out;
}

struct Live {
    Request request;
    std::shared_ptr<RequestStream> stream;
    std::vector<test::SampleOutcome> got;
    bool cancelled = false;
};

struct StressConfig {
    int window;
    int page_size;
    int max_num_seqs;
    int max_batch_tokens;
    int n_pages;
    bool prefix_caching;
    uint32_t seed;
    int dp_groups = 1;  // > 1: the engine routes between that many caches (attention DP)
    // > 0: speculative decoding with this many proposals per step, from n-gram lookup or (oracle)
    // the model's greedy continuation with planted errors: every verify accepts a random prefix
    // and rolls back pages and rings, and the output must still equal the oracle.
    int spec_k = 0;
    bool spec_oracle = false;
};

void run_stress(const StressConfig& c, int n_arrivals) {
    const int vocab = 200;
    FakeRunnerOptions fo;
    fo.vocab_size = vocab;
    fo.sliding_window = c.window;
    fo.dp_groups = c.dp_groups;
    FakeRunner runner(fo);
    EngineOptions o;
    o.page_size = c.page_size;
    o.max_num_seqs = c.max_num_seqs;
    o.max_batch_tokens = c.max_batch_tokens;
    o.max_kv_tokens = int64_t(c.n_pages) * c.page_size;
    o.enable_prefix_caching = c.prefix_caching;
    o.check_invariants = true;
    if (c.spec_k > 0) {
        o.speculative.method = SpecMethod::ngram;
        o.speculative.num_tokens = c.spec_k;
        if (c.spec_oracle) o.speculative.custom = std::make_shared<test::OracleProposer>(vocab, c.window);
    }
    Engine engine(runner, o);

    std::mt19937 rng(c.seed + stress_seed_offset());
    auto rand_int = [&](int lo, int hi) { return lo + int(rng() % uint32_t(hi - lo + 1)); };
    std::vector<std::vector<int32_t>> prefixes;
    for (int i = 0; i < 5; ++i) {
        std::vector<int32_t> p(static_cast<size_t>(rand_int(1, 3 * c.window)));
        for (auto& t : p) t = rand_int(0, vocab - 2);
        prefixes.push_back(p);
    }

    std::vector<Live> all;
    all.reserve(size_t(n_arrivals));
    int arrived = 0;
    int64_t steps = 0;
    for (;;) {
        const int burst = rand_int(0, 2) == 0 ? rand_int(1, 4) : 0;
        for (int b = 0; b < burst && arrived < n_arrivals; ++b, ++arrived) {
            Live l;
            Request& r = l.request;
            r.id = osprey::str("r", arrived);
            if (rand_int(0, 3) != 0) r.prompt = prefixes[size_t(rand_int(0, 4))];
            const int tail = rand_int(r.prompt.empty() ? 1 : 0, 40);
            for (int i = 0; i < tail; ++i) r.prompt.push_back(rand_int(0, vocab - 2));
            r.max_new_tokens = rand_int(1, 40);
            const int room = c.n_pages * c.page_size - int(r.prompt.size());
            if (room < 1) continue;
            r.max_new_tokens = std::min(r.max_new_tokens, room);
            r.stop_token_ids = {vocab - 1, int32_t(rand_int(0, vocab - 2))};
            r.priority = rand_int(0, 5) == 0 ? 1 : 0;
            r.n = rand_int(0, 7) == 0 ? rand_int(2, 3) : 1;
            if (rand_int(0, 2) == 0) {
                r.sampling.temperature = 0.7f + 0.1f * float(rand_int(0, 5));
                r.sampling.top_k = rand_int(0, 1) ? 0 : 20;
                r.sampling.top_p = rand_int(0, 1) ? 1.0f : 0.9f;
                r.sampling.seed = rng();
                r.sampling.presence_penalty = rand_int(0, 3) == 0 ? 0.5f : 0.0f;
            } else {
                r.sampling.temperature = 0;
                r.sampling.repetition_penalty = rand_int(0, 4) == 0 ? 1.3f : 1.0f;
            }
            l.stream = engine.submit(r);
            all.push_back(std::move(l));
        }
        if (!all.empty() && rand_int(0, 9) == 0) {
            Live& victim = all[size_t(rand_int(0, int(all.size()) - 1))];
            if (!victim.stream->finished()) {
                victim.cancelled = true;
                victim.stream->cancel();
            }
        }
        const bool worked = engine.step();
        ++steps;
        for (Live& l : all) test::drain(*l.stream, l.got);
        if (!worked && arrived >= n_arrivals) break;
        ASSERT_LT(steps, int64_t(n_arrivals) * 400) << "no progress";
    }

    int n_checked = 0;
    for (Live& l : all) {
        test::drain(*l.stream, l.got);
        ASSERT_TRUE(l.stream->done()) << l.request.id << " was lost";
        for (int s = 0; s < l.request.n; ++s) {
            const auto& g = l.got[size_t(s)];
            ASSERT_TRUE(g.finished) << l.request.id;
            ASSERT_NE(g.finish.reason, FinishReason::error) << g.finish.error;
            if (g.finish.reason == FinishReason::abort) {
                ASSERT_TRUE(l.cancelled) << l.request.id << " aborted without a cancel";
                continue;
            }
            int32_t stop = -1;
            const auto want = oracle(l.request, s, vocab, c.window, &stop);
            ASSERT_EQ(g.tokens, want) << l.request.id << " sample " << s;
            ASSERT_EQ(g.finish.reason, stop >= 0 ? FinishReason::stop : FinishReason::length) << l.request.id;
            ASSERT_EQ(g.finish.stop_token, stop);
            ASSERT_EQ(g.finish.usage.completion_tokens, int(want.size()) + (stop >= 0 ? 1 : 0));
            ++n_checked;
        }
    }
    const EngineStats st = engine.stats();
    EXPECT_EQ(st.n_running + st.n_waiting, 0);
    EXPECT_EQ(st.n_free_pages + st.n_cached_pages, st.n_pages);
    EXPECT_GT(n_checked, n_arrivals / 2);
    EXPECT_GT(st.n_preemptions, 0u);
    if (c.prefix_caching) {
        EXPECT_GT(st.n_prefix_hit_tokens, 0u);
        EXPECT_GT(st.n_window_restores, 0u) << "later hits restore saved window rings";
    }
    EXPECT_GT(st.n_forked_tokens, 0u) << "n > 1 requests fork their samples";
    if (c.spec_k > 0) {
        EXPECT_GT(st.n_spec_verifies, 0u);
        if (c.spec_oracle) {
            EXPECT_GT(st.n_spec_accepted_tokens, st.n_spec_verifies / 4);
        }
        std::printf("stress: %llu verifies, %llu proposed, %llu accepted\n", (unsigned long long)st.n_spec_verifies,
                    (unsigned long long)st.n_spec_draft_tokens, (unsigned long long)st.n_spec_accepted_tokens);
    }
    EXPECT_EQ(st.dp_groups, c.dp_groups);
    for (int g = 0; g < c.dp_groups; ++g) EXPECT_GT(runner.n_tokens_in_group(g), 0) << "group " << g << " never ran";
    std::printf(
        "stress: %d arrivals, %lld steps, %d samples checked, %llu preemptions, %llu prefix-hit tokens, "
        "%llu forked tokens, %llu window-only tokens, %llu ring restores\n",
        n_arrivals, (long long)steps, n_checked, (unsigned long long)st.n_preemptions,
        (unsigned long long)st.n_prefix_hit_tokens, (unsigned long long)st.n_forked_tokens,
        (unsigned long long)runner.n_window_only_tokens(), (unsigned long long)st.n_window_restores);
}

}  // namespace

TEST(engine_stress, small_pages_short_window) {
    run_stress({.window = 8,
                .page_size = 4,
                .max_num_seqs = 6,
                .max_batch_tokens = 24,
                .n_pages = 40,
                .prefix_caching = true,
                .seed = 11},
               3000 * stress_scale());
}

TEST(engine_stress, window_longer_than_chunks) {
    run_stress({.window = 32,
                .page_size = 8,
                .max_num_seqs = 8,
                .max_batch_tokens = 20,
                .n_pages = 30,
                .prefix_caching = true,
                .seed = 12},
               2000 * stress_scale());
}

// Two data-parallel groups, each with its own pages, slots and prefix cache: routing by prefix and
// load, forks and preemptions inside a group, and every group's invariants after each step.
TEST(engine_stress, two_data_parallel_groups) {
    run_stress({.window = 8,
                .page_size = 4,
                .max_num_seqs = 4,
                .max_batch_tokens = 16,
                .n_pages = 24,
                .prefix_caching = true,
                .seed = 14,
                .dp_groups = 2},
               2000 * stress_scale());
}

TEST(engine_stress, without_prefix_caching) {
    run_stress({.window = 16,
                .page_size = 4,
                .max_num_seqs = 4,
                .max_batch_tokens = 32,
                .n_pages = 40,
                .prefix_caching = false,
                .seed = 13},
               1500 * stress_scale());
}

// Speculative decoding inside the randomised run: verify chunks accept random prefixes (the oracle
// proposer plants one error at a random index), so pages and rings roll back in every step next to
// prefills, forks, prefix hits and preemptions; every invariant holds after each step and every
// sample still equals its oracle.
TEST(engine_stress, speculative_rollback_oracle) {
    run_stress({.window = 8,
                .page_size = 4,
                .max_num_seqs = 6,
                .max_batch_tokens = 24,
                .n_pages = 40,
                .prefix_caching = true,
                .seed = 15,
                .spec_k = 3,
                .spec_oracle = true},
               1500 * stress_scale());
}

TEST(engine_stress, speculative_ngram) {
    run_stress({.window = 16,
                .page_size = 4,
                .max_num_seqs = 6,
                .max_batch_tokens = 32,
                .n_pages = 40,
                .prefix_caching = true,
                .seed = 16,
                .spec_k = 4},
               1000 * stress_scale());
}
