// Top-4 routing on the GPU against the CPU reference (kernels/cpu/routing.h): exact expert ids
// (including ties, which go to the lower id), weights to FP32 rounding.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/routing.h"
#include "kernels/cuda/moe_route.h"
#include "kernels/cuda_test_util.h"

namespace osprey::test {
namespace {

enum class Logits { random, ties };

void check_route(int n_tokens, int n_experts, Logits kind, bool with_bias) {
    SCOPED_TRACE("tokens=" + std::to_string(n_tokens) + " experts=" + std::to_string(n_experts) +
                 (kind == Logits::ties ? " ties" : "") + (with_bias ? " bias" : ""));
    const int top_k = 4;
    const uint32_t seed = fresh_seed();
    std::vector<float> logits = random_floats(size_t(n_tokens) * n_experts, seed, -6.0f, 6.0f);
    if (kind == Logits::ties)  // a handful of distinct values: most top-4 sets contain ties
        for (float& v : logits) v = std::round(v / 3.0f);
    std::vector<bf16> bias;
    std::vector<float> biased = logits;
    if (with_bias) {
        bias = random_bf16(n_experts, seed + 1, -1.0f, 1.0f);
        for (int t = 0; t < n_tokens; ++t)
            for (int e = 0; e < n_experts; ++e) biased[size_t(t) * n_experts + e] += bf16_to_float(bias[e]);
    }
    std::vector<int32_t> want_ids(size_t(n_tokens) * top_k);
    std::vector<float> want_w(want_ids.size());
    cpu::route_topk_softmax(want_ids, want_w, biased, n_tokens, n_experts, top_k);

    auto d_logits = to_device(logits);
    cuda::DeviceBuffer<bf16> d_bias;
    if (with_bias) d_bias = to_device(bias);
    auto d_ids = poisoned<int32_t>(want_ids.size());
    auto d_w = poisoned<float>(want_ids.size());
    cuda::moe_route_topk({.expert_ids = d_ids.get(), .expert_weights = d_w.get(), .logits = d_logits.get(),
                          .bias = with_bias ? d_bias.get() : nullptr, .n_tokens = n_tokens, .n_experts = n_experts,
                          .top_k = top_k}, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(d_ids.download(), want_ids);
    // exp and a 4-term sum in FP32 against the reference's double: a few ulps.
    expect_close(d_w.download(), to_double(want_w), 1e-6, 1e-5, "weights");
}

TEST(MoeRoute, gpt_oss_expert_counts) {
    for (int n_experts : {8, 32, 128})
        for (int n_tokens : {1, 3, 8, 64, 333, 2048}) check_route(n_tokens, n_experts, Logits::random, false);
}
TEST(MoeRoute, ties_go_to_lower_id) {
    for (int n_experts : {8, 32, 128}) check_route(500, n_experts, Logits::ties, false);
}
TEST(MoeRoute, bias_added_in_kernel) {
    for (int n_experts : {32, 128}) check_route(100, n_experts, Logits::random, true);
}
TEST(MoeRoute, expert_counts_off_the_warp_size) {
    for (int n_experts : {4, 5, 33, 255, 256}) check_route(77, n_experts, Logits::random, false);
}

TEST(MoeRoute, nan_logit_is_never_chosen) {
    std::vector<float> logits = random_floats(32, fresh_seed());
    logits[7] = NAN;
    logits[9] = 100.0f;
    auto d_logits = to_device(logits);
    auto d_ids = poisoned<int32_t>(4);
    auto d_w = poisoned<float>(4);
    cuda::moe_route_topk({.expert_ids = d_ids.get(), .expert_weights = d_w.get(), .logits = d_logits.get(),
                          .n_tokens = 1, .n_experts = 32, .top_k = 4}, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> ids = d_ids.download();
    EXPECT_EQ(ids[0], 9);
    for (int id : ids) EXPECT_NE(id, 7);
    for (float w : d_w.download()) EXPECT_TRUE(std::isfinite(w));
}

TEST(MoeRoute, rejects_bad_arguments) {
    cuda::DeviceBuffer<float> buf(1024);
    cuda::DeviceBuffer<int32_t> ids(16);
    cuda::MoeRouteArgs a{.expert_ids = ids.get(), .expert_weights = buf.get(), .logits = buf.get(), .n_tokens = 1,
                         .n_experts = 300, .top_k = 4};
    EXPECT_THROW(cuda::moe_route_topk(a, nullptr), Error);  // too many experts
    a.n_experts = 32;
    a.top_k = 2;
    EXPECT_THROW(cuda::moe_route_topk(a, nullptr), Error);  // only top-4 is built
    a.top_k = 4;
    a.logits = nullptr;
    EXPECT_THROW(cuda::moe_route_topk(a, nullptr), Error);
}

}  // namespace
}  // namespace osprey::test
