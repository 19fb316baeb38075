// Grouping routed rows by expert on the GPU against a stable sort on the CPU: every checked case of the
// grouping table (tests/kernels/cases/moe_group_cases.h, shared with bench/bench_moe.cu), plus the
// argument checks.
#include <gtest/gtest.h>

#include "kernels/cases/gtest_cases.h"
#include "kernels/cases/moe_group_cases.h"

namespace osprey {
namespace {

class MoeGroupTable : public cases::CaseTest {};
TEST_P(MoeGroupTable, matches_reference) { cases::check_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(cases, MoeGroupTable, cases::checked(cases::moe_group::cases(), cases::moe_group::run),
                         cases::case_name);

TEST(MoeGroup, rejects_bad_arguments) {
    cuda::DeviceBuffer<int32_t> buf(64);
    cuda::MoeGroupArgs a{.expert_offsets = buf.get(), .sorted_rows = buf.get(), .scratch = nullptr,
                         .expert_ids = buf.get(), .n_tokens = 1000, .n_experts = 32, .top_k = 4};
    EXPECT_THROW(cuda::moe_group_by_expert(a, nullptr), Error);  // multi-tile batch without scratch
    a.n_tokens = 1;
    a.n_experts = 1000;
    EXPECT_THROW(cuda::moe_group_by_expert(a, nullptr), Error);
}

}  // namespace
}  // namespace osprey
