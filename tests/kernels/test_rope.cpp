// rope: half-split rotation (d with d + head_dim/2) against a double-precision loop.
#include "core/check.h"
#include "kernel_test_util.h"
#include "kernels/cpu/rope.h"

namespace osprey::cpu {
namespace {

TEST(cpu_rope, rotates_d_with_d_plus_half) {
    const int n_heads = 3, head_dim = 8, half = 4, n_positions = 10;
    const auto cos = test::random_floats(n_positions * half, 1);
    const auto sin = test::random_floats(n_positions * half, 2);
    const std::vector<int32_t> positions = {0, 9, 4};
    auto x = test::random_floats(positions.size() * n_heads * head_dim, 3);
    const auto x0 = x;
    rope(x, positions, n_heads, head_dim, cos, sin);

    std::vector<double> want(x.size());
    for (size_t t = 0; t < positions.size(); ++t)
        for (int h = 0; h < n_heads; ++h)
            for (int d = 0; d < half; ++d) {
                const size_t base = (t * n_heads + h) * head_dim;
                const double c = cos[positions[t] * half + d], s = sin[positions[t] * half + d];
                want[base + d] = double(x0[base + d]) * c - double(x0[base + d + half]) * s;
                want[base + d + half] = double(x0[base + d + half]) * c + double(x0[base + d]) * s;
            }
    test::expect_close(x, want, 1e-6, 1e-6, "rope");
}

TEST(cpu_rope, identity_table_leaves_x_unchanged) {
    const int head_dim = 64;
    std::vector<float> cos(32, 1.0f), sin(32, 0.0f);
    auto x = test::random_floats(2 * head_dim, 4);
    const auto x0 = x;
    const std::vector<int32_t> positions = {0};
    rope(x, positions, 2, head_dim, cos, sin);
    EXPECT_EQ(x, x0);
}

TEST(cpu_rope, rejects_position_outside_table) {
    std::vector<float> cos(2 * 2), sin(2 * 2), x(4);  // positions 0..1, half dim 2
    const std::vector<int32_t> positions = {2};
    EXPECT_THROW(rope(x, positions, 1, 4, cos, sin), Error);  
    const std::vector<int32_t> negative = {-1};
    EXPECT_THROW(rope(x, negative, 1, 4, cos, sin), Error);
}

}  // namespace
}  // namespace osprey::cpu
