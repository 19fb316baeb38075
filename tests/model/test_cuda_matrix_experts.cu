// The CUDA runner with matrix experts (kernels/cuda/moe_mlp_matrix.h through MoeStep; DeviceWeights'
// matrix experts) on the synthetic tiny checkpoint, converted at load time as --weights does:
//   BF16 experts (convert_weights bf16: exact from MXFP4) against the CPU reference on the same weights;
//   FP8 experts (convert_weights fp8 --convert experts) against the CPU reference running the GPU's W8A8
//   arithmetic (CpuReferenceOptions::moe_w8a8).
// Each: a 320-token prompt in two chunks (200: 100 routed rows per expert, the 128-row tiles; 120: 60,
// the 64-row tiles) then 32 greedy decode steps (4 routed rows: the decode batches, CUDA graphs on) with
// identical tokens, every step's intermediates layer by layer on a 180-token prefill, and the parallel
// layouts (one GPU, same-device communicator: EP 2, TP 2 with expert columns padded to 64-column tiles)
// against the single-GPU runner; plus the refusals (W4A8 with matrix experts; FP8 experts whose TP slice
// does not start at a multiple of 128).
//
// Bounds. BF16 experts: exactly test_cuda_forward's (the GPU rounds GEMM inputs and K/V to BF16 where the
// reference keeps FP32: logits 2e-2 per row, intermediates 3e-2, identical greedy tokens): the experts'
// weights are the same values on both sides. FP8 experts: the same, except the MoE output itself: both
// sides quantise their activations to E4M3, but the GPU quantises the BF16-rounded h (the CPU the FP32
// xn), so some elements land one E4M3 step apart; bounded by two E4M3 roundings' RMS (2 · 2^-4 / sqrt(3)),
// as test_cuda_w4a8. The residual stream dilutes that below the logit bound (the CPU measures W8A8 at
// 2-3e-3 from W8A16 on these models, test_w8a8). Parallel layouts: test_cuda_parallel's 1e-2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "kernels/cuda/moe_mlp_matrix.h"
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
constexpr double kParallelBound = 1e-2;
const double kE4m3Step = 0.0625 / std::sqrt(3.0);

using test::argmax;
using test::rel_l2;

// test_cuda_parallel's small model (8 KV heads of 8 query heads: TP up to 8; 8 experts) with d_ff 256
// (TP 2: 128 + 128 columns, each rank's FP8 blocks whole) or 192 (96 + 96: rank 1's start inside a block).
Config tp_config(int d_ff) {
    Config c = test::small_config();
    c.d_model = 256;
    c.n_heads = 64;
    c.n_kv_heads = 8;
    c.head_dim = 64;
    c.d_ff = d_ff;
    c.vocab_size = 1001;
    c.sliding_window = 128;
    c.max_position = 4096;
    return c;
}

const Weights& published(const std::string& model) {
    static const Weights tiny = Weights::load(test::synthetic_checkpoint("cuda-tiny", preset_config("tiny"), 7));
    if (model == "tiny") return tiny;
    static const Weights tp256 = Weights::load(test::synthetic_checkpoint("cuda-matrix-tp256", tp_config(256), 17));
    if (model == "tp256") return tp256;
    static const Weights tp192 = Weights::load(test::synthetic_checkpoint("cuda-matrix-tp192", tp_config(192), 19));
    return tp192;
}

Weights with_experts(const std::string& model, WeightFormat f) {
    return f == WeightFormat::bf16 ? convert_weights(published(model), WeightFormat::bf16)
                                   : convert_weights(published(model), WeightFormat::fp8, parse_fp8_parts("experts"));
}

CudaRunnerOptions gpu_options(bool graphs) {
    return CudaRunnerOptions{.max_tokens = 1024, .max_logit_rows = 16, .max_slices = 16, .progress = false,
                             .graphs = graphs};
}

std::vector<int32_t> random_prompt(int n, uint32_t seed, int vocab = 200000) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = int32_t(rng() % uint32_t(vocab));
    return t;
}

class MatrixExperts : public ::testing::TestWithParam<WeightFormat> {};

// The reference runs the same experts (FP8: W8A8, as the GPU's matrix kernel).
test::CudaCpuPair pair_for(WeightFormat f, bool graphs) {
    return test::CudaCpuPair(with_experts("tiny", f), {.moe_w8a8 = f == WeightFormat::fp8}, gpu_options(graphs));
}

TEST_P(MatrixExperts, long_prompt_in_chunks_then_32_greedy_steps) {
    const WeightFormat f = GetParam();
    ASSERT_EQ(with_experts("tiny", f).layers[0].experts_format(), f);
    test::CudaCpuPair p = pair_for(f, /*graphs=*/true);
    test::prompt_in_chunks_then_32_greedy_steps(p, random_prompt(320, 11), {200, 120}, kLogitBound,
                                                std::string(weight_format_name(f)) + " experts, ");
}

TEST_P(MatrixExperts, prefill_steps_match_the_reference) {
    const WeightFormat f = GetParam();
    test::CudaCpuPair p = pair_for(f, /*graphs=*/false);
    test::expect_steps_match(
        p, test::prefill_batch(random_prompt(180, 5)),
        [&](const std::string& name) {
            return name.rfind("moe@", 0) == 0 && f == WeightFormat::fp8 ? 2 * kE4m3Step : kStepBound;
        },
        std::string(weight_format_name(f)) + " experts ");
    std::vector<float> lc, lg;
    p.cpu.logits_to_host(lc);
    p.gpu.logits_to_host(lg);
    ASSERT_EQ(lc.size(), lg.size());
    EXPECT_LT(rel_l2(lg, lc), kLogitBound);
}

// A prompt of 150 tokens in chunks of 100 and 50, then 8 greedy steps, on `m`: the logits of every step.
std::vector<std::vector<float>> trace(ModelRunner& m, std::vector<int32_t>& tokens) {
    m.allocate_kv(kv_layout_for(m, 16, 64, 4));
    test::Seq s;
    s.tokens = random_prompt(150, 3, m.config().vocab_size);
    s.pages = test::pages_from(0, 20);
    std::vector<std::vector<float>> out;
    auto step = [&](int n) {
        ForwardBatch b;
        b.tokens.assign(s.tokens.begin() + s.n_computed, s.tokens.begin() + s.n_computed + n);
        b.slices.push_back(test::slice_for(s, 0, n));
        m.forward(b);
        s.n_computed += n;
        out.emplace_back();
        m.logits_to_host(out.back());
    };
    step(100);
    step(50);
    for (int i = 0; i < 8; ++i) {
        s.tokens.push_back(argmax(out.back()));
        step(1);
    }
    tokens.assign(s.tokens.begin() + 150, s.tokens.end());
    return out;
}

TEST_P(MatrixExperts, parallel_layouts_match_one_gpu) {
    const WeightFormat f = GetParam();
    const Weights w = with_experts("tp256", f);
    std::vector<int32_t> want_tokens;
    CudaRunner one(w, gpu_options(false));
    const auto want = trace(one, want_tokens);
    for (ParallelLayout layout : {ParallelLayout{.tp = 1, .ep = 2}, ParallelLayout{.tp = 2}, ParallelLayout{.tp = 2, .ep = 2}}) {
        auto m = make_cuda_parallel_runner(w, {.layout = layout, .runner = gpu_options(false), .same_device = true});
        std::vector<int32_t> tokens;
        const auto got = trace(*m, tokens);
        double worst = 0;
        for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, rel_l2(got[i], want[i]));
        std::printf("  %s experts, %s: worst logits rel diff %.2e\n", weight_format_name(f), layout.label().c_str(), worst);
        EXPECT_LT(worst, kParallelBound) << layout.label();
        EXPECT_EQ(tokens, want_tokens) << layout.label();
    }
}

INSTANTIATE_TEST_SUITE_P(formats, MatrixExperts, ::testing::Values(WeightFormat::bf16, WeightFormat::fp8),
                         [](const auto& info) { return std::string(weight_format_name(info.param)); });

// --weights fp8 on one GPU requantises the MXFP4 experts on the device as they load (DeviceWeights::load
// with experts_to_fp8, kernels/cuda/fp8_quantize.h): its codes and multipliers must be the host
// conversion's, bit for bit, including partial blocks (partial_blocks_config: d_model 160 = 1.25 blocks
// of columns in mlp1 and of rows in mlp2, d_ff 192 = 1.5 blocks of mlp2's columns) and 32-element
// groups whose scale differs within a block (every synthetic checkpoint).
TEST(MatrixExpertsDeviceConversion, codes_and_multipliers_equal_the_host_conversion) {
    const Weights partial =
        Weights::load(test::synthetic_checkpoint("cuda-matrix-partial", test::partial_blocks_config(), 23));
    for (const Weights* pub : {&published("tiny"), &partial}) {
        const DeviceWeights host =
            DeviceWeights::load(convert_weights(*pub, WeightFormat::fp8, parse_fp8_parts("experts")), false);
        const DeviceWeights dev = DeviceWeights::load(*pub, false, /*experts_to_fp8=*/true);
        ASSERT_EQ(host.layers.size(), dev.layers.size());
        for (size_t l = 0; l < host.layers.size(); ++l) {
            const DeviceLayer& a = host.layers[l];
            const DeviceLayer& b = dev.layers[l];
            ASSERT_EQ(b.experts, WeightFormat::fp8);
            EXPECT_EQ(b.mlp1_blocks.size(), 0u);  // no MXFP4 copy is kept
            ASSERT_EQ(a.mlp1_w.size(), b.mlp1_w.size());
            ASSERT_EQ(a.mlp2_w.size(), b.mlp2_w.size());
            ASSERT_EQ(a.mlp1_w_scale.size(), b.mlp1_w_scale.size());
            ASSERT_EQ(a.mlp2_w_scale.size(), b.mlp2_w_scale.size());
            EXPECT_TRUE(a.mlp1_w.download() == b.mlp1_w.download()) << "layer " << l << " mlp1 codes";
            EXPECT_TRUE(a.mlp2_w.download() == b.mlp2_w.download()) << "layer " << l << " mlp2 codes";
            EXPECT_TRUE(a.mlp1_w_scale.download() == b.mlp1_w_scale.download()) << "layer " << l << " mlp1 multipliers";
            EXPECT_TRUE(a.mlp2_w_scale.download() == b.mlp2_w_scale.download()) << "layer " << l << " mlp2 multipliers";
        }
        // The runner takes the same route (CudaRunnerOptions::experts_to_fp8, what --weights fp8 sets),
        // where the matrix-expert kernels take the widths (multiples of 64: not d_model 160, which the
        // runner refuses by name, as it does the host-converted experts).
        CudaRunnerOptions o = gpu_options(false);
        o.experts_to_fp8 = true;
        if (cuda::moe_matrix_supports(pub->config.d_model, pub->config.d_ff)) {
            EXPECT_NO_THROW({ CudaRunner runner(*pub, o); });
        } else {
            EXPECT_THROW({ CudaRunner runner(*pub, o); }, Error);
        }
    }
}

TEST(MatrixExpertsErrors, refusals) {
    // W4A8 is an MXFP4 path.
    CudaRunnerOptions o = gpu_options(false);
    o.moe_w4a8 = true;
    EXPECT_THROW(CudaRunner(with_experts("tiny", WeightFormat::fp8), o), Error);
    // d_ff 192 splits 96 / 96 at TP 2: rank 1's FP8 blocks would straddle the ranks.
    const Weights fp8 = with_experts("tp192", WeightFormat::fp8);
    EXPECT_THROW(make_cuda_parallel_runner(fp8, {.layout = {.tp = 2}, .runner = gpu_options(false), .same_device = true}),
                 Error);
    // The same split with BF16 experts is fine.
    EXPECT_NO_THROW(make_cuda_parallel_runner(with_experts("tp192", WeightFormat::bf16),
                                              {.layout = {.tp = 2}, .runner = gpu_options(false), .same_device = true}));
}

}  // namespace
}  // namespace osprey::model
