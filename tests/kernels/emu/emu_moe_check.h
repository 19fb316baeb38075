// What the MoE emulation drivers share (emulate_moe_decode, _mid, _matrix, _w4a8, _wgmma): the tally of
// checks and failures, the comparison of a kernel's output with its CPU reference, and random MXFP4
// experts with the reference product.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "kernels/cpu/mxfp4_matmul.h"

namespace osprey::emu {

inline int failures = 0, checks = 0;

// |got - want| <= tol_max · max|want| + tol_rel · |want| everywhere (NaN and infinities fail); on failure the
// worst element is printed, as a multiple of its bound. cols: the row length, for the printed position.
inline void compare(const char* what, const std::string& tag, const std::vector<float>& got,
                    const std::vector<float>& want, int cols, double tol_max, double tol_rel = 0.0) {
    ++checks;
    double mx = 0;
    for (float w : want) mx = std::max(mx, double(std::fabs(w)));
    double worst = -1;
    size_t wi = 0, bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double bound = tol_max * mx + tol_rel * std::fabs(want[i]) + 1e-30;
        const double e = std::isfinite(got[i]) ? std::fabs(double(got[i]) - want[i]) / bound : INFINITY;
        if (!(e <= 1)) ++bad;
        if (!(e <= worst)) worst = e, wi = i;
    }
    if (bad) {
        ++failures;
        std::printf("FAIL %s %s: %zu of %zu bad; worst row %zu col %zu got %g want %g (%.3g x bound, max|want| %g)\n",
                    tag.c_str(), what, bad, got.size(), wi / cols, wi % cols, got[wi], want[wi], worst, mx);
    }
}

// Random MXFP4 experts [e][n_out][n_in] (uniform codes, scale bytes 116..122 with every 37th at the ends of
// the exactly decoded range, 34..63 or 140..160) and BF16 biases in [-0.5, 0.5]. slack: bytes past the
// blocks, drawn but never read by a correct kernel.
struct Mxfp4TestExperts {
    int n_experts, n_out, n_in;
    std::vector<uint8_t> blocks, scales;
    std::vector<bf16> bias;
    std::vector<float> bias_f;
    Mxfp4TestExperts(int e, int n_out_, int n_in_, std::mt19937& rng, size_t slack = 0)
        : n_experts(e), n_out(n_out_), n_in(n_in_) {
        blocks.resize(size_t(e) * n_out * n_in / 2 + slack);
        scales.resize(size_t(e) * n_out * n_in / 32);
        for (auto& b : blocks) b = uint8_t(rng());
        for (auto& s : scales) s = uint8_t(116 + rng() % 7);
        for (size_t i = 0; i < scales.size(); i += 37) scales[i] = uint8_t(rng() % 2 ? 34 + rng() % 30 : 140 + rng() % 21);
        bias.resize(size_t(e) * n_out), bias_f.resize(bias.size());
        std::uniform_real_distribution<float> u(-0.5f, 0.5f);
        for (size_t i = 0; i < bias.size(); ++i) bias[i] = float_to_bf16(u(rng)), bias_f[i] = bf16_to_float(bias[i]);
    }
    // y[n, n_out] = x[n, n_in] · W_eᵀ + b_e (cpu::mxfp4_matmul)
    std::vector<float> matmul(int e, const std::vector<float>& x, int n) const {
        std::vector<float> y(size_t(n) * n_out);
        const size_t bb = size_t(n_out) * n_in / 2, sb = size_t(n_out) * n_in / 32;
        cpu::mxfp4_matmul(y, x, std::span(blocks).subspan(e * bb, bb), std::span(scales).subspan(e * sb, sb),
                          std::span(bias_f).subspan(size_t(e) * n_out, n_out), n, n_in, n_out);
        return y;
    }
    // |W_e| · x + |b_e| (x >= 0): the magnitude a dot product's rounding error scales with.
    std::vector<float> abs_matmul(int e, const std::vector<float>& x) const {
        const size_t bb = size_t(n_out) * n_in / 2, sb = size_t(n_out) * n_in / 32;
        std::vector<uint8_t> b(blocks.begin() + e * bb, blocks.begin() + (e + 1) * bb);
        for (uint8_t& v : b) v &= 0x77;
        std::vector<float> bias_abs(bias_f.begin() + size_t(e) * n_out, bias_f.begin() + size_t(e + 1) * n_out);
        for (float& v : bias_abs) v = std::fabs(v);
        std::vector<float> y(n_out);
        cpu::mxfp4_matmul(y, x, b, std::span(scales).subspan(e * sb, sb), bias_abs, 1, n_in, n_out);
        return y;
    }
};

}  // namespace osprey::emu
