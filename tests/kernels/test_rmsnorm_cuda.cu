// CUDA rmsnorm against the CPU reference: every checked case of the rmsnorm table
// (tests/kernels/cases/rmsnorm_cases.h, shared with bench/bench_rmsnorm.cu), the argument checks, and
// a check of the tables' input generator itself (harness.h), which every kernel test relies on.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cases/gtest_cases.h"
#include "kernels/cases/rmsnorm_cases.h"

namespace osprey {
namespace {

class cuda_rmsnorm_table : public cases::CaseTest {};
TEST_P(cuda_rmsnorm_table, matches_reference) { cases::check_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(cases, cuda_rmsnorm_table, cases::checked(cases::rmsnorm::cases(), cases::rmsnorm::run),
                         cases::case_name);

TEST(cuda_rmsnorm, rejects_bad_width) {
    cuda::DeviceBuffer<float> x(8), g(8);
    cuda::DeviceBuffer<bf16> y(8);
    EXPECT_THROW(cuda::rmsnorm({.y = y.get(), .x = x.get(), .gain = g.get(), .n_tokens = 1, .d = 6}, nullptr), Error);
    EXPECT_THROW(cuda::rmsnorm({.y = y.get(), .x = x.get(), .gain = g.get(), .n_tokens = 1, .d = 8192}, nullptr),
                 Error);
}

// The device generator: values inside [lo, hi), mean and variance of a uniform, bf16 rounded to nearest
// even, distinct streams for distinct seeds, and the host formula (uniform01) reproduced exactly.
TEST(case_harness, device_uniform_is_uniform) {
    const size_t n = 1 << 20;
    const std::vector<float> f = cases::device_uniform<float>(n, 7, -3.f, 5.f).download(n);
    const std::vector<bf16> b = cases::device_uniform<bf16>(n, 7, -3.f, 5.f).download(n);
    const std::vector<float> other = cases::device_uniform<float>(n, 8, -3.f, 5.f).download(n);
    double sum = 0, sum_sq = 0;
    size_t same = 0;
    for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(f[i] >= -3.f && f[i] <= 5.f) << i << ": " << f[i];
        ASSERT_EQ(f[i], -3.f + 8.f * cases::uniform01(7, i)) << i;
        ASSERT_EQ(b[i].bits, float_to_bf16(f[i]).bits) << i;
        sum += f[i], sum_sq += double(f[i]) * f[i];
        same += f[i] == other[i];
    }
    const double mean = sum / n, var = sum_sq / n - mean * mean;
    EXPECT_NEAR(mean, 1.0, 0.02);
    EXPECT_NEAR(var, 64.0 / 12.0, 0.05);
    EXPECT_LT(same, n / 1000);
}

}  // namespace
}  // namespace osprey
