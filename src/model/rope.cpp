#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/check.h"

namespace osprey::model {

namespace {

// Rotation-dimension index at which a wavelength completes `n_rotations` turns over the original
// context: (dim/2) · ln(L0 / (n_rotations · 2π)) / ln(theta).
double correction_dim(double n_rotations, int head_dim, double theta, int original_context) {
    return head_dim * std::log(original_context / (n_rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
}

}  // namespace

YarnFrequencies YarnFrequencies::from_config(const Config& c) {
    OSPREY_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, "rope: head_dim must be even and positive, got ",
                 c.head_dim);
    OSPREY_CHECK(c.rope_theta > 1.0, "rope: rope_theta must be > 1, got ", c.rope_theta);
    OSPREY_CHECK(c.rope_factor >= 1.0, "rope: rope scaling factor must be >= 1, got ", c.rope_factor);
    OSPREY_CHECK(c.rope_original_context > 0, "rope: original context must be positive, got ",
                 c.rope_original_context);
    const int half = c.head_dim / 2;
    YarnFrequencies f;
    f.low = correction_dim(c.rope_beta_fast, c.head_dim, c.rope_theta, c.rope_original_context);
    f.high = correction_dim(c.rope_beta_slow, c.head_dim, c.rope_theta, c.rope_original_context);
    if (c.rope_truncate) {
        f.low = std::floor(f.low);
        f.high = std::ceil(f.high);
    }
    f.low = std::max(f.low, 0.0);
    f.high = std::min(f.high, double(c.head_dim - 1));
    double span = f.high - f.low;
    if (span == 0.0) span = 0.001;  // as the references: avoid a division by zero
    f.concentration = c.rope_factor > 1.0 ? 0.1 * std::log(c.rope_factor) + 1.0 : 1.0;

    // FP32 throughout, in the reference's order of operations.
    const float theta = float(c.rope_theta), factor = float(c.rope_factor);
    const float low = float(f.low), span_f = float(span);
    f.inv_freq.resize(half);
    for (int d = 0; d < half; ++d) {
        const float base_pow = std::pow(theta, float(2 * d) / float(c.head_dim));
        const float extrapolation = 1.0f / base_pow;
        const float interpolation = 1.0f / (factor * base_pow);
        const float ramp = std::clamp((float(d) - low) / span_f, 0.0f, 1.0f);
        const float w = 1.0f - ramp;  // weight of the extrapolated (unscaled) frequency
        f.inv_freq[d] = interpolation * (1.0f - w) + extrapolation * w;
    }
    return f;
}

RopeTable::RopeTable(const Config& c, int n_positions)
    : freq_(YarnFrequencies::from_config(c)), half_dim_(c.head_dim / 2), max_positions_(c.max_position) {
    reserve(n_positions);
}

void RopeTable::reserve(int n_positions) {
    OSPREY_CHECK(n_positions <= max_positions_, "rope: position ", n_positions - 1,
                 " is past the model's maximum of ", max_positions_, " positions");
    if (n_positions <= n_positions_) return;
    cos_.resize(size_t(n_positions) * half_dim_);
    sin_.resize(size_t(n_positions) * half_dim_);
    const float concentration = float(freq_.concentration);
    for (int p = n_positions_; p < n_positions; ++p)
        for (int d = 0; d < half_dim_; ++d) {
            const float angle = float(p) * freq_.inv_freq[d];  // FP32 product, as the references
            cos_[size_t(p) * half_dim_ + d] = float(std::cos(double(angle))) * concentration;
            sin_[size_t(p) * half_dim_ + d] = float(std::sin(double(angle))) * concentration;
        }
    n_positions_ = n_positions;
}

}  // namespace osprey::model
