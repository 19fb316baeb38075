// The whole MoE step on the GPU (route -> group -> mlp1 -> mlp2 -> combine) against the CPU reference
// kernels: every checked case of the MoE table (tests/kernels/cases/moe_mlp_cases.h, shared with
// bench/bench_moe.cu: tiny, 20b and 120b shapes, 1 to 8192 tokens, each tiling and the automatic
// choice, tile edges), plus the automatic choice's crossovers and the argument checks.
#include <gtest/gtest.h>

#include "kernels/cases/gtest_cases.h"
#include "kernels/cases/moe_mlp_cases.h"

namespace osprey {
namespace {

using cuda::MoeKernel;
using namespace cases::moe_mlp;

class MoeMlpTable : public cases::CaseTest {};
TEST_P(MoeMlpTable, matches_reference) { cases::check_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(cases, MoeMlpTable, cases::checked(cases::moe_mlp::cases(), cases::moe_mlp::run),
                         cases::case_name);

TEST(MoeMlpTiles, automatic_choice) {
    EXPECT_EQ(cuda::moe_choose_kernel(1, 4, 32), MoeKernel::gemv);
    EXPECT_EQ(cuda::moe_choose_kernel(32, 4, 32), MoeKernel::gemv);      // 4 rows per expert
    EXPECT_EQ(cuda::moe_choose_kernel(33, 4, 32), MoeKernel::narrow);    // just above
    EXPECT_EQ(cuda::moe_choose_kernel(1024, 4, 32), MoeKernel::narrow);  // 128
    EXPECT_EQ(cuda::moe_choose_kernel(1025, 4, 32), MoeKernel::gemm);
    EXPECT_EQ(cuda::moe_choose_kernel(128, 4, 128), MoeKernel::gemv);    // 120b decode, batch 128
    EXPECT_EQ(cuda::moe_choose_kernel(1024, 4, 128), MoeKernel::narrow); // 120b, 1k prefill
    EXPECT_EQ(cuda::moe_choose_kernel(8192, 4, 32), MoeKernel::gemm);
}

TEST(MoeMlpErrors, rejects_bad_shapes) {
    Experts& ex = experts_for(kTiny, 0, 1);
    cuda::DeviceBuffer<int32_t> offsets(9), sorted(4);
    cuda::DeviceBuffer<bf16> x(128), u(128);
    cuda::MoeMlp1Args a{.u = u.get(), .x = x.get(), .w = ex.mlp1.view(), .expert_offsets = offsets.get(),
                        .sorted_rows = sorted.get(), .n_tokens = 1, .n_experts = 8, .top_k = 4, .d_model = 100,
                        .d_ff = 128};
    EXPECT_THROW(cuda::moe_mlp1(a, nullptr), Error);  // d_model not a multiple of 64
    a.d_model = 128;
    a.w.blocks = nullptr;
    EXPECT_THROW(cuda::moe_mlp1(a, nullptr), Error);
    cuda::MoeMlp2Args b{.y = nullptr, .u = u.get(), .w = ex.mlp2.view(), .expert_offsets = offsets.get(),
                        .sorted_rows = sorted.get(), .n_tokens = 1, .n_experts = 8, .top_k = 4, .d_model = 128,
                        .d_ff = 128};
    EXPECT_THROW(cuda::moe_mlp2(b, nullptr), Error);  // null y
    EXPECT_THROW(cuda::moe_combine({.out = nullptr, .y = nullptr, .expert_weights = nullptr, .n_tokens = 1,
                                    .d_model = 128, .top_k = 3},
                                   nullptr),
                 Error);
}

}  // namespace
}  // namespace osprey
