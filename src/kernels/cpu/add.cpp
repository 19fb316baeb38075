#include "kernels/cpu/add.h"

#include "core/check.h"

namespace osprey::cpu {

void add(std::span<float> x, std::span<const float> y) {
    OSPREY_CHECK(x.size() == y.size(), "add: sizes differ (", x.size(), " vs ", y.size(), ")");
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
}

void add_scaled(std::span<float> x, std::span<const float> y, float scale) {
    OSPREY_CHECK(x.size() == y.size(), "add_scaled: sizes differ (", x.size(), " vs ", y.size(), ")");
    for (size_t i = 0; i < x.size(); ++i) x[i] += scale * y[i];
}

}  // namespace osprey::cpu
