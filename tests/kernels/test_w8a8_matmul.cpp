// The W8A8 reference (kernels/cpu/w8a8_matmul.h): on the dequantised activations it is fp8_matmul
// (the promotion P · ws · xs is the k-block's dequantised partial sum), it reads windows with their
// block multipliers, refuses a window whose k-blocks are not the activations', and against W8A16
// (fp8_matmul on the FP32 activations) it moves the output by the E4M3 rounding of the activations only.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/check.h"
#include "core/fp8.h"
#include "kernels/cpu/fp8_matmul.h"
#include "kernels/cpu/w4a8_matmul.h"
#include "kernels/cpu/w8a8_matmul.h"

namespace osprey::cpu {
namespace {

// A block-quantised [rows, cols] matrix of normal values (block multipliers spread over a few binades).
struct Fp8Weights {
    int rows, cols;
    std::vector<uint8_t> q;
    std::vector<float> s;
    Fp8Weights(int rows_, int cols_, std::mt19937& rng) : rows(rows_), cols(cols_) {
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> w(size_t(rows) * cols);
        for (size_t i = 0; i < w.size(); ++i) w[i] = nd(rng) * std::ldexp(1.0f, -int((i / cols) % 5));
        q.resize(w.size());
        s.resize(size_t(fp8::n_blocks(rows) * fp8::n_blocks(cols)));
        for (int b = 0; b < fp8::n_blocks(rows); ++b) {
            const int r0 = b * 128, nr = std::min(128, rows - r0);
            fp8::quantize_band(w.data() + size_t(r0) * cols, nr, cols, q.data() + size_t(r0) * cols,
                               s.data() + size_t(b) * fp8::n_blocks(cols));
        }
    }
    Fp8Matrix view(int64_t row0 = 0, int64_t col0 = 0) const {
        return {.data = q.data(), .scale_inv = s.data(), .ld = cols, .row0 = row0, .col0 = col0};
    }
};

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
        den += double(want[i]) * want[i];
    }
    return std::sqrt(num / den);
}

TEST(W8a8, equals_fp8_matmul_on_the_dequantised_activations) {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> ux(-2.0f, 2.0f);
    for (auto [rows, n_in, n_out] : std::vector<std::array<int, 3>>{{1, 128, 64}, {5, 192, 200}, {3, 2880, 160}}) {
        const Fp8Weights w(n_out, n_in, rng);
        std::vector<float> x(size_t(rows) * n_in), bias(n_out);
        for (float& v : x) v = ux(rng);
        for (int c = 0; c < std::min(128, n_in); ++c) x[c] = 0.0f;  // an all-zero block (scale 1)
        for (float& b : bias) b = ux(rng);
        std::vector<uint8_t> xq(x.size());
        std::vector<float> xs(size_t(rows) * w4a8::n_blocks(n_in));
        w4a8::quantize_rows(xq, xs, x, rows, n_in);
        std::vector<float> xd(x.size());  // the activations W8A8 really multiplies
        for (int r = 0; r < rows; ++r)
            for (int k = 0; k < n_in; ++k)
                xd[size_t(r) * n_in + k] =
                    fp8::e4m3_to_float(xq[size_t(r) * n_in + k]) * xs[size_t(r) * w4a8::n_blocks(n_in) + k / 128];
        std::vector<float> got(size_t(rows) * n_out), want(got.size()), direct(got.size());
        w8a8::matmul(got, xq, xs, w.view(), bias, rows, n_in, n_out);
        fp8_matmul(want, xd, w.view(), bias, rows, n_in, n_out);
        w8a8::fp8_matmul(direct, x, w.view(), bias, rows, n_in, n_out);
        double max_want = 0;
        for (float v : want) max_want = std::max(max_want, double(std::fabs(v)));
        for (size_t i = 0; i < got.size(); ++i) {
            EXPECT_NEAR(got[i], want[i], 1e-5 * max_want) << rows << "x" << n_in << "x" << n_out << " at " << i;
            EXPECT_EQ(got[i], direct[i]) << i;  // quantize_rows + matmul is fp8_matmul
        }
    }
}

TEST(W8a8, window_reads_its_rows_and_aligned_columns) {
    std::mt19937 rng(5);
    const Fp8Weights w(384, 512, rng);  // a window: rows [130, 130 + 200), columns [256, 512)
    const int rows = 4, n_in = 256, n_out = 200;
    std::vector<float> x(size_t(rows) * n_in);
    std::uniform_real_distribution<float> ux(-1.0f, 1.0f);
    for (float& v : x) v = ux(rng);
    std::vector<float> got(size_t(rows) * n_out), want(got.size());
    w8a8::fp8_matmul(got, x, w.view(130, 256), {}, rows, n_in, n_out);
    // The same rows and columns with their multipliers, cut out as a matrix of its own.
    std::vector<uint8_t> q(size_t(n_out) * n_in);
    std::vector<float> s(size_t(fp8::n_blocks(n_out) * 2), 0.0f);
    std::vector<float> ref(size_t(rows) * n_out);
    for (int o = 0; o < n_out; ++o) {
        for (int k = 0; k < n_in; ++k) q[size_t(o) * n_in + k] = w.q[size_t(130 + o) * 512 + 256 + k];
        const Fp8Matrix one{.data = q.data() + size_t(o) * n_in, .scale_inv = w.s.data() + ((130 + o) / 128) * 4 + 2,
                            .ld = n_in};
        std::vector<float> y1(rows);
        w8a8::fp8_matmul(y1, x, one, {}, rows, n_in, 1);
        for (int r = 0; r < rows; ++r) ref[size_t(r) * n_out + o] = y1[r];
    }
    EXPECT_EQ(got, ref);
    EXPECT_THROW(w8a8::fp8_matmul(got, x, w.view(130, 64), {}, rows, n_in, n_out), Error);  // k-blocks misaligned
}

// Against W8A16 on the same FP8 weights: the activations' E4M3 rounding alone (RMS 2^-4 / sqrt(3) =
// 3.6e-2 relative per element; a 2880-input projection of uniform activations averages it down).
TEST(W8a8, relative_l2_error_within_the_e4m3_step) {
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> ux(-2.0f, 2.0f);
    const int rows = 16, n_in = 2880, n_out = 256;
    const Fp8Weights w(n_out, n_in, rng);
    std::vector<float> x(size_t(rows) * n_in);
    for (float& v : x) v = ux(rng);
    std::vector<float> w8a8_y(size_t(rows) * n_out), w8a16_y(w8a8_y.size());
    w8a8::fp8_matmul(w8a8_y, x, w.view(), {}, rows, n_in, n_out);
    fp8_matmul(w8a16_y, x, w.view(), {}, rows, n_in, n_out);
    const double err = rel_l2(w8a8_y, w8a16_y);
    std::printf("  W8A8 vs W8A16 (2880 inputs): relative L2 %.3e\n", err);
    EXPECT_GT(err, 1e-3);  // the activations really were quantised
    EXPECT_LT(err, 0.0625 / std::sqrt(3.0));
}

}  // namespace
}  // namespace osprey::cpu
