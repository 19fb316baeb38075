// rmsnorm against a double-precision loop.
#include <cmath>

#include "core/check.h"
#include "kernel_test_util.h"
#include "kernels/cpu/rmsnorm.h"

namespace osprey::cpu {
namespace {

std::vector<double> naive_rmsnorm(const std::vector<float>& x, const std::vector<float>& g, int rows, int n,
                                  double eps) {
    std::vector<double> y(x.size());
    for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int i = 0; i < n; ++i) ss += double(x[r * n + i]) * x[r * n + i];
        const double inv = 1.0 / std::sqrt(ss / n + eps);
        for (int i = 0; i < n; ++i) y[r * n + i] = x[r * n + i] * inv * g[i];
    }
    return y;
}

TEST(cpu_rmsnorm, matches_double_loop) {
    for (int n : {1, 7, 64, 2880}) {
        const int rows = 5;
        const auto x = test::random_floats(size_t(rows) * n, 1, -3.0f, 3.0f);
        const auto g = test::random_floats(n, 2, 0.5f, 1.5f);
        std::vector<float> y(x.size());
        rmsnorm(y, x, g, rows, n, 1e-5f);
        test::expect_close(y, naive_rmsnorm(x, g, rows, n, 1e-5), 1e-6, 1e-6, "rmsnorm n=" + std::to_string(n));
    }
}

TEST(cpu_rmsnorm, in_place_and_eps_matters_for_tiny_inputs) {
    std::vector<float> x(16, 1e-4f);
    const std::vector<float> g(16, 1.0f);
    const auto want = naive_rmsnorm(x, g, 1, 16, 1e-5);
    rmsnorm(x, x, g, 1, 16, 1e-5f);
    test::expect_close(x, want, 1e-7, 1e-6, "in place");
    EXPECT_LT(x[0], 0.05f);  // eps dominates mean(x^2) = 1e-8, so the output stays small, not ~1
}

TEST(cpu_rmsnorm, rejects_mismatched_sizes) {
    std::vector<float> x(10), y(10), g(4);
    EXPECT_THROW(rmsnorm(y, x, g, 2, 5, 1e-5f), Error);
    std::vector<float> g5(5), y9(9);
    EXPECT_THROW(rmsnorm(y9, x, g5, 2, 5, 1e-5f), Error);
}

}  // namespace
}  // namespace osprey::cpu
