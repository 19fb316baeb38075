// Helpers shared by the CPU kernel tests: seeded random data and a worst-element comparison.
#pragma once

#include <cmath>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/bf16.h"

namespace osprey::test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

inline std::vector<bf16> random_bf16(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::vector<bf16> v(n);
    const std::vector<float> f = random_floats(n, seed, lo, hi);
    for (size_t i = 0; i < n; ++i) v[i] = float_to_bf16(f[i]);
    return v;
}

// Expects |got - want| <= abs + rel * |want| everywhere; reports the worst element. NaN never passes.
inline void expect_close(std::span<const float> got, std::span<const double> want, double abs, double rel,
                         const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = -1.0;
    size_t worst_i = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::abs(double(got[i]) - want[i]) - (abs + rel * std::abs(want[i]));
        if (std::isnan(got[i]) || std::isnan(err)) {
            ADD_FAILURE() << what << ": NaN at " << i;
            return;
        }
        if (err > worst) {
            worst = err;
            worst_i = i;
        }
    }
    EXPECT_LE(worst, 0.0) << what << ": worst element " << worst_i << " got " << got[worst_i] << " want "
                          << want[worst_i];
}

}  // namespace osprey::test
