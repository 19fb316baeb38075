// FP8 dense linears (kernels/cuda/linear.h, Fp8Weight) beyond the shared table (test_linear runs the
// table's fp8_* cases against cpu::fp8_matmul): argument checks, determinism, the prefill path's row
// chunks through a small scratch (offsets of y, the bias and strides, a partial last chunk), and the
// prefill path (T > kFp8GemvGroupMaxTokens) inside a CUDA graph (the scratch must be reserved before
// the capture).
#include <gtest/gtest.h>

#include <cstring>

#include "kernels/cases/linear_cases.h"
#include "kernels/cuda_test_util.h"

namespace osprey {
namespace {

using cuda::LinearPath;

// An FP8 problem on the device with its inputs also on the host.
struct Fp8Problem {
    int n = 0, k = 0, t = 0, block_rows = 128;
    std::vector<uint8_t> codes;  // [n, k]
    std::vector<float> scale;    // [ceil(n / block_rows), nb(k)]
    std::vector<bf16> x;         // [t, k]
    std::vector<float> bias;     // [n]
    cuda::DeviceBuffer<uint8_t> d_codes;
    cuda::DeviceBuffer<float> d_scale, d_bias;
    cuda::DeviceBuffer<bf16> d_x;
    cuda::Fp8Weight weight() const { return {.codes = d_codes.get(), .scale = d_scale.get(), .block_rows = block_rows}; }
};

Fp8Problem make_fp8(int n, int k, int t, int block_rows = 128) {
    const uint32_t seed = test::fresh_seed();
    Fp8Problem p;
    p.n = n, p.k = k, p.t = t, p.block_rows = block_rows;
    p.d_codes = cases::linear::device_e4m3(size_t(n) * k, cases::stream_seed(seed, 1));
    p.codes = p.d_codes.download(size_t(n) * k);
    const size_t s_elems = size_t((n + block_rows - 1) / block_rows) * size_t(fp8::n_blocks(k));
    const float base = 1.f / (86.f * std::sqrt(float(k)));
    p.d_scale = cases::device_uniform<float>(s_elems, cases::stream_seed(seed, 2), 0.25f * base, 2.f * base);
    p.scale = p.d_scale.download(s_elems);
    p.d_x = cases::device_uniform<bf16>(size_t(t) * k, cases::stream_seed(seed, 3), -1.f, 1.f);
    p.x = p.d_x.download(size_t(t) * k);
    p.d_bias = cases::device_uniform<float>(n, cases::stream_seed(seed, 4), -1.f, 1.f);
    p.bias = p.d_bias.download(n);
    return p;
}

// y = x · bf16(e4m3 · multiplier)ᵀ + bias: the prefill path's contract (linear.cu).
std::vector<float> rounded_reference(const Fp8Problem& p) {
    std::vector<bf16> w(size_t(p.n) * p.k);
    const int64_t nkb = fp8::n_blocks(p.k);
    for (int j = 0; j < p.n; ++j)
        for (int i = 0; i < p.k; ++i) {
            const size_t e = size_t(j) * p.k + i;
            w[e] = float_to_bf16(fp8::e4m3_to_float(p.codes[e]) * p.scale[size_t(j / p.block_rows) * nkb + i / 128]);
        }
    std::vector<float> y(size_t(p.t) * p.n);
    cpu::matmul_bf16w(y, test::to_float(p.x), w, p.bias, p.t, p.k, p.n);
    return y;
}

TEST(cuda_linear_fp8, rejects_what_it_cannot_do) {
    cuda::Blas blas;
    const Fp8Problem p = make_fp8(16, 64, 2);
    cuda::DeviceBuffer<bf16> w(16 * 64);
    cuda::DeviceBuffer<float> y(4 * 16), res(4 * 64), gain(64);
    const cuda::LinearArgs ok{.y = y.get(), .x = p.d_x.get(), .w8 = p.weight(), .n_tokens = 2, .n_out = 16,
                              .n_in = 64, .y_f32 = true, .path = LinearPath::gemv};
    EXPECT_NO_THROW(blas.linear(ok, nullptr));
    CUDA_CHECK(cudaDeviceSynchronize());
    cuda::LinearArgs a = ok;
    a.w = w.get();  // both weights
    EXPECT_THROW(blas.linear(a, nullptr), Error);
    a = ok, a.w8.scale = nullptr;
    EXPECT_THROW(blas.linear(a, nullptr), Error);
    a = ok, a.w8.block_rows = 0;
    EXPECT_THROW(blas.linear(a, nullptr), Error);
    a = ok, a.w8.block_rows = 129;
    EXPECT_THROW(blas.linear(a, nullptr), Error);
    a = ok, a.n_in = 56;  // the GEMVs read 16 codes at a time: K a multiple of 16
    EXPECT_THROW(blas.linear(a, nullptr), Error);
    a.path = LinearPath::gemv_wide;
    EXPECT_THROW(blas.linear(a, nullptr), Error);
    a.path = LinearPath::automatic;  // ... which the automatic path sends to the prefill path instead
    EXPECT_NO_THROW(blas.linear(a, nullptr));
    CUDA_CHECK(cudaDeviceSynchronize());
    // The norm prologue with K not a multiple of 16
    a = ok, a.x = nullptr, a.n_in = 56, a.path = LinearPath::automatic;
    a.norm = {.res = res.get(), .gain = gain.get()};
    EXPECT_FALSE(cuda::gemv_norm_supported(2, 56, /*fp8_weight=*/true));
    EXPECT_TRUE(cuda::gemv_norm_supported(2, 56, /*fp8_weight=*/false));
    EXPECT_THROW(blas.linear(a, nullptr), Error);
}

// Two identical calls are bit-identical (fixed reduction order), on both GEMVs.
TEST(cuda_linear_fp8, gemvs_are_deterministic) {
    cuda::Blas blas;
    for (const auto& [n, k, path] : {std::tuple{5120, 2880, LinearPath::gemv}, std::tuple{2880, 4096, LinearPath::gemv},
                                     std::tuple{20000, 2880, LinearPath::gemv_wide}})
        for (const int t : {1, 8}) {
            const Fp8Problem p = make_fp8(n, k, t);
            auto once = [&] {
                auto y = cases::poisoned<float>(size_t(t) * n);
                blas.linear({.y = y.get(), .x = p.d_x.get(), .w8 = p.weight(), .n_tokens = t, .n_out = n, .n_in = k,
                             .y_f32 = true, .path = path},
                            nullptr);
                CUDA_CHECK(cudaDeviceSynchronize());
                return y.download(size_t(t) * n);
            };
            const std::vector<float> a = once(), b = once();
            EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "N=" << n << " T=" << t;
        }
}

// The prefill path through a scratch of 10 rows: 21 chunks for 203 rows (the last of 3), each writing
// its columns of a strided, accumulated y with its slice of the bias; and a multiplier grid of 64 rows.
TEST(cuda_linear_fp8, prefill_chunks_through_a_small_scratch) {
    for (const int block_rows : {128, 64}) {
        cuda::Blas blas;
        const int n = 203, k = 272, t = 12, ldy = 211;
        blas.reserve_fp8_scratch(size_t(10) * k * sizeof(bf16));
        const Fp8Problem p = make_fp8(n, k, t, block_rows);
        auto y = cases::device_uniform<float>(size_t(t) * ldy, 99, -1.f, 1.f);
        const std::vector<float> y0 = y.download(size_t(t) * ldy);
        blas.linear({.y = y.get(), .x = p.d_x.get(), .w8 = p.weight(), .bias = p.d_bias.get(), .n_tokens = t,
                     .n_out = n, .n_in = k, .ldy = ldy, .y_f32 = true, .accumulate = true,
                     .path = LinearPath::blas},
                    nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> got = y.download(size_t(t) * ldy), want = rounded_reference(p);
        double worst = 0;
        size_t untouched_changed = 0;
        for (int i = 0; i < t; ++i)
            for (int j = 0; j < ldy; ++j) {
                const size_t e = size_t(i) * ldy + j;
                if (j >= n) {
                    untouched_changed += std::memcmp(&got[e], &y0[e], 4) != 0;
                    continue;
                }
                const double ref = double(y0[e]) + want[size_t(i) * n + j];
                worst = std::max(worst, std::abs(got[e] - ref) / (1e-4 + 1e-5 * std::abs(ref)));
            }
        EXPECT_LE(worst, 1.0) << "block_rows " << block_rows << ": worst error / bound";
        EXPECT_EQ(untouched_changed, 0u) << "columns past N written";
    }
}

// A CUDA graph holding the prefill path replays what the eager call computes; capturing it before the
// scratch exists is refused (a capture cannot allocate).
TEST(cuda_linear_fp8, prefill_path_in_a_graph) {
    const Fp8Problem p = make_fp8(300, 144, 40);
    cuda::Stream stream;
    auto y = cases::poisoned<float>(size_t(40) * 300);
    const cuda::LinearArgs a{.y = y.get(), .x = p.d_x.get(), .w8 = p.weight(), .bias = p.d_bias.get(),
                             .n_tokens = 40, .n_out = 300, .n_in = 144, .y_f32 = true};  // 40 > 32: prefill path
    {
        cuda::Blas blas;
        cuda::Graph g;
        EXPECT_THROW(g.capture(stream, [&] { blas.linear(a, stream); }), Error);
    }
    cuda::Blas blas;
    blas.reserve_fp8_scratch();
    blas.linear(a, stream);  // eager: the reference, and the cuBLASLt plans
    stream.sync();
    const std::vector<float> eager = y.download(size_t(40) * 300);
    y.fill_bytes(0xFF);
    cuda::Graph g;
    g.capture(stream, [&] { blas.linear(a, stream); });
    g.replay(stream);
    stream.sync();
    const std::vector<float> replayed = y.download(size_t(40) * 300);
    EXPECT_EQ(std::memcmp(eager.data(), replayed.data(), eager.size() * sizeof(float)), 0);
    const std::vector<float> want = rounded_reference(p);
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i)
        worst = std::max(worst, std::abs(double(eager[i]) - want[i]) / (1e-4 + 1e-5 * std::abs(want[i])));
    EXPECT_LE(worst, 1.0);
}

}  // namespace
}  // namespace osprey
