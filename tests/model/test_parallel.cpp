// Tensor, expert and data parallelism on the CPU backend (model/parallel_runner.h): every layout gives
// the same greedy tokens as the single-rank reference and logits within an FP32 reduction-order bound,
// through chunked prefill, paged and ring KV, a KV fork (copy_kv), batched decode, the distributed
// greedy argmax and the gathered sampler; with DP the sequences are spread over two groups' caches
// (one group idle in some steps); and the engine on a parallel runner (prefix cache, n > 1 forks,
// requests routed between DP groups) streams the same tokens as on the reference.
//
// The bound. A layout changes only the order of FP32 sums: the out-projection over heads and the
// MoE over experts and their columns are summed per rank, then over ranks in rank order. Reordering
// a sum of n terms moves it by at most (n - 1) · 2^-24 · Σ|terms| (Higham's γ_{n-1}): for the
// longest sums here (n ≤ q_dim = 1024) that is ≤ 6.1e-5 of Σ|terms|, and the synthetic model is
// well-conditioned (each update a few percent of the residual, no layer amplifying differences:
// synthetic.cpp), so the residual stream carries it to the logits with gain ~1. The unembedding is
// split by vocabulary rows, so each logit's own dot product is unchanged. The test allows
// 1e-4 · max(1, |logit|), the worst case above rounded up; measured: ≤ 6e-7 (errors add like a
// random walk, ~sqrt(n) · 2^-24). It also checks that every row's top-1/top-2 margin (≥ 2.3 here) is
// far above twice the bound, so equal greedy tokens follow from the bound rather than from luck.
#include <gtest/gtest.h>

#include <cmath>

#include "core/check.h"
#include "engine/engine.h"
#include "model/parallel_runner.h"
#include "model/synthetic.h"
#include "model/test_reference_util.h"

namespace osprey::model {
namespace {

// 8 KV heads (TP up to 8) with 2 query heads each, 8 experts (EP up to 8), an expert intermediate
// of 6 MXFP4 groups (split 2/2/1/1 over 4 ranks, and empty on some of 8), a vocabulary that does not
// split evenly, a sliding window of 16.
Config parallel_config() {
    Config c = test::small_config();
    c.n_heads = 16;
    c.n_kv_heads = 8;
    c.head_dim = 64;
    c.d_ff = 192;
    c.vocab_size = 509;
    c.max_position = 4096;
    return c;
}

const Weights& weights() {
    static const Weights w = [] {
        SyntheticOptions o;
        o.seed = 17;
        o.out = std::filesystem::temp_directory_path() / ("osprey-parallel-" + std::to_string(::getpid()));
        o.init.top_logit = 6.0f;  // less peaked: the next token depends on the context
        o.init.attn_update = 0.3f;
        write_synthetic_checkpoint(parallel_config(), o);
        static struct Cleanup {
            std::filesystem::path dir;
            ~Cleanup() {
                std::error_code ec;
                std::filesystem::remove_all(dir, ec);
            }
        } cleanup{o.out};
        return Weights::load(o.out);
    }();
    return w;
}

constexpr size_t kKvBytes = size_t(32) << 20;

std::unique_ptr<ModelRunner> make(ParallelLayout layout) {
    if (layout.single())
        return std::make_unique<CpuReference>(weights(),
                                              CpuReferenceOptions{.kv_budget_bytes = kKvBytes, .n_threads = 1});
    return std::make_unique<ParallelRunner>(
        weights(), ParallelRunnerOptions{.layout = layout, .kv_budget_bytes = kKvBytes, .n_threads = 2});
}

struct Trace {
    std::vector<std::vector<float>> logits;  // every forward's logits_to_host
    std::vector<int32_t> tokens;             // every sampled token, in order
    std::vector<float> logprobs;             // of the greedy rows
};

// Two prompts prefilled in chunks (one of them across the window and several pages), a fork of the
// second into a third sequence by copy_kv, then 6 batched decode steps of all three; greedy samples
// on the first two rows (distributed argmax), a seeded top-p draw with logprobs on the third (the
// gathered sampler) after the first step.
Trace run(ModelRunner& m) {
    const int ps = 8;
    const KvLayout layout = kv_layout_for(m, ps, 64, 4);
    m.allocate_kv(layout);
    Trace tr;
    std::vector<test::Seq> seqs(3);
    for (int i = 0; i < 40; ++i) seqs[0].tokens.push_back(int32_t((i * 37 + 11) % 509));
    for (int i = 0; i < 11; ++i) seqs[1].tokens.push_back(int32_t((i * 91 + 5) % 509));
    seqs[0].pages = test::pages_from(0, 16);
    seqs[1].pages = test::pages_from(16, 16);
    seqs[2].pages = test::pages_from(32, 16);
    for (int s = 0; s < 3; ++s) seqs[size_t(s)].window_slot = s;
    // With DP, sequence 0 lives in group 0, sequences 1 and 2 (a fork: the same cache) in group 1.
    const int group12 = m.dp_groups() > 1 ? 1 : 0;
    auto slice = [&](int s, int first_token, int n) {
        SequenceSlice sl = test::slice_for(seqs[size_t(s)], first_token, n);
        sl.dp_group = s == 0 ? 0 : group12;
        return sl;
    };
    auto keep = [&] {
        tr.logits.emplace_back();
        m.logits_to_host(tr.logits.back());
    };
    // Prefill: 24 + 16 tokens of seq 0, the second chunk batched with all of seq 1.
    tr.logits.push_back(test::step(m, seqs[0], 24));
    {
        ForwardBatch b;
        b.tokens.assign(seqs[0].tokens.begin() + 24, seqs[0].tokens.end());
        b.tokens.insert(b.tokens.end(), seqs[1].tokens.begin(), seqs[1].tokens.end());
        b.slices.push_back(slice(0, 0, 16));
        b.slices.push_back(slice(1, 16, 11));
        m.forward(b);
        seqs[0].n_computed = 40;
        seqs[1].n_computed = 11;
        keep();
    }
    // Fork seq 1 into seq 2: its two pages and its ring.
    m.copy_kv(plan_kv_copy(
        {.src_pages = {16, 17}, .dst_pages = {32, 33}, .src_slot = 1, .dst_slot = 2, .dp_group = group12}, layout));
    seqs[2].tokens = seqs[1].tokens;
    seqs[2].n_computed = 11;
    // Next tokens from the prefill logits: greedy.
    std::vector<int32_t> next(3);
    const auto argmax = [](std::span<const float> row) {
        return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    };
    next[0] = argmax(std::span<const float>(tr.logits.back()).subspan(0, 509));
    next[1] = next[2] = argmax(std::span<const float>(tr.logits.back()).subspan(509, 509));
    for (int step = 0; step < 6; ++step) {
        ForwardBatch b;
        for (int s = 0; s < 3; ++s) {
            seqs[size_t(s)].tokens.push_back(next[size_t(s)]);
            b.slices.push_back(slice(s, s, 1));
            b.tokens.push_back(next[size_t(s)]);
        }
        m.forward(b);
        for (auto& s : seqs) ++s.n_computed;
        keep();
        std::vector<SamplingParams> params(3);
        for (auto& p : params) p.temperature = 0.0f;
        if (step > 0) {  // one row that needs the whole vocabulary on one rank
            params[2].temperature = 0.8f;
            params[2].top_p = 0.9f;
            params[2].seed = 1234;
            params[2].top_logprobs = 2;
        }
        std::vector<SamplingState> states(3);
        for (int s = 0; s < 3; ++s) states[size_t(s)].step = uint64_t(step);
        std::vector<SampleResult> results(3);
        m.sample(params, states, results);
        for (int s = 0; s < 3; ++s) {
            next[size_t(s)] = results[size_t(s)].token;
            tr.tokens.push_back(results[size_t(s)].token);
            tr.logprobs.push_back(results[size_t(s)].logprob);
        }
    }
    return tr;
}

const Trace& reference() {
    static const Trace t = [] {
        auto m = make({});
        return run(*m);
    }();
    return t;
}

class Layouts : public ::testing::TestWithParam<ParallelLayout> {};

TEST_P(Layouts, SameGreedyTokensAndLogitsWithinTheReductionOrderBound) {
    const ParallelLayout layout = GetParam();
    const Trace& ref = reference();
    auto m = make(layout);
    EXPECT_EQ(m->kv_spec(8).kv_dim(), parallel_config().kv_dim() / layout.tp);
    const Trace got = run(*m);
    ASSERT_EQ(got.logits.size(), ref.logits.size());
    double worst = 0, min_margin = 1e30, max_abs = 1;
    for (size_t f = 0; f < ref.logits.size(); ++f) {
        ASSERT_EQ(got.logits[f].size(), ref.logits[f].size()) << "forward " << f;
        for (size_t i = 0; i < ref.logits[f].size(); ++i) {
            const double a = ref.logits[f][i], b = got.logits[f][i];
            ASSERT_TRUE(std::isfinite(b));
            worst = std::max(worst, std::abs(a - b) / std::max(1.0, std::abs(a)));
            max_abs = std::max(max_abs, std::abs(a));
        }
        for (size_t r = 0; r < ref.logits[f].size() / 509; ++r) {
            std::vector<float> row(ref.logits[f].begin() + ptrdiff_t(r * 509),
                                   ref.logits[f].begin() + ptrdiff_t(r * 509 + 509));
            std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
            min_margin = std::min(min_margin, double(row[0] - row[1]));
        }
    }
    EXPECT_LE(worst, 1e-4) << layout.label();
    EXPECT_GT(min_margin, 2 * 1e-4 * max_abs) << "the model's top-1/top-2 margin makes equal greedy tokens meaningful";
    EXPECT_EQ(got.tokens, ref.tokens) << layout.label();
    for (size_t i = 0; i < ref.logprobs.size(); ++i) EXPECT_NEAR(got.logprobs[i], ref.logprobs[i], 1e-4) << i;
    std::printf("%s: max relative logit difference %.3g (top-1/top-2 margin >= %.3g)\n", layout.label().c_str(), worst,
                min_margin);
}

INSTANTIATE_TEST_SUITE_P(Cpu, Layouts,
                         ::testing::Values(ParallelLayout{2, 1, 1}, ParallelLayout{4, 1, 1}, ParallelLayout{8, 1, 1},
                                           ParallelLayout{1, 2, 1}, ParallelLayout{1, 4, 1}, ParallelLayout{2, 2, 1},
                                           ParallelLayout{4, 4, 1}, ParallelLayout{4, 2, 1}, ParallelLayout{2, 4, 1},
                                           ParallelLayout{8, 8, 1}, ParallelLayout{1, 1, 2}, ParallelLayout{2, 1, 2},
                                           ParallelLayout{1, 2, 2}, ParallelLayout{1, 4, 2}),
                         [](const auto& info) {
                             const ParallelLayout& l = info.param;
                             return "tp" + std::to_string(l.tp) + "_ep" + std::to_string(l.ep) + "_dp" +
                                    std::to_string(l.dp);
                         });

TEST(ParallelLayout, ShardsCoverTheModelOnce) {
    const Config c = preset_config("20b");
    for (const ParallelLayout l : {ParallelLayout{8, 1, 1}, ParallelLayout{4, 4, 1}, ParallelLayout{2, 8, 1}}) {
        std::vector<int> heads(64), experts_cols(size_t(c.n_experts) * c.d_ff), vocab(size_t(c.vocab_size));
        int out_bias = 0;
        for (int r = 0; r < l.world(); ++r) {
            const ModelShard s = model_shard(c, l, r);
            const RankPlace p = rank_place(l, r);
            if (p.attn_replica == 0)
                for (int h = s.heads.first; h < s.heads.end(); ++h) ++heads[size_t(h)];
            out_bias += s.out_bias && p.attn_replica == 0;
            for (int e = s.experts.first; e < s.experts.end(); ++e)
                for (int f = s.ff.first; f < s.ff.end(); ++f) ++experts_cols[size_t(e) * c.d_ff + f];
            for (int v = s.vocab.first; v < s.vocab.end(); ++v) ++vocab[size_t(v)];
            EXPECT_EQ(s.ff.first % 32, 0);
            EXPECT_EQ(s.ff.count % 32, 0);
        }
        for (int h : heads) ASSERT_EQ(h, 1) << l.label();
        for (int x : experts_cols) ASSERT_EQ(x, 1) << l.label();
        for (int v : vocab) ASSERT_EQ(v, 1) << l.label();
        EXPECT_EQ(out_bias, 1);
    }
    EXPECT_EQ((ParallelLayout{4, 4, 1}.world()), 4);
    EXPECT_EQ((ParallelLayout{2, 2, 2}.world()), 4);
    EXPECT_THROW((ParallelLayout{16, 1, 1}.check(c)), osprey::Error);  // 8 KV heads
    EXPECT_THROW((ParallelLayout{1, 3, 1}.check(c)), osprey::Error);   // 32 experts
    EXPECT_THROW((ParallelLayout{2, 3, 1}.check()), osprey::Error);    // tp and ep must divide one another
}

TEST(ParallelRunner, RefusesBadWorkWithoutBreaking) {
    ParallelRunner m(weights(), {.layout = {2, 2, 1}, .kv_budget_bytes = kKvBytes, .n_threads = 2});
    EXPECT_THROW(m.allocate_kv(kv_layout_for(m, 8, 1 << 20, 1)), osprey::Error);  // over the budget
    m.allocate_kv(kv_layout_for(m, 8, 8, 1));
    ForwardBatch bad;
    bad.tokens = {1, 2};
    bad.slices.push_back({.first_token = 0, .n_tokens = 2, .pages = {99}});
    EXPECT_THROW(m.forward(bad), osprey::Error);
    ForwardBatch good;
    good.tokens = {1, 2};
    good.slices.push_back({.first_token = 0, .n_tokens = 2, .pages = {0}});
    m.forward(good);  // still works
    std::vector<float> logits;
    m.logits_to_host(logits);
    EXPECT_EQ(logits.size(), size_t(509));
}

TEST(ParallelRunner, DataParallelRefusesUnknownGroups) {
    ParallelRunner m(weights(), {.layout = {1, 1, 2}, .kv_budget_bytes = kKvBytes, .n_threads = 2});
    EXPECT_EQ(m.dp_groups(), 2);
    const KvLayout layout = kv_layout_for(m, 8, 8, 2);
    m.allocate_kv(layout);
    ForwardBatch b;
    b.tokens = {1, 2};
    b.slices.push_back({.first_token = 0, .n_tokens = 2, .pages = {0}, .dp_group = 2});
    EXPECT_THROW(m.forward(b), osprey::Error);
    EXPECT_THROW(m.copy_kv(plan_kv_copy({.src_pages = {}, .dst_pages = {}, .src_slot = 0, .dst_slot = 1, .dp_group = 2},
                                        layout)),
                 osprey::Error);
    // The same page and slot ids in both groups are two different caches.
    b.tokens = {1, 2, 3};
    b.slices = {{.first_token = 0, .n_tokens = 2, .pages = {0}, .dp_group = 1},
                {.first_token = 2, .n_tokens = 1, .pages = {0}, .dp_group = 0}};
    m.forward(b);
    std::vector<float> logits;
    m.logits_to_host(logits);
    EXPECT_EQ(logits.size(), size_t(2 * 509));
    // A single-rank backend has one group only.
    auto single = make({});
    single->allocate_kv(kv_layout_for(*single, 8, 8, 2));
    EXPECT_THROW(single->forward(b), osprey::Error);
}

// The engine on a parallel runner (prefix caching with window replay, n = 2 forks, batching, prompts
// of different lengths, unrelated prompts that DP routes to the other group) against the engine on the
// reference, request by request; the prefix hits are the same too (each request routed to the group
// holding its prefix), and every bookkeeping invariant holds after each step.
struct EngineRun {
    std::vector<std::vector<int32_t>> tokens;  // (request, sample, token) in each stream's order
    engine::EngineStats stats;
};

EngineRun generate(ModelRunner& m) {
    engine::EngineOptions o;
    o.page_size = 8;
    o.max_num_seqs = 8;
    o.max_kv_tokens = 1024;
    o.check_invariants = true;
    engine::Engine e(m, o);
    std::vector<std::shared_ptr<engine::RequestStream>> streams;
    std::vector<int32_t> shared;
    for (int i = 0; i < 48; ++i) shared.push_back(int32_t((i * 13 + 3) % 509));
    for (int r = 0; r < 6; ++r) {
        engine::Request q;
        q.id = "r" + std::to_string(r);
        if (r < 4) q.prompt = shared;
        for (int i = 0; i < 5 + 3 * r; ++i) q.prompt.push_back(int32_t((r * 71 + i * 7) % 509));
        q.max_new_tokens = 6;
        q.sampling.temperature = 0.0f;
        q.n = r == 1 || r == 4 ? 2 : 1;
        streams.push_back(e.submit(q));
        if (r == 0) e.run_until_idle();  // the next three hit its prefix
    }
    e.run_until_idle();
    EngineRun out;
    for (size_t r = 0; r < streams.size(); ++r)
        while (auto ev = streams[r]->try_pop()) {
            EXPECT_TRUE(ev->kind == engine::Event::Kind::token || ev->reason != engine::FinishReason::error);
            if (ev->kind == engine::Event::Kind::token) out.tokens.push_back({int32_t(r), ev->sample, ev->token});
        }
    EXPECT_EQ(out.tokens.size(), size_t(6 * 8));
    out.stats = e.stats();
    return out;
}

class EngineLayouts : public ::testing::TestWithParam<ParallelLayout> {};

TEST_P(EngineLayouts, StreamTheSameTokens) {
    static const EngineRun ref = [] {
        auto m = make({});
        return generate(*m);
    }();
    auto par = make(GetParam());
    const EngineRun got = generate(*par);
    EXPECT_EQ(got.tokens, ref.tokens);
    EXPECT_GT(ref.stats.n_prefix_hit_tokens, 0u);
    EXPECT_EQ(got.stats.n_prefix_hit_tokens, ref.stats.n_prefix_hit_tokens);
    EXPECT_GT(ref.stats.n_forked_tokens, 0u);
    EXPECT_EQ(got.stats.n_forked_tokens, ref.stats.n_forked_tokens);
    EXPECT_EQ(got.stats.dp_groups, GetParam().dp);
    EXPECT_EQ(got.stats.kv_capacity_tokens, ref.stats.kv_capacity_tokens * GetParam().dp);
}

INSTANTIATE_TEST_SUITE_P(Cpu, EngineLayouts,
                         ::testing::Values(ParallelLayout{2, 2, 1}, ParallelLayout{1, 1, 2}, ParallelLayout{1, 2, 2},
                                           ParallelLayout{2, 1, 2}),
                         [](const auto& info) {
                             const ParallelLayout& l = info.param;
                             return "tp" + std::to_string(l.tp) + "_ep" + std::to_string(l.ep) + "_dp" +
                                    std::to_string(l.dp);
                         });

// Routing between DP groups through the engine: two unrelated requests go to the two groups (least
// load: with one running sequence per group, both run at once only if they are in different groups);
// after both finish, a follow-up of the second hits its prefix, so it must go to group 1 even though
// both groups are idle (a tie that load alone gives to group 0, where it would miss), and one of the
// first to group 0.
TEST(ParallelRunner, EngineRoutesByPrefixThenLoad) {
    auto m = make({1, 1, 2});
    engine::EngineOptions o;
    o.page_size = 8;
    o.max_num_seqs = 1;
    o.max_kv_tokens = 512;
    o.check_invariants = true;
    engine::Engine e(*m, o);
    ASSERT_EQ(e.dp_groups(), 2);
    std::vector<int32_t> a, b;
    for (int i = 0; i < 40; ++i) a.push_back(int32_t((i * 13 + 3) % 509)), b.push_back(int32_t((i * 29 + 100) % 509));
    auto submit = [&](std::vector<int32_t> prompt) {
        engine::Request q;
        q.prompt = std::move(prompt);
        q.max_new_tokens = 2;
        q.sampling.temperature = 0.0f;
        return e.submit(q);
    };
    submit(a);
    submit(b);
    e.step();
    engine::EngineStats s = e.stats();
    EXPECT_EQ(s.n_running, 2);  // one per group
    e.run_until_idle();
    const uint64_t hits0 = e.stats().n_prefix_hit_tokens;
    std::vector<int32_t> b2 = b;
    b2.push_back(7);
    submit(b2);
    e.run_until_idle();
    EXPECT_EQ(e.stats().n_prefix_hit_tokens - hits0, 40u);  // b's 5 full pages, held by group 1 only
    std::vector<int32_t> a2 = a;
    a2.push_back(9);
    submit(a2);
    e.run_until_idle();
    EXPECT_EQ(e.stats().n_prefix_hit_tokens - hits0, 80u);
}

}  // namespace
}  // namespace osprey::model
