// YaRN rotary-embedding frequencies and the cos/sin table (spec §3.4), shared by the CPU reference
// and the CUDA path. Computed in FP32 in the same order as transformers' "yarn" rope (truncate=false),
// which is also what OpenAI's reference computes:
//   base_pow[d] = theta^(2d / head_dim)                          d = 0 .. head_dim/2 - 1
//   low, high   = (head_dim/2) · ln(L0 / (beta · 2π)) / ln(theta) for beta = beta_fast, beta_slow
//   ramp[d]     = clamp((d - low) / (high - low), 0, 1);  w[d] = 1 - ramp[d]
//   inv_freq[d] = 1/(factor · base_pow[d]) · (1 - w[d]) + 1/base_pow[d] · w[d]
//   cos[p][d]   = cos(p · inv_freq[d]) · c,  sin[p][d] = sin(p · inv_freq[d]) · c,  c = 0.1 ln(factor) + 1
// low/high stay fractional unless the config asks for truncation (it must not for gpt-oss).
#pragma once

#include <span>
#include <vector>

#include "model/config.h"

namespace osprey::model {

struct YarnFrequencies {
    double low = 0.0;            // correction range, in rotation-dimension units
    double high = 0.0;
    double concentration = 1.0;  // "attention factor": multiplies both cos and sin
    std::vector<float> inv_freq; // [head_dim / 2]

    // Throws osprey::Error when the config's rope parameters are out of range.
    static YarnFrequencies from_config(const Config& c);
};

// cos/sin rows for positions [0, n_positions), grown on demand up to config.max_position.
class RopeTable {
public:
    explicit RopeTable(const Config& c, int n_positions = 0);

    const YarnFrequencies& frequencies() const { return freq_; }
    int half_dim() const { return half_dim_; }
    int n_positions() const { return n_positions_; }
    // Makes the table cover positions [0, n_positions); throws past the model's max position.
    void reserve(int n_positions);
    std::span<const float> cos() const { return cos_; }  // [n_positions, half_dim]
    std::span<const float> sin() const { return sin_; }  // [n_positions, half_dim]

private:
    YarnFrequencies freq_;
    int half_dim_ = 0;
    int max_positions_ = 0;
    int n_positions_ = 0;
    std::vector<float> cos_, sin_;
};

}  // namespace osprey::model
