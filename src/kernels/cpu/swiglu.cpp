#include "kernels/cpu/swiglu.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace osprey::cpu {

void swiglu_clamped(std::span<float> out, std::span<const float> gate_up, int n_rows, int d_ff, float alpha,
                    float limit) {
    OSPREY_CHECK(n_rows >= 0 && d_ff > 0, "swiglu: bad shape ", n_rows, "x", d_ff);
    OSPREY_CHECK(out.size() == size_t(n_rows) * d_ff && gate_up.size() == 2 * out.size(), "swiglu: out has ",
                 out.size(), " and gate_up ", gate_up.size(), " elements for ", n_rows, "x", d_ff);
    for (size_t i = 0; i < out.size(); ++i) {
        const float gate = std::min(gate_up[2 * i], limit);               // upper clamp only
        const float up = std::clamp(gate_up[2 * i + 1], -limit, limit);  // both sides
        const float glu = gate * (1.0f / (1.0f + std::exp(-(gate * alpha))));
        out[i] = (up + 1.0f) * glu;
    }
}

}  // namespace osprey::cpu
