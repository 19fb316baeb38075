// CUDA RoPE against the CPU reference with gpt-oss's YaRN table: every checked case of the rope table
// (tests/kernels/cases/rope_cases.h, shared with bench/bench_rope.cu), plus the argument checks.
#include <gtest/gtest.h>

#include "kernels/cases/gtest_cases.h"
#include "kernels/cases/rope_cases.h"

namespace osprey {
namespace {

class cuda_rope_table : public cases::CaseTest {};
TEST_P(cuda_rope_table, matches_reference) { cases::check_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(cases, cuda_rope_table, cases::checked(cases::rope::cases(), cases::rope::run),
                         cases::case_name);

TEST(cuda_rope, rejects_short_row) {
    cuda::DeviceBuffer<bf16> qkv(64);
    cuda::DeviceBuffer<int32_t> pos(1);
    cuda::DeviceBuffer<float> cs(32);
    EXPECT_THROW(cuda::rope({.qkv = qkv.get(), .positions = pos.get(), .cos = cs.get(), .sin = cs.get(), .n_tokens = 1,
                             .ld = 64, .n_q_heads = 1, .n_kv_heads = 1, .head_dim = 64},
                            nullptr),
                 Error);
}

}  // namespace
}  // namespace osprey
