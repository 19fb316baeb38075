// cuBLASLt and GEMV linears against the CPU reference matmul: every checked case of the linear table
// (tests/kernels/cases/linear_cases.h, shared with bench/bench_linear.cu), plus the argument checks.
#include <gtest/gtest.h>

#include "kernels/cases/gtest_cases.h"
#include "kernels/cases/linear_cases.h"

namespace osprey {
namespace {

class cuda_linear_table : public cases::CaseTest {};
TEST_P(cuda_linear_table, matches_reference) { cases::check_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(cases, cuda_linear_table, cases::checked(cases::linear::cases(), cases::linear::run),
                         cases::case_name);

TEST(cuda_linear, rejects_accumulate_into_bf16) {
    cuda::Blas blas;
    cuda::DeviceBuffer<bf16> x(64), w(64), y(64);
    EXPECT_THROW(blas.linear({.y = y.get(), .x = x.get(), .w = w.get(), .n_tokens = 8, .n_out = 8, .n_in = 8,
                              .accumulate = true},
                             nullptr),
                 Error);
}
TEST(cuda_linear, gemv_rejects_too_many_tokens) {
    cuda::Blas blas;
    cuda::DeviceBuffer<bf16> x(64 * 16), w(64 * 16), y(64 * 16);
    EXPECT_THROW(blas.linear({.y = y.get(), .x = x.get(), .w = w.get(), .n_tokens = cuda::kGemvMaxTokens + 1,
                              .n_out = 8, .n_in = 64, .path = cuda::LinearPath::gemv},
                             nullptr),
                 Error);
}
TEST(cuda_linear, rejects_empty_shape) {
    cuda::Blas blas;
    cuda::LinearArgs a{};
    EXPECT_THROW(blas.linear(a, nullptr), Error);
}

}  // namespace
}  // namespace osprey
