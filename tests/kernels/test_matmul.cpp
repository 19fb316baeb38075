// matmul_bf16w against a double-precision loop over the exactly widened weights.
#include "core/check.h"
#include "kernel_test_util.h"
#include "kernels/cpu/matmul.h"

namespace osprey::cpu {
namespace {

void check_shape(int rows, int n_in, int n_out, bool with_bias) {
    const auto x = test::random_floats(size_t(rows) * n_in, 10 + n_in, -2.0f, 2.0f);
    const auto w = test::random_bf16(size_t(n_out) * n_in, 20 + n_out);
    const auto b = with_bias ? test::random_floats(n_out, 30) : std::vector<float>{};
    std::vector<float> y(size_t(rows) * n_out);
    matmul_bf16w(y, x, w, b, rows, n_in, n_out);

    std::vector<double> want(y.size());
    double max_abs_term = 0;  // FP32 accumulation error scales with sum |x_i w_i|
    for (int r = 0; r < rows; ++r)
        for (int o = 0; o < n_out; ++o) {
            double s = with_bias ? b[o] : 0.0, mag = 0;
            for (int i = 0; i < n_in; ++i) {
                const double t = double(x[size_t(r) * n_in + i]) * bf16_to_float(w[size_t(o) * n_in + i]);
                s += t;
                mag += std::abs(t);
            }
            want[size_t(r) * n_out + o] = s;
            max_abs_term = std::max(max_abs_term, mag);
        }
    test::expect_close(y, want, 4e-7 * max_abs_term, 0.0,
                       "matmul " + std::to_string(rows) + "x" + std::to_string(n_in) + "->" + std::to_string(n_out));
}

TEST(cpu_matmul, matches_double_loop_on_many_shapes) {
    check_shape(1, 1, 1, true);
    check_shape(1, 15, 3, false);
    check_shape(3, 17, 33, true);
    check_shape(1, 2880, 64, true);
    check_shape(7, 64, 1000, false);
    check_shape(2, 4096, 40, true);
}

TEST(cpu_matmul, result_does_not_depend_on_batch) {
    const int n_in = 300, n_out = 50;
    const auto x = test::random_floats(4 * n_in, 5);
    const auto w = test::random_bf16(n_out * n_in, 6);
    std::vector<float> all(4 * n_out), one(n_out);
    matmul_bf16w(all, x, w, {}, 4, n_in, n_out);
    matmul_bf16w(one, std::span(x).subspan(2 * n_in, n_in), w, {}, 1, n_in, n_out);
    for (int o = 0; o < n_out; ++o) EXPECT_EQ(one[o], all[2 * n_out + o]);
}

TEST(cpu_matmul, rejects_mismatched_sizes) {
    std::vector<float> x(6), y(4), y5(5), b3(3);
    std::vector<bf16> w(6), w5(5);
    matmul_bf16w(y, x, w, {}, 2, 3, 2);                           // consistent: no throw
    EXPECT_THROW(matmul_bf16w(y5, x, w, {}, 2, 3, 2), Error);     // y is not [2, 2]
    EXPECT_THROW(matmul_bf16w(y, x, w5, {}, 2, 3, 2), Error);     // w is not [2, 3]
    EXPECT_THROW(matmul_bf16w(y, x, w, b3, 2, 3, 2), Error);      // bias is not [2]
    EXPECT_THROW(matmul_bf16w(y, x, w, {}, 2, 0, 2), Error);      // empty input dimension
}

}  // namespace
}  // namespace osprey::cpu
