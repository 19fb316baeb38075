// bfloat16 storage type and exact conversions (host and device).
#pragma once

#include <cstdint>
#include <cstring>

namespace osprey {

// Raw bfloat16 bits. Conversion to float is exact; from float rounds to nearest even, NaN kept quiet.
struct bf16 {
    uint16_t bits = 0;
};

inline float bf16_to_float(bf16 x) {
    const uint32_t u = uint32_t(x.bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

inline bf16 float_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
    const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);                          // to nearest even
    return bf16{uint16_t((u + rounding) >> 16)};
}

inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace osprey
