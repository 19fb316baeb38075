// Elementwise accumulation into the residual stream.
#pragma once

#include <span>

namespace osprey::cpu {

// x[i] += y[i]. x, y: [n].
void add(std::span<float> x, std::span<const float> y);

// x[i] += scale * y[i]. x, y: [n]. (The weighted combine of expert outputs.)
void add_scaled(std::span<float> x, std::span<const float> y, float scale);

}  // namespace osprey::cpu
