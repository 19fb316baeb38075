// gpt-oss's clamped SwiGLU (spec §3.6 step 4): gate/up interleaved in the first expert projection,
//   gate = min(a[2j], limit), up = clamp(a[2j+1], -limit, limit),
//   out[j] = gate * sigmoid(alpha * gate) * (up + 1).
#pragma once

#include <span>

namespace osprey::cpu {

// out: [n_rows, d_ff]; gate_up: [n_rows, 2 * d_ff] (even columns gate, odd columns up).
void swiglu_clamped(std::span<float> out, std::span<const float> gate_up, int n_rows, int d_ff, float alpha,
                    float limit);

}  // namespace osprey::cpu
