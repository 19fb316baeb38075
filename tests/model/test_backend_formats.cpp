// What the CUDA backend accepts, checked before any device work (backends::check_cuda_supports): every
// --weights mode runs (BF16 or FP8 attention and unembedding, MXFP4, FP8 or BF16 experts); W4A8 is
// refused with matrix experts (it is an MXFP4 path); FP8 attention under a tensor-parallel layout needs
// each rank's out-projection columns to start on a 128-column block. CPU only (no GPU needed).
#include <gtest/gtest.h>

#include <string>

#include "backends/runner_factory.h"
#include "model/test_reference_util.h"
#include "model/weight_convert.h"

namespace osprey::model {
namespace {

// 8 query heads of 64 on 8 KV heads (GQA group 1, so that --tp 8 gives a rank one head: 64 columns).
Config config() {
    Config c = test::small_config();
    c.n_heads = 8;
    c.n_kv_heads = 8;
    return c;
}

const Weights& published() {
    static const Weights w = Weights::load(test::synthetic_checkpoint("backend-formats", config(), 5));
    return w;
}

// The message of the error check_cuda_supports throws, or "" when it accepts.
std::string refusal(const Weights& w, const backends::RunnerOptions& o) {
    try {
        backends::check_cuda_supports(w, o);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(cuda_support, published_and_fp8_dense_weights_pass) {
    EXPECT_EQ(refusal(published(), {}), "");
    const Weights fp8 = convert_weights(published(), WeightFormat::fp8, {.experts = false});
    ASSERT_EQ(fp8.layers[0].attention_format(), WeightFormat::fp8);
    ASSERT_EQ(fp8.unembedding_format(), WeightFormat::fp8);
    EXPECT_EQ(refusal(fp8, {.weights_format = WeightFormat::fp8}), "");
    const Weights attn = convert_weights(published(), WeightFormat::fp8, {.experts = false, .unembedding = false});
    EXPECT_EQ(refusal(attn, {.weights_format = WeightFormat::fp8}), "");
    const Weights unemb = convert_weights(published(), WeightFormat::fp8, {.attention = false, .experts = false});
    EXPECT_EQ(refusal(unemb, {.weights_format = WeightFormat::fp8}), "");
}

TEST(cuda_support, fp8_and_bf16_experts_pass_but_not_with_w4a8) {
    const Weights fp8 = convert_weights(published(), WeightFormat::fp8);
    ASSERT_EQ(fp8.layers[0].experts_format(), WeightFormat::fp8);
    EXPECT_EQ(refusal(fp8, {.weights_format = WeightFormat::fp8}), "");
    const Weights bf16 = convert_weights(published(), WeightFormat::bf16);
    ASSERT_EQ(bf16.layers[0].experts_format(), WeightFormat::bf16);
    EXPECT_EQ(refusal(bf16, {.weights_format = WeightFormat::bf16}), "");
    const std::string m = refusal(fp8, {.weights_format = WeightFormat::fp8, .moe_w4a8 = true});
    EXPECT_NE(m.find("--moe-gemm w4a8"), std::string::npos) << m;
    EXPECT_NE(m.find("W4A8 runs the published MXFP4 experts"), std::string::npos) << m;
    EXPECT_EQ(refusal(published(), {.moe_w4a8 = true}), "");
}

TEST(cuda_support, tensor_parallel_fp8_attention_needs_128_column_slices) {
    const Weights fp8 = convert_weights(published(), WeightFormat::fp8, {.experts = false});
    for (const int tp : {2, 4})  // 4 and 2 heads per rank: 256 and 128 columns
        EXPECT_EQ(refusal(fp8, {.layout = {.tp = tp}}), "") << "tp " << tp;
    const std::string m = refusal(fp8, {.layout = {.tp = 8}});  // one head: 64 columns
    EXPECT_NE(m.find("TP8 with FP8 attention: rank 1's out-projection columns start at 64"), std::string::npos) << m;
    // BF16 attention slices anywhere (and the unembedding's rows may split anywhere, FP8 or not).
    const Weights unemb = convert_weights(published(), WeightFormat::fp8, {.attention = false, .experts = false});
    EXPECT_EQ(refusal(unemb, {.layout = {.tp = 8}}), "");
}

TEST(cuda_support, kv_cache_dtype_f32_is_refused) {
    const std::string m = refusal(published(), {.kv_dtype = KvDtype::f32});
    EXPECT_NE(m.find("--kv-cache-dtype"), std::string::npos) << m;
}

}  // namespace
}  // namespace osprey::model
