// swiglu_clamped: golden values for the clamps, alpha, the +1 and the gate/up interleaving.
#include <cmath>

#include "core/check.h"
#include "kernel_test_util.h"
#include "kernels/cpu/swiglu.h"

namespace osprey::cpu {
namespace {

double reference(double gate, double up) {
    gate = std::min(gate, 7.0);
    up = std::clamp(up, -7.0, 7.0);
    return gate / (1.0 + std::exp(-1.702 * gate)) * (up + 1.0);
}

TEST(cpu_swiglu, golden_values) {
    // pairs (gate, up), interleaved as in the checkpoint's first expert projection
    const std::vector<float> gate_up = {
        1.0f,   0.0f,    // plain: 1 * sigmoid(1.702) * 1
        10.0f,  0.5f,    // gate clamped above to 7
        -10.0f, 0.5f,    // gate NOT clamped below
        2.0f,   9.0f,    // up clamped to 7 -> factor 8
        2.0f,   -9.0f,   // up clamped to -7 -> factor -6
        -0.5f,  -1.0f,   // up + 1 = 0 -> exactly 0
    };
    std::vector<float> out(6);
    swiglu_clamped(out, gate_up, 2, 3, 1.702f, 7.0f);
    const double want[6] = {
        1.0 / (1.0 + std::exp(-1.702)),
        7.0 / (1.0 + std::exp(-1.702 * 7.0)) * 1.5,
        -10.0 / (1.0 + std::exp(17.02)) * 1.5,
        2.0 / (1.0 + std::exp(-3.404)) * 8.0,
        2.0 / (1.0 + std::exp(-3.404)) * -6.0,
        0.0,
    };
    for (int i = 0; i < 6; ++i) EXPECT_NEAR(out[i], want[i], 1e-6 * std::max(1.0, std::abs(want[i]))) << i;
    EXPECT_NEAR(out[0], 0.845795, 1e-6);  // 1 * sigmoid(1.702)
    EXPECT_LT(out[2], 0.0f);              // the unclamped negative gate leaks a little
    EXPECT_GT(out[2], -1e-5f);
}

TEST(cpu_swiglu, matches_double_on_random_inputs) {
    const int rows = 4, d_ff = 100;
    const auto gate_up = test::random_floats(2 * rows * d_ff, 9, -12.0f, 12.0f);
    std::vector<float> out(rows * d_ff);
    swiglu_clamped(out, gate_up, rows, d_ff, 1.702f, 7.0f);
    std::vector<double> want(out.size());
    for (size_t i = 0; i < out.size(); ++i) want[i] = reference(gate_up[2 * i], gate_up[2 * i + 1]);
    test::expect_close(out, want, 1e-6, 1e-6, "swiglu");
}

TEST(cpu_swiglu, rejects_mismatched_sizes) {
    std::vector<float> out(3), gate_up(5);
    EXPECT_THROW(swiglu_clamped(out, gate_up, 1, 3, 1.702f, 7.0f), Error);
}

}  // namespace
}  // namespace osprey::cpu
