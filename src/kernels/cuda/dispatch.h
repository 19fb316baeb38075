// The only mechanism that turns a runtime value into a template argument. Every kernel family
// lists its supported values at its launch wrapper:
//   dispatch_int<64>("head_dim", a.head_dim, [&]<int kHeadDim>() { launch<kHeadDim>(a, stream); });
// An unsupported value is a loud error naming the parameter, never a silent fallback.
#pragma once

#include "core/check.h"

namespace osprey::cuda {

template <int... kCases, typename F>
void dispatch_int(const char* what, int value, F&& f) {
    const bool found = ((value == kCases ? (f.template operator()<kCases>(), true) : false) || ...);
    if (!found) OSPREY_FAIL("unsupported ", what, " = ", value);
}

template <typename F>
void dispatch_bool(bool value, F&& f) {
    if (value) {
        f.template operator()<true>();
    } else {
        f.template operator()<false>();
    }
}

}  // namespace osprey::cuda
