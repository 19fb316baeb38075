// The W4A8 reference (kernels/cpu/w4a8_matmul.h): the MXFP4 -> E4M3 weight decode is exact up to a
// 14-binade scale spread inside a 128-k block and rounds (as float_to_e4m3) beyond; the activation
// quantisation stays within half an E4M3 step; the projection matches the exact MXFP4 reference within
// the bound those steps imply, shape by shape (one block, a partial last block, 2880 = 22.5 blocks).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/fp8.h"
#include "core/mxfp4.h"
#include "kernels/cpu/mxfp4_matmul.h"
#include "kernels/cpu/w4a8_matmul.h"

namespace osprey::cpu {
namespace {

TEST(W4a8, weight_code_is_exact_up_to_the_spread_bound) {
    for (int spread = 0; spread <= 40; ++spread)
        for (int n = 0; n < 16; ++n) {
            const float want = std::ldexp(mxfp4::kFp4Values[n], w4a8::kWeightShift - spread);
            const float got = fp8::e4m3_to_float(w4a8::weight_code(uint8_t(n), spread));
            if (spread <= w4a8::kMaxExactSpread) EXPECT_EQ(got, want) << "nibble " << n << " spread " << spread;
            else EXPECT_EQ(got, fp8::e4m3_to_float(fp8::float_to_e4m3(want))) << n << " " << spread;
            EXPECT_LE(std::fabs(got - want), std::ldexp(1.0f, -10)) << n << " " << spread;  // half a subnormal step
        }
    // 15 binades: 0.5 · 2^-9 is a tie between 0 and the smallest subnormal: rounds to even (0).
    EXPECT_EQ(fp8::e4m3_to_float(w4a8::weight_code(1, 15)), 0.0f);
    EXPECT_EQ(fp8::e4m3_to_float(w4a8::weight_code(3, 15)), std::ldexp(1.0f, -8));  // 1.5·2^-9 -> 2·2^-9
}

TEST(W4a8, weight_row_times_multiplier_is_the_mxfp4_row) {
    std::mt19937 rng(7);
    for (int n_in : {32, 64, 128, 192, 2880}) {
        std::vector<uint8_t> blocks(n_in / 2), scales(n_in / 32);
        for (auto& b : blocks) b = uint8_t(rng());
        for (size_t g = 0; g < scales.size(); ++g) scales[g] = uint8_t(100 + rng() % 15);  // spread <= 14
        if (scales.size() > 4) scales[1] = 1, scales[2] = 140;  // spreads of 139 and 25-40 in block 0
        std::vector<float> exact(n_in);
        mxfp4::decode_row(blocks.data(), scales.data(), n_in, exact.data());
        std::vector<uint8_t> codes(n_in), S(w4a8::n_blocks(n_in));
        w4a8::decode_weight_row(codes.data(), S.data(), blocks.data(), scales.data(), n_in);
        for (int k = 0; k < n_in; ++k) {
            const int b = k / 128, g = k / 32;
            const float got = fp8::e4m3_to_float(codes[k]) * w4a8::weight_multiplier(S[b]);
            if (S[b] - scales[g] <= w4a8::kMaxExactSpread) {
                EXPECT_EQ(got, exact[k]) << "n_in " << n_in << " k " << k;
            } else {
                EXPECT_LE(std::fabs(got - exact[k]), std::ldexp(1.0f, -10) * w4a8::weight_multiplier(S[b]));
            }
        }
    }
}

TEST(W4a8, activation_quantisation_within_half_a_step) {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int rows = 3, n = 320;  // 2.5 blocks
    std::vector<float> x(size_t(rows) * n);
    for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * (i % 11 == 0 ? 50.0f : 1.0f);
    for (int k = 128; k < 256; ++k) x[size_t(1) * n + k] = 0.0f;  // an all-zero block
    std::vector<uint8_t> q(x.size());
    std::vector<float> s(size_t(rows) * 3);
    w4a8::quantize_rows(q, s, x, rows, n);
    EXPECT_EQ(s[1 * 3 + 1], 1.0f);
    for (int r = 0; r < rows; ++r)
        for (int k = 0; k < n; ++k) {
            const float xs = s[size_t(r) * 3 + k / 128], v = x[size_t(r) * n + k];
            const float got = fp8::e4m3_to_float(q[size_t(r) * n + k]) * xs;
            // half a step: 2^-4 relative (3 mantissa bits) above 2^-6 · xs, 2^-10 · xs below.
            EXPECT_LE(std::fabs(got - v), std::max(std::fabs(v) / 16, std::ldexp(xs, -10)) * 1.0001f) << r << " " << k;
        }
}

// y of W4A8 against the exact MXFP4 y: |Δ| <= Σ_k |w_k| · (|x_k| / 16 + 2^-10 · xs(kb)) (+ FP32 rounding).
void check_projection(int n_rows, int n_in, int n_out, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> ux(-2.0f, 2.0f);
    std::vector<uint8_t> blocks(size_t(n_out) * n_in / 2), scales(size_t(n_out) * n_in / 32);
    for (auto& b : blocks) b = uint8_t(rng());
    for (auto& s : scales) s = uint8_t(116 + rng() % 7);
    std::vector<float> bias(n_out), x(size_t(n_rows) * n_in);
    for (auto& b : bias) b = ux(rng) / 4;
    for (auto& v : x) v = ux(rng);
    std::vector<float> exact(size_t(n_rows) * n_out), got(exact.size());
    cpu::mxfp4_matmul(exact, x, blocks, scales, bias, n_rows, n_in, n_out);
    cpu::w4a8::mxfp4_matmul(got, x, blocks, scales, bias, n_rows, n_in, n_out);
    std::vector<uint8_t> q(x.size());
    const int nb = w4a8::n_blocks(n_in);
    std::vector<float> xs(size_t(n_rows) * nb), w(n_in);
    w4a8::quantize_rows(q, xs, x, n_rows, n_in);
    for (int o = 0; o < n_out; ++o) {
        mxfp4::decode_row(blocks.data() + size_t(o) * n_in / 2, scales.data() + size_t(o) * n_in / 32, n_in, w.data());
        for (int r = 0; r < n_rows; ++r) {
            double bound = 0, mag = 0;
            for (int k = 0; k < n_in; ++k) {
                const double xv = x[size_t(r) * n_in + k];
                bound += std::fabs(w[k]) * (std::fabs(xv) / 16 + std::ldexp(xs[size_t(r) * nb + k / 128], -10));
                mag += std::fabs(w[k] * xv);
            }
            const double d = std::fabs(double(got[size_t(r) * n_out + o]) - exact[size_t(r) * n_out + o]);
            EXPECT_LE(d, bound + 1e-6 * mag) << "rows " << n_rows << " in " << n_in << " out " << n_out << " r " << r
                                             << " o " << o;
        }
    }
}

TEST(W4a8, projection_within_the_e4m3_bound) {
    check_projection(3, 128, 16, 1);   // one block
    check_projection(2, 64, 8, 2);     // less than one block
    check_projection(4, 192, 24, 3);   // a partial last block
    check_projection(2, 2880, 12, 4);  // gpt-oss: 22.5 blocks
}

// Activations already on the E4M3 grid of their block (amax on the grid: the scale is exact) go through
// unchanged: then W4A8 is the exact MXFP4 projection up to FP32 rounding.
TEST(W4a8, exact_when_activations_are_on_the_grid) {
    std::mt19937 rng(11);
    const int n_rows = 2, n_in = 320, n_out = 10;
    std::vector<uint8_t> blocks(size_t(n_out) * n_in / 2), scales(size_t(n_out) * n_in / 32);
    for (auto& b : blocks) b = uint8_t(rng());
    for (auto& s : scales) s = uint8_t(110 + rng() % 15);
    std::vector<float> x(size_t(n_rows) * n_in), bias(n_out, 0.25f);
    for (size_t i = 0; i < x.size(); ++i) {
        uint8_t c = uint8_t(rng());
        if ((c & 0x7F) == 0x7F) c = 0x7E;
        x[i] = std::ldexp(fp8::e4m3_to_float(c), -6);  // the grid of scale 2^-6
    }
    for (int r = 0; r < n_rows; ++r)
        for (int b = 0; b < 3; ++b) x[size_t(r) * n_in + b * 128] = 7.0f;  // every block's amax: 448 · 2^-6
    std::vector<float> exact(size_t(n_rows) * n_out), got(exact.size());
    cpu::mxfp4_matmul(exact, x, blocks, scales, bias, n_rows, n_in, n_out);
    cpu::w4a8::mxfp4_matmul(got, x, blocks, scales, bias, n_rows, n_in, n_out);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], exact[i], 1e-5 * (1 + std::fabs(exact[i]))) << i;
}

// The relative L2 distance to the exact projection is what E4M3's step predicts: each quantised
// activation is off by at most half a step (2^-4 relative), about 2^-4 / sqrt(3) RMS for uniform
// rounding, and the weights are exact, so a projection of random activations stays below 2^-4 / sqrt(3)
// (the GPU test bounds the mlp1 -> SwiGLU -> mlp2 chain by twice that, tests/kernels/cases/moe_mlp_cases.h).
TEST(W4a8, relative_l2_error_within_the_e4m3_step) {
    std::mt19937 rng(5);
    const int n_rows = 4, n_in = 2880, n_out = 64;
    std::vector<uint8_t> blocks(size_t(n_out) * n_in / 2), scales(size_t(n_out) * n_in / 32);
    for (auto& b : blocks) b = uint8_t(rng());
    for (auto& v : scales) v = uint8_t(116 + rng() % 7);
    std::uniform_real_distribution<float> ux(-2.0f, 2.0f);
    std::vector<float> x(size_t(n_rows) * n_in), bias(n_out, 0.0f);
    for (auto& v : x) v = ux(rng);
    std::vector<float> exact(size_t(n_rows) * n_out), got(exact.size());
    cpu::mxfp4_matmul(exact, x, blocks, scales, bias, n_rows, n_in, n_out);
    cpu::w4a8::mxfp4_matmul(got, x, blocks, scales, bias, n_rows, n_in, n_out);
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) num += std::pow(got[i] - exact[i], 2), den += std::pow(exact[i], 2);
    const double rel = std::sqrt(num / den);
    std::printf("W4A8 vs exact MXFP4, 2880 inputs: relative L2 error %.3g\n", rel);
    EXPECT_LT(rel, 0.0625 / std::sqrt(3.0));
    EXPECT_GT(rel, 1e-4);  // the activations really are quantised
}

}  // namespace
}  // namespace osprey::cpu
