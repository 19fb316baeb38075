// CUDA rmsnorm (kernels/cuda/rmsnorm.h) against the CPU reference, with the fused residual add
// and the row gather; shapes from the kernel's constants (256 threads x float4, up to 4096
// channels kept in registers) and gpt-oss's 2880.
#include <gtest/gtest.h>

#include "kernels/cpu/rmsnorm.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda_test_util.h"

namespace osprey {
namespace {

constexpr int kThreads = 256;  // kernels/cuda/rmsnorm.cu

void run_case(int n_tokens, int d, bool with_delta, bool gather) {
    const uint32_t seed = test::fresh_seed();
    const int n_src = gather ? n_tokens + 3 : n_tokens;
    std::vector<float> x = test::random_floats(size_t(n_src) * d, seed, -3.f, 3.f);
    const std::vector<float> delta = test::random_floats(size_t(n_src) * d, seed + 1);
    const std::vector<float> gain = test::random_floats(d, seed + 2, 0.5f, 1.5f);
    std::vector<int32_t> rows(n_tokens);
    // Gathered rows are distinct (each residual row is updated once), in reverse order.
    for (int t = 0; t < n_tokens; ++t) rows[t] = gather ? n_src - 1 - t : t;

    std::vector<float> xin(size_t(n_tokens) * d), want(size_t(n_tokens) * d);
    std::vector<float> x_after = x;
    for (int t = 0; t < n_tokens; ++t)
        for (int c = 0; c < d; ++c) {
            float v = x[size_t(rows[t]) * d + c];
            if (with_delta) v += delta[size_t(rows[t]) * d + c];
            xin[size_t(t) * d + c] = v;
            x_after[size_t(rows[t]) * d + c] = v;
        }
    cpu::rmsnorm(want, xin, gain, n_tokens, d, 1e-5f);

    auto d_x = test::to_device(x);
    auto d_delta = test::to_device(delta);
    auto d_gain = test::to_device(gain);
    auto d_rows = test::to_device(rows);
    auto d_y = test::poisoned<bf16>(size_t(n_tokens) * d);
    cuda::rmsnorm({.y = d_y.get(), .x = d_x.get(), .gain = d_gain.get(), .delta = with_delta ? d_delta.get() : nullptr,
                   .rows = gather ? d_rows.get() : nullptr, .n_tokens = n_tokens, .d = d, .eps = 1e-5f},
                  nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    // One bf16 rounding of the output (2^-9 relative, half an ulp) on top of f32 sums in another
    // order (~1e-6 relative).
    test::expect_close(test::to_float(d_y.download()), test::to_double(want), 1e-6, 1.0 / 256, "rmsnorm y");
    if (with_delta) {  // the residual add is written back exactly (f32 + f32 in both)
        test::expect_close(d_x.download(), test::to_double(x_after), 0.0, 0.0, "rmsnorm residual");
    }
}

TEST(cuda_rmsnorm, fewer_channels_than_threads) { run_case(1, 12, false, false); }
TEST(cuda_rmsnorm, one_vector_step) { run_case(3, kThreads * 4, false, false); }
TEST(cuda_rmsnorm, partial_last_step) { run_case(3, kThreads * 4 + 4, false, false); }
TEST(cuda_rmsnorm, max_channels) { run_case(2, 4096, true, false); }
TEST(cuda_rmsnorm, gpt_oss_shape) { run_case(64, 2880, false, false); }
TEST(cuda_rmsnorm, fused_residual_add) { run_case(37, 2880, true, false); }
TEST(cuda_rmsnorm, gathered_rows) { run_case(5, 2880, false, true); }
TEST(cuda_rmsnorm, gathered_rows_with_residual) { run_case(4, 2880, true, true); }
TEST(cuda_rmsnorm, rejects_bad_width) {
    cuda::DeviceBuffer<float> x(8), g(8);
    cuda::DeviceBuffer<bf16> y(8);
    EXPECT_THROW(cuda::rmsnorm({.y = y.get(), .x = x.get(), .gain = g.get(), .n_tokens = 1, .d = 6}, nullptr), Error);
    EXPECT_THROW(cuda::rmsnorm({.y = y.get(), .x = x.get(), .gain = g.get(), .n_tokens = 1, .d = 8192}, nullptr),
                 Error);
}

}  // namespace
}  // namespace osprey
