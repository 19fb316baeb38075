// Top-4 routing on the GPU against the CPU reference: every checked case of the routing table
// (tests/kernels/cases/moe_route_cases.h, shared with bench/bench_moe.cu), a NaN logit, the argument checks.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cases/gtest_cases.h"
#include "kernels/cases/moe_route_cases.h"

namespace osprey {
namespace {

class MoeRouteTable : public cases::CaseTest {};
TEST_P(MoeRouteTable, matches_reference) { cases::check_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(cases, MoeRouteTable, cases::checked(cases::moe_route::cases(), cases::moe_route::run),
                         cases::case_name);

TEST(MoeRoute, nan_logit_is_never_chosen) {
    std::vector<float> logits(32);
    for (int e = 0; e < 32; ++e) logits[e] = std::sin(float(e));  // in [-1, 1]
    logits[7] = NAN;
    logits[9] = 100.0f;
    auto d_logits = cases::to_device(logits);
    auto d_ids = cases::poisoned<int32_t>(4);
    auto d_w = cases::poisoned<float>(4);
    cuda::moe_route_topk({.expert_ids = d_ids.get(), .expert_weights = d_w.get(), .logits = d_logits.get(),
                          .n_tokens = 1, .n_experts = 32, .top_k = 4},
                         nullptr);
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
}  // namespace osprey
