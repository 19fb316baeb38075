// CUDA sink attention over the paged KV cache and the K/V store against the CPU reference: every
// checked case of the attention table (tests/kernels/cases/attention_cases.h, shared with
// bench/bench_attention.cu), plus the argument checks.
#include <gtest/gtest.h>

#include "kernels/cases/attention_cases.h"
#include "kernels/cases/gtest_cases.h"

namespace osprey {
namespace {

class cuda_attention_table : public cases::CaseTest {};
TEST_P(cuda_attention_table, matches_reference) { cases::check_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(cases, cuda_attention_table,
                         cases::checked(cases::attention::cases(), cases::attention::run), cases::case_name);

TEST(cuda_attention, rejects_wrong_group) {
    cuda::AttnArgs a{.n_q_heads = 16, .n_kv_heads = 8, .head_dim = 64};
    EXPECT_THROW(cuda::attention(a, {}, nullptr), Error);
}

}  // namespace
}  // namespace osprey
