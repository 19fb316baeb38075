// Speculative decoding on the CUDA backend (label gpu), against the CPU reference on the synthetic
// tiny checkpoint: verify slices with a logit row per token (SequenceSlice::n_logits) in a cache
// whose rings have spare rows (KvSpec::with_ring_slack), a rollback (the next slice restarts inside
// the positions the last one wrote) past the 128-row window, the hidden-state capture an EAGLE-3
// head reads, and the engine's greedy output with n-gram and draft-model speculation equal to its
// output without. Bounds as in test_cuda_forward.cu (BF16 GEMM inputs and K/V on the GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>

#include "engine/engine.h"
#include "model/cuda/gpt_oss_cuda.h"
#include "model/gpt_oss_ref.h"
#include "model/synthetic.h"
#include "model/test_reference_util.h"
#include "model/cuda_test_util.h"

namespace osprey::model {
namespace {

constexpr double kLogitBound = 2e-2;
constexpr double kHiddenBound = 3e-2;

using test::rel_l2;
using test::tiny_weights;

constexpr int kSlack = 4;

KvLayout slack_layout(const ModelRunner& r) {
    KvLayout l = kv_layout_for(r, 16, 256, 4);
    l.spec = l.spec.with_ring_slack(kSlack);
    return l;
}

SequenceSlice slice(int first_token, int n, int start, int n_logits, int n_pages) {
    SequenceSlice s;
    s.first_token = first_token;
    s.n_tokens = n;
    s.start_pos = start;
    s.window_slot = 0;
    s.window_first = 0;
    s.n_logits = n_logits;
    for (int p = 0; p < n_pages; ++p) s.pages.push_back(p);
    return s;
}

TEST(cuda_speculative, verify_rows_and_rollback_match_the_reference) {
    CpuReference cpu(tiny_weights());
    CudaRunner gpu(tiny_weights(), CudaRunnerOptions{.max_tokens = 1024, .max_logit_rows = 64, .max_slices = 8,
                                                      .progress = false});
    cpu.allocate_kv(slack_layout(cpu));
    gpu.allocate_kv(slack_layout(gpu));
    const int V = cpu.config().vocab_size;
    std::mt19937 rng(3);
    std::vector<int32_t> tokens(400);
    for (int32_t& t : tokens) t = int32_t(rng() % 200000);
    auto run = [&](int start, int n, int n_logits) {
        ForwardBatch b;
        b.tokens.assign(tokens.begin() + start, tokens.begin() + start + n);
        b.slices.push_back(slice(0, n, start, n_logits, 25));
        cpu.forward(b);
        gpu.forward(b);
        std::vector<float> lc, lg;
        cpu.logits_to_host(lc);
        gpu.logits_to_host(lg);
        EXPECT_EQ(lc.size(), size_t(n_logits) * V);
        EXPECT_EQ(lg.size(), lc.size());
        for (int r = 0; r < n_logits; ++r)
            EXPECT_LT(rel_l2(std::span(lg).subspan(size_t(r) * V, V), std::span(lc).subspan(size_t(r) * V, V)),
                      kLogitBound)
                << "start " << start << " row " << r;
    };
    run(0, 200, 1);  // a prompt longer than the 128-position window
    // Verify steps of 1 + 4 tokens, each rolled back to keep 1 + a of them (a = 0, 2, 4, 1, 3).
    int pos = 200;
    for (int a : {0, 2, 4, 1, 3}) {
        run(pos, 1 + kSlack, 1 + kSlack);
        pos += 1 + a;  // the next verify overwrites the rejected positions
    }
    run(pos, 1, 1);
}

TEST(cuda_speculative, captured_hidden_states_match_the_reference) {
    CpuReference cpu(tiny_weights());
    CudaRunner gpu(tiny_weights(), CudaRunnerOptions{.max_tokens = 512, .max_logit_rows = 16, .max_slices = 8,
                                                      .progress = false});
    cpu.allocate_kv(slack_layout(cpu));
    gpu.allocate_kv(slack_layout(gpu));
    const std::vector<int> layers = {0, 1, 2};
    cpu.set_capture_layers(layers);
    gpu.set_capture_layers(layers);
    std::mt19937 rng(5);
    ForwardBatch b;
    for (int i = 0; i < 50; ++i) b.tokens.push_back(int32_t(rng() % 200000));
    b.slices.push_back(slice(0, 50, 0, 1, 4));
    cpu.forward(b);
    gpu.forward(b);
    std::vector<float> hc, hg;
    cpu.captured_to_host(hc);
    gpu.captured_to_host(hg);
    ASSERT_EQ(hc.size(), size_t(50) * 3 * cpu.config().d_model);
    ASSERT_EQ(hg.size(), hc.size());
    EXPECT_LT(rel_l2(hg, hc), kHiddenBound);
}

// Verify steps (1 + k tokens per slice, a logit row each) and mixed steps (a decode beside verifies)
// replayed from CUDA graphs give the logits and captured hidden states of eager launches, across
// rollbacks: each shape is captured when it recurs within a few steps and replayed after that. Pure verify
// steps run the same kernels either way (equal up to nothing); a decode beside them gets the graph's
// fixed KV split count, which may move a BF16 rounding (the bound of graph_decode_matches_eager).
TEST(cuda_speculative, graph_verify_matches_eager) {
    auto make = [](bool graphs) {
        return std::make_unique<CudaRunner>(tiny_weights(),
                                            CudaRunnerOptions{.max_tokens = 1024, .max_logit_rows = 64,
                                                              .max_slices = 8, .progress = false, .graphs = graphs});
    };
    std::unique_ptr<CudaRunner> eager = make(false), graphed = make(true);
    eager->allocate_kv(slack_layout(*eager));
    graphed->allocate_kv(slack_layout(*graphed));
    const std::vector<int> layers = {0, 2};
    eager->set_capture_layers(layers);
    graphed->set_capture_layers(layers);
    std::mt19937 rng(9);
    std::vector<test::Seq> seqs(3);
    for (int i = 0; i < 3; ++i) {
        seqs[size_t(i)].tokens.resize(400);
        for (int32_t& t : seqs[size_t(i)].tokens) t = int32_t(rng() % 200000);
        seqs[size_t(i)].pages = test::pages_from(i * 60, 60);
        seqs[size_t(i)].window_slot = i;
    }
    // Runs one step of n[i] tokens for sequence i (1: a decode, more: a verify with a row per token)
    // on both runners; returns the worst relative difference of logit rows and captured states.
    auto run = [&](const std::vector<int>& n, bool all_rows) {
        ForwardBatch b;
        for (size_t i = 0; i < seqs.size(); ++i) {
            SequenceSlice sl = test::slice_for(seqs[i], b.n_tokens(), n[i]);
            sl.n_logits = all_rows ? n[i] : 1;
            b.slices.push_back(sl);
            b.tokens.insert(b.tokens.end(), seqs[i].tokens.begin() + seqs[i].n_computed,
                            seqs[i].tokens.begin() + seqs[i].n_computed + n[i]);
        }
        eager->forward(b);
        graphed->forward(b);
        std::vector<float> le, lg, he, hg;
        eager->logits_to_host(le);
        graphed->logits_to_host(lg);
        eager->captured_to_host(he);
        graphed->captured_to_host(hg);
        EXPECT_EQ(le.size(), size_t(b.n_logit_rows()) * eager->config().vocab_size);
        EXPECT_EQ(lg.size(), le.size());
        EXPECT_EQ(hg.size(), he.size());
        return std::max(rel_l2(lg, le), rel_l2(hg, he));
    };
    EXPECT_EQ(run({150, 140, 130}, false), 0.0);  // prefills: eager in both
    for (size_t i = 0; i < seqs.size(); ++i) seqs[i].n_computed = 150 - 10 * int(i);
    // Two shapes, alternating: every sequence verifying 1 + 4, and a decode beside verifies of 1 + 2
    // and 1 + 4. After each step a pseudo-random number of proposals is accepted, the rest rolled back.
    const std::vector<std::vector<int>> shapes = {{5, 5, 5}, {1, 3, 5}};
    for (int step = 0; step < 12; ++step) {
        const std::vector<int>& n = shapes[size_t(step % 2)];
        EXPECT_LT(run(n, true), 1e-3) << "step " << step;
        for (size_t i = 0; i < seqs.size(); ++i) seqs[i].n_computed += 1 + int(rng() % uint32_t(n[i]));
    }
    EXPECT_EQ(graphed->graphs_captured(), 2) << "one graph per shape";
    // A shape that comes back only after more than kGraphRecurSteps steps (an occasional probe of the
    // back-off or the adaptive policy) runs eagerly both times: no capture for it.
    const std::vector<int> rare = {2, 2, 2};
    auto step_and_advance = [&](const std::vector<int>& n) {
        EXPECT_LT(run(n, true), 1e-3);
        for (size_t i = 0; i < seqs.size(); ++i) seqs[i].n_computed += 1 + int(rng() % uint32_t(n[i]));
    };
    step_and_advance(rare);
    for (int k = 0; k < 5; ++k) step_and_advance(shapes[0]);
    step_and_advance(rare);
    EXPECT_EQ(graphed->graphs_captured(), 2) << "the rare shape was captured";
    EXPECT_EQ(eager->graphs_captured(), 0);
}

std::vector<std::vector<int32_t>> engine_greedy(ModelRunner& target, const engine::SpeculativeOptions& spec) {
    engine::EngineOptions o;
    o.page_size = 16;
    o.max_kv_tokens = 8192;
    o.max_num_seqs = 8;
    o.check_invariants = true;
    o.speculative = spec;
    engine::Engine e(target, o);
    std::vector<std::shared_ptr<engine::RequestStream>> streams;
    std::mt19937 rng(11);
    for (int i = 0; i < 4; ++i) {
        engine::Request r;
        r.id = std::string(1, char('a' + i));
        for (int j = 0; j < 150 + 10 * i; ++j) r.prompt.push_back(int32_t(rng() % 16));  // repetitive: n-grams hit
        r.max_new_tokens = 64;
        r.sampling.temperature = 0;
        streams.push_back(e.submit(r));
    }
    e.run_until_idle();
    std::vector<std::vector<int32_t>> out;
    for (auto& s : streams) {
        std::vector<int32_t> t;
        while (auto ev = s->try_pop())
            if (ev->kind == engine::Event::Kind::token) t.push_back(ev->token);
        out.push_back(t);
    }
    return out;
}

TEST(cuda_speculative, engine_greedy_output_equals_plain_decoding) {
    const CudaRunnerOptions ro{.max_tokens = 2048, .max_logit_rows = 64, .max_slices = 16, .progress = false};
    CudaRunner target(tiny_weights(), ro);
    const auto plain = engine_greedy(target, {});
    engine::SpeculativeOptions ngram;
    ngram.method = engine::SpecMethod::ngram;
    ngram.num_tokens = 4;
    EXPECT_EQ(engine_greedy(target, ngram), plain) << "n-gram";
    CudaRunner draft(tiny_weights(), ro);  // the target's own weights: every greedy proposal accepted
    engine::SpeculativeOptions d;
    d.method = engine::SpecMethod::draft;
    d.num_tokens = 4;
    d.draft_runner = &draft;
    EXPECT_EQ(engine_greedy(target, d), plain) << "draft model";
}

}  // namespace
}  // namespace osprey::model
