// route_topk_softmax: top-k on raw logits (lowest id on ties), softmax over only the k selected.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "kernel_test_util.h"
#include "kernels/cpu/routing.h"

namespace osprey::cpu {
namespace {

TEST(cpu_routing, top4_then_softmax_over_the_four) {
    const int n_tokens = 20, n_experts = 32, k = 4;
    const auto logits = test::random_floats(n_tokens * n_experts, 7, -4.0f, 4.0f);
    std::vector<int32_t> ids(n_tokens * k);
    std::vector<float> w(n_tokens * k);
    route_topk_softmax(ids, w, logits, n_tokens, n_experts, k);
    for (int t = 0; t < n_tokens; ++t) {
        std::vector<int> order(n_experts);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return logits[t * n_experts + a] > logits[t * n_experts + b]; });
        double sum = 0;
        for (int i = 0; i < k; ++i) sum += std::exp(double(logits[t * n_experts + order[i]]));
        for (int i = 0; i < k; ++i) {
            EXPECT_EQ(ids[t * k + i], order[i]) << "token " << t << " rank " << i;
            EXPECT_NEAR(w[t * k + i], std::exp(double(logits[t * n_experts + order[i]])) / sum, 1e-7);
        }
        // Not softmax-over-all-then-top-k: the four weights sum to one.
        EXPECT_NEAR(w[t * k] + w[t * k + 1] + w[t * k + 2] + w[t * k + 3], 1.0, 1e-6);
    }
}

TEST(cpu_routing, golden_values_and_ties_go_to_lower_id) {
    // Experts 1 and 5 tie at 2.0; 3 and 6 tie at 1.0 for the last place.
    const std::vector<float> logits = {0.0f, 2.0f, -1.0f, 1.0f, 0.5f, 2.0f, 1.0f, 3.0f};
    std::vector<int32_t> ids(4);
    std::vector<float> w(4);
    route_topk_softmax(ids, w, logits, 1, 8, 4);
    EXPECT_EQ(ids, (std::vector<int32_t>{7, 1, 5, 3}));
    const double den = std::exp(3.0) + 2 * std::exp(2.0) + std::exp(1.0);
    EXPECT_NEAR(w[0], std::exp(3.0) / den, 1e-7);
    EXPECT_NEAR(w[1], std::exp(2.0) / den, 1e-7);
    EXPECT_NEAR(w[2], std::exp(2.0) / den, 1e-7);
    EXPECT_NEAR(w[3], std::exp(1.0) / den, 1e-7);
}

TEST(cpu_routing, rejects_bad_k_and_nan) {
    std::vector<float> logits(8, 0.0f);
    std::vector<int32_t> ids(9);
    std::vector<float> w(9);
    EXPECT_THROW(route_topk_softmax(ids, w, logits, 1, 8, 9), Error);
    logits[0] = std::nanf("");
    logits[1] = std::nanf("");
    std::vector<int32_t> ids8(8);
    std::vector<float> w8(8);
    EXPECT_THROW(route_topk_softmax(ids8, w8, logits, 1, 8, 8), Error);
}

}  // namespace
}  // namespace osprey::cpu
