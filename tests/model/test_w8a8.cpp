// W8A8 expert arithmetic (kernels/cpu/w8a8_matmul.h; the GPU's FP8 matrix-expert GEMM, docs/fp8.md "GPU:
// matrix experts") through the CPU reference (CpuReferenceOptions::moe_w8a8): FP8 experts (converted
// from the published MXFP4 ones, --weights fp8 --convert experts) with E4M3 activations against the same
// FP8 experts with FP32 activations (W8A16, the CPU's default for FP8 weights), layer by layer, KL,
// top-1 and greedy agreement, on the test model (partial 128-blocks: d_model 160, d_ff 192) and on the
// tiny preset; bounds per architecture.md "Comparing implementations on random weights".
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "model/format_accuracy.h"
#include "model/synthetic.h"
#include "model/weight_convert.h"
#include "test_reference_util.h"

namespace osprey::model {
namespace {

namespace fs = std::filesystem;

Weights fp8_experts(const fs::path& dir) {
    return convert_weights(Weights::load(dir), WeightFormat::fp8, parse_fp8_parts("experts"));
}

AccuracyReport w8a8_against_w8a16(const fs::path& dir, int positions) {
    CpuReference base(fp8_experts(dir), {.n_threads = 2});
    CpuReference cand(fp8_experts(dir), {.n_threads = 2, .moe_w8a8 = true});
    return compare_formats(
        base, cand,
        {.positions = positions, .chunk = 32, .prompt_tokens = 8, .greedy_tokens = 24, .page_size = 8, .seed = 3},
        [&](DumpFn f) { base.set_dump(std::move(f)); }, [&](DumpFn f) { cand.set_dump(std::move(f)); });
}

// The activations' E4M3 rounding (2^-4 relative at most, ~2^-4/sqrt(3) RMS per projection input) moves
// each MoE output by a few percent of itself (x's rounding through both SwiGLU factors, then u's); the
// residual stream dilutes it. The same bounds as W4A8 (test_w4a8.cpp), whose arithmetic differs only by
// the weights (exact MXFP4 there, the FP8 conversion here, identical on both sides of this comparison).
// max_kl: the mean KL grows with the square of the logits' error and with their scale: the test model's
// logits are small (measured 5e-12 nats), the tiny preset's larger (3e-8, as W4A8's there, docs/fp8.md).
void expect_w8a8_bounds(const AccuracyReport& r, double max_kl) {
    ASSERT_EQ(r.steps.back().step, "logits");
    EXPECT_GT(r.max_step_error("moe"), 0.01);  // the activations really are quantised
    EXPECT_LT(r.max_step_error("moe"), 2 * 0.0625 / std::sqrt(3.0));
    EXPECT_LT(r.max_step_error("resid_mlp"), 5e-3);
    EXPECT_LT(r.max_step_error("logits"), 5e-3);
    EXPECT_LT(r.mean_kl, max_kl);
    EXPECT_GE(r.top1_agreement, 0.99);
    EXPECT_LE(r.routing_flips, r.routing_total / 50);
    EXPECT_GE(r.greedy_common_prefix, 16);
}

TEST(w8a8_accuracy, test_model_against_w8a16) {
    const AccuracyReport r =
        w8a8_against_w8a16(test::synthetic_checkpoint("w8a8-published", test::partial_blocks_config(), 11), 96);
    std::printf("MoE W8A8 against W8A16, FP8 experts (CPU reference, test model):\n%s", r.table().c_str());
    // Measured: moe 3.4-3.6e-2 per layer, resid_mlp 5.7e-4 (layer 0) to 1.2e-3 (layer 3), logits 9.6e-4,
    // mean KL 5e-12, no routing flip, top-1 and greedy 24/24.
    expect_w8a8_bounds(r, 1e-10);
}

TEST(w8a8_accuracy, tiny_preset_against_w8a16) {
    const AccuracyReport r = w8a8_against_w8a16(test::synthetic_checkpoint("w8a8-tiny", preset_config("tiny"), 7), 96);
    std::printf("MoE W8A8 against W8A16, FP8 experts (CPU reference, tiny preset):\n%s", r.table().c_str());
    // Measured: moe 3.7-3.9e-2 per layer, resid_mlp 1.3e-3 (layer 0) to 2.6e-3 (layer 3), logits 2.6e-3,
    // mean KL 2.9e-8 (max 4.9e-8), no routing flip in 384, top-1 and greedy 24/24.
    expect_w8a8_bounds(r, 1e-7);
}

}  // namespace
}  // namespace osprey::model
