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

// Argument checks and the GEMV path's edge cases: test_gemv.cu.

}  // namespace
}  // namespace osprey
