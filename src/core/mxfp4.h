// MXFP4 (OCP Microscaling v1.0: FP4 E2M1 elements, one E8M0 scale per 32) as stored in gpt-oss
// checkpoints (spec §6.4, conformance/model/mxfp4_decode.json):
//   value = kFp4Values[nibble] * 2^(scale - 127)
//   a 16-byte block holds 32 consecutive elements of a row's input dimension; byte j holds
//   element 2j in its low nibble (bits 0-3) and element 2j+1 in its high nibble (bits 4-7).
// Scale 255 (NaN in OCP) is decoded like the references do, as 2^128 (= inf in float): no special case.
// Pure header: usable from the CPU reference, tests and the synthetic checkpoint writer.
#pragma once

#include <cmath>
#include <cstdint>

namespace osprey::mxfp4 {

inline constexpr int kBlockElements = 32;  // elements sharing one scale
inline constexpr int kBlockBytes = 16;     // packed bytes per block
inline constexpr int kScaleBias = 127;     // E8M0 exponent bias

inline constexpr float kFp4Values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// 2^(scale - 127) as a float (exact for scale in [0, 254]: 2^-127 is a float subnormal).
inline float scale_multiplier(uint8_t scale) { return std::ldexp(1.0f, int(scale) - kScaleBias); }

inline float decode(uint8_t nibble, uint8_t scale) { return kFp4Values[nibble & 0xF] * scale_multiplier(scale); }

// out[32] = the block's elements in order.
inline void decode_block(const uint8_t* block /* [16] */, uint8_t scale, float* out /* [32] */) {
    const float m = scale_multiplier(scale);
    for (int j = 0; j < kBlockBytes; ++j) {
        out[2 * j] = kFp4Values[block[j] & 0xF] * m;
        out[2 * j + 1] = kFp4Values[block[j] >> 4] * m;
    }
}

// out[n_in] = one weight row of n_in inputs (n_in % 32 == 0) from its blocks and scales.
inline void decode_row(const uint8_t* blocks /* [n_in/32, 16] */, const uint8_t* scales /* [n_in/32] */,
                       int n_in, float* out /* [n_in] */) {
    for (int g = 0; g < n_in / kBlockElements; ++g)
        decode_block(blocks + g * kBlockBytes, scales[g], out + g * kBlockElements);
}

// The nibble whose FP4 value is nearest to x (already divided by the scale multiplier); ties go to
// the even mantissa (as round-to-nearest-even), |x| > 6 saturates to ±6, NaN becomes +0.
inline uint8_t encode_nibble(float x) {
    const bool neg = std::signbit(x);
    const float a = std::fabs(x);
    if (!(a == a)) return 0;
    // Magnitudes of codes 0..7 are 0, .5, 1, 1.5, 2, 3, 4, 6; midpoints decide, ties to even code.
    static constexpr float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    uint8_t code = 7;
    for (uint8_t c = 0; c < 7; ++c) {
        if (a < kMid[c] || (a == kMid[c] && c % 2 == 0)) {
            code = c;
            break;
        }
    }
    return uint8_t(code | (neg ? 8 : 0));
}

// The smallest scale whose range (6 * 2^(scale-127)) covers max|x| of the block; 127 for an all-zero
// block. Clamped to [0, 254].
inline uint8_t choose_scale(const float* x /* [32] */) {
    float amax = 0.0f;
    for (int i = 0; i < kBlockElements; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    if (!(amax > 0.0f)) return kScaleBias;
    int e = int(std::ceil(std::log2(amax / 6.0f)));
    while (e > -kScaleBias && std::ldexp(6.0f, e - 1) >= amax) --e;  // guard log2 rounding
    while (std::ldexp(6.0f, e) < amax && e < 127) ++e;
    const int s = e + kScaleBias;
    return uint8_t(s < 0 ? 0 : (s > 254 ? 254 : s));
}

// Encodes 32 floats into one block + scale (round to nearest representable value).
inline uint8_t encode_block(const float* x /* [32] */, uint8_t* block /* [16] */) {
    const uint8_t scale = choose_scale(x);
    const float inv = std::ldexp(1.0f, kScaleBias - int(scale));
    for (int j = 0; j < kBlockBytes; ++j) {
        const uint8_t lo = encode_nibble(x[2 * j] * inv);
        const uint8_t hi = encode_nibble(x[2 * j + 1] * inv);
        block[j] = uint8_t(lo | (hi << 4));
    }
    return scale;
}

}  // namespace osprey::mxfp4
