// Rotary position embedding, half-split style (spec §3.4): within each head, dimension d < head_dim/2
// rotates with d + head_dim/2. The cos/sin values (YaRN frequencies, concentration already applied)
// come from a table indexed by position (model/rope.h builds it).
#pragma once

#include <cstdint>
#include <span>

namespace osprey::cpu {

// x: [n_tokens, n_heads, head_dim], rotated in place, token t at position positions[t].
// cos, sin: [n_positions, head_dim / 2]; every position must be < n_positions.
//   out[d]        = x[d] * cos[p][d] - x[d + half] * sin[p][d]
//   out[d + half] = x[d + half] * cos[p][d] + x[d] * sin[p][d]
void rope(std::span<float> x, std::span<const int32_t> positions, int n_heads, int head_dim,
          std::span<const float> cos, std::span<const float> sin);

}  // namespace osprey::cpu
