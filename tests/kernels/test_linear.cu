// cuBLASLt linear (kernels/cuda/linear.h) against the CPU reference matmul (kernels/cpu/matmul.h):
// small and real gpt-oss shapes (qkv 5120x2880, out 2880x4096, router 32x2880, unembedding
// 201088x2880 to f32), bias and residual-accumulate epilogues, strided rows.
#include <gtest/gtest.h>

#include "kernels/cpu/matmul.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda_test_util.h"

namespace osprey {
namespace {

struct LinearCase {
    int t, n, k;
    bool bias = true;
    bool f32 = false;
    bool accumulate = false;
    int ldx = 0, ldy = 0;
    cuda::LinearPath path = cuda::LinearPath::automatic;
};

void run_case(const LinearCase& c) {
    const uint32_t seed = test::fresh_seed();
    const int ldx = c.ldx ? c.ldx : c.k, ldy = c.ldy ? c.ldy : c.n;
    const float w_scale = 1.0f / std::sqrt(float(c.k));
    const std::vector<bf16> x = test::random_bf16(size_t(c.t) * ldx, seed);
    const std::vector<bf16> w = test::random_bf16(size_t(c.n) * c.k, seed + 1, -w_scale, w_scale);
    const std::vector<bf16> b = test::random_bf16(c.n, seed + 2);
    const std::vector<float> y0 = test::random_floats(size_t(c.t) * ldy, seed + 3);

    // Reference on the dense (unstrided) x, from the exact bf16 values.
    std::vector<float> xf(size_t(c.t) * c.k), want(size_t(c.t) * c.n);
    for (int t = 0; t < c.t; ++t)
        for (int i = 0; i < c.k; ++i) xf[size_t(t) * c.k + i] = bf16_to_float(x[size_t(t) * ldx + i]);
    const std::vector<float> bf = c.bias ? test::to_float(b) : std::vector<float>{};
    cpu::matmul_bf16w(want, xf, w, bf, c.t, c.k, c.n);

    auto d_x = test::to_device(x);
    auto d_w = test::to_device(w);
    auto d_b = test::to_device(b);
    auto d_bf = test::to_device(test::to_float(b));  // f32 outputs take an f32 bias
    cuda::Blas blas;
    cuda::LinearArgs a{.x = d_x.get(), .w = d_w.get(), .bias = !c.bias ? nullptr : c.f32 ? (const void*)d_bf.get() : (const void*)d_b.get(), .n_tokens = c.t,
                       .n_out = c.n, .n_in = c.k, .ldx = c.ldx, .ldy = c.ldy, .y_f32 = c.f32,
                       .accumulate = c.accumulate, .path = c.path};
    std::vector<float> got(size_t(c.t) * c.n);
    std::vector<double> ref(want.size());
    if (c.f32) {
        auto d_y = c.accumulate ? test::to_device(y0) : test::poisoned<float>(y0.size());
        a.y = d_y.get();
        blas.linear(a, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> y = d_y.download();
        for (int t = 0; t < c.t; ++t)
            for (int j = 0; j < c.n; ++j) got[size_t(t) * c.n + j] = y[size_t(t) * ldy + j];
    } else {
        std::vector<bf16> y0b(y0.size());
        for (size_t i = 0; i < y0.size(); ++i) y0b[i] = float_to_bf16(y0[i]);
        auto d_y = c.accumulate ? test::to_device(y0b) : test::poisoned<bf16>(y0.size());
        a.y = d_y.get();
        blas.linear(a, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<bf16> y = d_y.download();
        for (int t = 0; t < c.t; ++t)
            for (int j = 0; j < c.n; ++j) got[size_t(t) * c.n + j] = bf16_to_float(y[size_t(t) * ldy + j]);
    }
    for (int t = 0; t < c.t; ++t)
        for (int j = 0; j < c.n; ++j) {
            double v = want[size_t(t) * c.n + j];
            if (c.accumulate) v += c.f32 ? y0[size_t(t) * ldy + j] : round_to_bf16(y0[size_t(t) * ldy + j]);
            ref[size_t(t) * c.n + j] = v;
        }
    // FP32 accumulation in another order than the reference: ~1e-6 relative of the sum of |terms|
    // (<= 1 here), so 1e-4 absolute covers it; a bf16 output adds one rounding (2^-8 relative).
    const double rel = c.f32 ? 1e-5 : 1.0 / 256;
    test::expect_close(got, ref, 1e-4, rel, "linear");
}

TEST(cuda_linear, tiny_shape) { run_case({.t = 1, .n = 24, .k = 40}); }
TEST(cuda_linear, no_bias) { run_case({.t = 5, .n = 24, .k = 40, .bias = false}); }
TEST(cuda_linear, qkv_decode) { run_case({.t = 1, .n = 5120, .k = 2880}); }
TEST(cuda_linear, qkv_prefill) { run_case({.t = 77, .n = 5120, .k = 2880}); }
TEST(cuda_linear, out_proj_accumulates_residual_f32) {
    run_case({.t = 33, .n = 2880, .k = 4096, .f32 = true, .accumulate = true});
}
TEST(cuda_linear, accumulate_f32_small) { run_case({.t = 9, .n = 64, .k = 128, .f32 = true, .accumulate = true}); }
TEST(cuda_linear, rejects_accumulate_into_bf16) {
    cuda::Blas blas;
    cuda::DeviceBuffer<bf16> x(64), w(64), y(64);
    EXPECT_THROW(blas.linear({.y = y.get(), .x = x.get(), .w = w.get(), .n_tokens = 8, .n_out = 8, .n_in = 8,
                              .accumulate = true},
                             nullptr),
                 Error);
}
TEST(cuda_linear, router_shape_f32) { run_case({.t = 300, .n = 128, .k = 2880, .f32 = true}); }
TEST(cuda_linear, strided_rows) { run_case({.t = 6, .n = 96, .k = 64, .ldx = 80, .ldy = 112}); }
TEST(cuda_linear, unembedding_f32) { run_case({.t = 2, .n = 201088, .k = 2880, .bias = false, .f32 = true}); }

// Both paths on the decode shapes (automatic picks GEMV for <= kGemvMaxTokens tokens).
constexpr auto kBlas = cuda::LinearPath::blas;
constexpr auto kGemv = cuda::LinearPath::gemv;
TEST(cuda_linear, blas_qkv_decode) { run_case({.t = 1, .n = 5120, .k = 2880, .path = kBlas}); }
TEST(cuda_linear, gemv_one_token) { run_case({.t = 1, .n = 5120, .k = 2880, .path = kGemv}); }
TEST(cuda_linear, gemv_three_tokens_short_row) { run_case({.t = 3, .n = 13, .k = 8, .path = kGemv}); }
TEST(cuda_linear, gemv_max_tokens_f32_residual) {
    run_case({.t = cuda::kGemvMaxTokens, .n = 2880, .k = 4096, .f32 = true, .accumulate = true, .path = kGemv});
}
TEST(cuda_linear, gemv_router_f32) { run_case({.t = 4, .n = 32, .k = 2880, .f32 = true, .path = kGemv}); }
TEST(cuda_linear, gemv_strided) { run_case({.t = 5, .n = 100, .k = 64, .ldx = 72, .ldy = 130, .path = kGemv}); }
TEST(cuda_linear, gemv_rejects_too_many_tokens) {
    cuda::Blas blas;
    cuda::DeviceBuffer<bf16> x(64 * 16), w(64 * 16), y(64 * 16);
    EXPECT_THROW(blas.linear({.y = y.get(), .x = x.get(), .w = w.get(), .n_tokens = cuda::kGemvMaxTokens + 1,
                              .n_out = 8, .n_in = 64, .path = kGemv},
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
