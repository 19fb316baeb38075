// The CUDA runner with FP8 attention projections and unembedding (Fp8Parts{attention, unembedding}, the
// experts MXFP4 as published: what the CUDA backend runs of --weights fp8 --convert attention,unembedding;
// kernels/cuda/linear.h Fp8Weight, model/cuda/device_weights.h DeviceLinear) against the CPU reference
// on the same converted weights (cpu::fp8_matmul), on the synthetic tiny checkpoint (4 layers, 8 query /
// 1 KV heads: q is 512 rows, k and v 64 each, so the stacked qkv keeps its multipliers on a 64-row grid):
// a prompt in chunks (the prefill path: dequantise + cuBLASLt) then 32 greedy decode steps (the FP8
// GEMVs with the norm prologue and the MoE residual epilogue, gemv_wide for the 201088-row unembedding),
// eager and from CUDA graphs; ragged batches of 1..40 tokens (the GEMV, once or per 8 tokens, and the
// prefill path); every intermediate layer by layer; and tensor parallelism on one GPU (a 64-head model,
// TP2 and TP8, its vocabulary of 1001 rows split at rows that are not multiples of 128) against the
// single-GPU runner.
//
// Bounds (architecture.md, "Comparing implementations on random weights"; tests/model/test_cuda_forward.cu):
// the GPU path's own BF16 roundings (activations after every norm, BF16 attention inputs) against the
// FP32 reference give ~1e-3 relative on the logits of these well-conditioned models; the FP8 weights
// add nothing on decode (the GEMVs decode every code exactly and scale per block as the reference) and
// one BF16 rounding per dequantised weight on prefill (2^-9 relative, the size of the BF16 checkpoint's
// own rounding). So the FP32-vs-BF16 bounds hold unchanged: logits 2e-2, every step 3e-2, identical
// greedy tokens; tensor parallel against one GPU 1e-2 and identical tokens (test_cuda_parallel's).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "model/cuda/gpt_oss_cuda.h"
#include "model/cuda/parallel_cuda.h"
#include "model/gpt_oss_ref.h"
#include "model/synthetic.h"
#include "model/test_reference_util.h"
#include "model/cuda_test_util.h"
#include "model/weight_convert.h"

namespace osprey::model {
namespace {

constexpr double kLogitBound = 2e-2;
constexpr double kStepBound = 3e-2;
constexpr Fp8Parts kDenseFp8{.attention = true, .experts = false, .unembedding = true};

using test::argmax;
using test::random_prompt;
using test::rel_l2;

const Weights& tiny_fp8() {
    static const Weights w = [] {
        const auto dir = test::synthetic_checkpoint("cuda-tiny", preset_config("tiny"), 7);
        return convert_weights(Weights::load(dir), WeightFormat::fp8, kDenseFp8);
    }();
    return w;
}

CudaRunnerOptions options(bool graphs) { return test::tiny_cuda_options(graphs); }

struct Pair : test::CudaCpuPair {
    explicit Pair(bool graphs) : CudaCpuPair(tiny_fp8(), {}, options(graphs)) {}
};

TEST(cuda_fp8_weights, device_weights_are_fp8_where_converted) {
    const Weights& w = tiny_fp8();
    ASSERT_EQ(w.layers[0].attention_format(), WeightFormat::fp8);
    ASSERT_EQ(w.layers[0].experts_format(), WeightFormat::mxfp4);
    ASSERT_EQ(w.unembedding_format(), WeightFormat::fp8);
    const Config& c = w.config;
    const DeviceWeights d = DeviceWeights::load(w, false);
    const DeviceLayer& l = d.layers[0];
    EXPECT_TRUE(l.qkv_w.is_fp8() && l.out_w.is_fp8() && d.unembedding.is_fp8());
    EXPECT_EQ(l.qkv_w.codes.size(), size_t(c.q_dim() + 2 * c.kv_dim()) * c.d_model);
    EXPECT_EQ(l.qkv_w.w.size(), 0u);
    // q 512 rows, k and v 64: the stacked multipliers on a 64-row grid; out-proj and unembedding on 128.
    EXPECT_EQ(l.qkv_w.block_rows, 64);
    EXPECT_EQ(l.qkv_w.scale.size(), size_t((c.q_dim() + 2 * c.kv_dim()) / 64) * size_t((c.d_model + 127) / 128));
    EXPECT_EQ(l.out_w.block_rows, 128);
    EXPECT_EQ(d.unembedding.block_rows, 128);
    // The grid holds the parts' own multipliers: q's block-row 0 twice, then k's, then v's.
    const std::vector<float> grid = l.qkv_w.scale.download(l.qkv_w.scale.size());
    const int nkb = (c.d_model + 127) / 128;
    const float* qs = w.layers[0].q_scale.as<float>();
    const float* ks = w.layers[0].k_scale.as<float>();
    const float* vs = w.layers[0].v_scale.as<float>();
    for (int kb = 0; kb < nkb; ++kb) {
        EXPECT_EQ(grid[size_t(0) * nkb + kb], qs[kb]);
        EXPECT_EQ(grid[size_t(1) * nkb + kb], qs[kb]);
        EXPECT_EQ(grid[size_t(8) * nkb + kb], ks[kb]);
        EXPECT_EQ(grid[size_t(9) * nkb + kb], vs[kb]);
    }
    // Half the bytes of the BF16 matrices (plus the multipliers).
    const DeviceWeights bf = DeviceWeights::load(
        Weights::load(test::synthetic_checkpoint("cuda-tiny", preset_config("tiny"), 7)), false);
    EXPECT_LT(double(d.unembedding.bytes()), 0.51 * double(bf.unembedding.bytes()));
}

TEST(cuda_fp8_weights, long_prompt_in_chunks_then_32_greedy_steps) {
    for (const bool graphs : {false, true}) {
        SCOPED_TRACE(graphs ? "graphs" : "eager");
        Pair p(graphs);
        test::prompt_in_chunks_then_32_greedy_steps(p, random_prompt(320, 11), {200, 120}, kLogitBound,
                                                    graphs ? "graphs, " : "eager, ");
        if (graphs) EXPECT_GE(p.gpu.graphs_captured(), 1);
    }
}

// Steps of 1, 2, 5, 8 tokens (the GEMVs: 1 and 2 with the fused norms), 9 and 12 (the GEMV per 8
// tokens) and 40 (the prefill path) over 1..4 sequences, every slice asking for logits.
TEST(cuda_fp8_weights, ragged_batches_on_every_path) {
    Pair p(/*graphs=*/true);
    std::vector<test::Seq> seqs(4);
    for (int i = 0; i < 4; ++i) {
        seqs[i].tokens = random_prompt(300, 200 + i);
        seqs[i].pages = test::pages_from(i * 40, 40);
        seqs[i].window_slot = i;
    }
    const std::vector<std::vector<std::pair<int, int>>> plan = {
        {{0, 40}, {1, 30}, {2, 20}, {3, 10}},      // prefill
        {{0, 1}, {1, 1}},                          // 2 tokens
        {{0, 1}, {1, 1}, {2, 1}, {3, 2}},          // 5
        {{0, 2}, {1, 2}, {2, 2}, {3, 2}},          // 8
        {{0, 3}, {1, 2}, {2, 2}, {3, 2}},          // 9
        {{0, 3}, {1, 3}, {2, 3}, {3, 3}},          // 12
        {{0, 10}, {1, 10}, {2, 10}, {3, 10}},      // 40
        {{2, 1}},                                  // 1
    };
    for (size_t k = 0; k < plan.size(); ++k) {
        ForwardBatch b;
        for (auto [i, n] : plan[k]) {
            test::Seq& s = seqs[i];
            b.slices.push_back(test::slice_for(s, b.n_tokens(), n));
            b.tokens.insert(b.tokens.end(), s.tokens.begin() + s.n_computed, s.tokens.begin() + s.n_computed + n);
            s.n_computed += n;
        }
        const double err = p.forward(b);
        std::printf("  step %zu (%d tokens, %zu slices): logits rel err %.2e\n", k, b.n_tokens(), b.slices.size(), err);
        EXPECT_LT(err, kLogitBound) << "step " << k;
    }
}

// Layer by layer, on a prefill (the prefill path) and on a 2-token decode step (the GEMVs; dumps turn
// the fused norms off, so the plain GEMV path): every intermediate within kStepBound.
TEST(cuda_fp8_weights, every_step_matches_the_reference) {
    Pair p(false);
    std::vector<test::Seq> seqs(2);
    for (int i = 0; i < 2; ++i) {
        seqs[i].tokens = random_prompt(160, 5 + i);
        seqs[i].pages = test::pages_from(i * 20, 20);
        seqs[i].window_slot = i;
    }
    for (const int n : {150, 1}) {
        ForwardBatch b;
        for (int i = 0; i < 2; ++i) {
            b.slices.push_back(test::slice_for(seqs[i], b.n_tokens(), n));
            b.tokens.insert(b.tokens.end(), seqs[i].tokens.begin() + seqs[i].n_computed,
                            seqs[i].tokens.begin() + seqs[i].n_computed + n);
            seqs[i].n_computed += n;
        }
        SCOPED_TRACE(std::to_string(n) + " tokens per sequence");
        test::expect_steps_match(p, b, [](const std::string&) { return kStepBound; },
                                 std::to_string(n) + " tokens per sequence, ");
    }
}

// Tensor parallelism with FP8 attention and unembedding on one GPU (the same-device communicator):
// each rank's q/k/v rows, out-projection columns (multiples of 512) and vocabulary rows (1001 split at
// rows 501, 251, ...: multiplier grids down to one row) against the single-GPU runner.
Config tp_config() {
    Config c = test::small_config();
    c.d_model = 256;
    c.n_heads = 64;
    c.n_kv_heads = 8;
    c.head_dim = 64;
    c.n_experts = 8;
    c.d_ff = 192;
    c.vocab_size = 1001;
    c.sliding_window = 128;
    c.max_position = 4096;
    return c;
}

TEST(cuda_fp8_weights, tensor_parallel_matches_one_gpu) {
    const Weights w = convert_weights(Weights::load(test::synthetic_checkpoint("cuda-fp8w-tp", tp_config(), 31)),
                                      WeightFormat::fp8, kDenseFp8);
    const CudaRunnerOptions ro{.max_tokens = 256, .max_logit_rows = 8, .max_slices = 8, .progress = false};
    auto run = [&](ModelRunner& m) {
        m.allocate_kv(kv_layout_for(m, 16, 64, 4));
        test::Seq s;
        for (int i = 0; i < 140; ++i) s.tokens.push_back(int32_t((i * 37 + 11) % 1001));
        s.pages = test::pages_from(0, 16);
        std::vector<std::vector<float>> logits;
        logits.push_back(test::step(m, s, 140));
        for (int i = 0; i < 8; ++i) {
            s.tokens.push_back(argmax(logits.back()));
            logits.push_back(test::step(m, s, 1));
        }
        return logits;
    };
    CudaRunner one(w, ro);
    const auto want = run(one);
    for (const int tp : {2, 8}) {
        auto m = make_cuda_parallel_runner(w, {.layout = {.tp = tp}, .runner = ro, .same_device = true});
        const auto got = run(*m);
        ASSERT_EQ(got.size(), want.size());
        double worst = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            worst = std::max(worst, rel_l2(got[i], want[i]));
            EXPECT_EQ(argmax(got[i]), argmax(want[i])) << "TP" << tp << " step " << i;
        }
        std::printf("  TP%d vs one GPU: worst logits rel err %.2e\n", tp, worst);
        EXPECT_LT(worst, 1e-2) << "TP" << tp;
    }
}

}  // namespace
}  // namespace osprey::model
