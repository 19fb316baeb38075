// Helpers shared by the CUDA kernel tests: fresh random seeds each run (printed, so a failure can be
// replayed with OSPREY_TEST_SEED), device copies of host vectors, and bf16 <-> float conversion.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/bf16.h"
#include "kernels/cuda/runtime.h"
#include "kernels/kernel_test_util.h"

namespace osprey::test {

// A new seed per call unless OSPREY_TEST_SEED is set; recorded in the test's output.
inline uint32_t fresh_seed() {
    static std::random_device rd;
    uint32_t seed = rd();
    if (const char* s = std::getenv("OSPREY_TEST_SEED")) seed = uint32_t(std::strtoul(s, nullptr, 10));
    ::testing::Test::RecordProperty("seed", std::to_string(seed));
    std::printf("[seed %u]\n", seed);
    return seed;
}

inline std::vector<float> to_float(const std::vector<bf16>& v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_float(v[i]);
    return f;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

template <typename T>
cuda::DeviceBuffer<T> to_device(const std::vector<T>& v) {
    cuda::DeviceBuffer<T> d(v.size());
    d.upload(v);
    return d;
}

// A device buffer of n elements filled with NaN bytes, so that anything not written shows.
template <typename T>
cuda::DeviceBuffer<T> poisoned(size_t n) {
    cuda::DeviceBuffer<T> d(n);
    d.fill_bytes(0xFF);
    return d;
}

}  // namespace osprey::test
