// FP8 E4M3 ("e4m3fn": 1 sign, 4 exponent bits with bias 7, 3 mantissa bits, no infinities, NaN =
// S.1111.111, largest finite ±448) and the 128 x 128 block scaling used for FP8 weights (the
// DeepSeek-V3 / Qwen / Hugging Face "fp8" checkpoint layout, docs/fp8.md):
//   W[r, c] ≈ e4m3(Q[r, c]) * scale_inv[r / 128, c / 128]
//   scale_inv = amax / 448 over the block's real elements (1 for an all-zero block)
// A matrix whose sides are not multiples of 128 (gpt-oss: 2880 = 22.5 x 128) has partial last
// blocks: the scale array is [ceil(rows/128), ceil(cols/128)] and a partial block's scale is
// computed over the elements that exist (no padding enters the amax, nothing is truncated).
// Pure header: used by the converter, the loader, the CPU kernels and the FP8 KV cache.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace osprey::fp8 {

inline constexpr float kE4m3Max = 448.0f;      // largest finite e4m3fn magnitude
inline constexpr uint8_t kE4m3MaxCode = 0x7E;  // +448
inline constexpr uint8_t kE4m3NanCode = 0x7F;
inline constexpr int kBlock = 128;  // weight block side (weight_block_size [128, 128])

// Number of blocks of kBlock along a side of n elements (the last may be partial).
inline constexpr int64_t n_blocks(int64_t n) {
    return (n + kBlock - 1) / kBlock;
}

// Exact value of every code (NaN codes decode to NaN).
inline float e4m3_to_float(uint8_t code) {
    const float sign = (code & 0x80) ? -1.0f : 1.0f;
    const int e = (code >> 3) & 0xF, m = code & 0x7;
    if (e == 0xF && m == 0x7) return NAN;
    if (e == 0) return sign * std::ldexp(float(m), -9);  // subnormal: m/8 * 2^-6
    return sign * std::ldexp(float(8 + m), e - 10);      // (1 + m/8) * 2^(e-7)
}

// All 256 codes decoded once (the CPU kernels' lookup table).
inline const std::array<float, 256>& e4m3_table() {
    static const std::array<float, 256> table = [] {
        std::array<float, 256> t{};
        for (int i = 0; i < 256; ++i) t[size_t(i)] = e4m3_to_float(uint8_t(i));
        return t;
    }();
    return table;
}

// Nearest e4m3 code to x, ties to the even mantissa (as the hardware's cvt.rn.satfinite and
// torch's .to(float8_e4m3fn) after a clamp): magnitudes above 448 saturate to ±448, NaN stays NaN.
// On the float's bits (the converter quantises every weight through here: ~25x faster than going
// through frexp/ldexp; tests/model/test_fp8.cpp compares it with that form over every 257th float):
// a normal e4m3 keeps the top 3 of the 23 mantissa bits, rounded to nearest even, and rebiases the
// exponent (127 -> 7); below 2^-6 the codes are multiples of 2^-9, so |x| * 2^9 (exact) is rounded to
// an integer by adding and subtracting 2^23 (round to nearest even, |x| * 2^9 < 8).
inline uint8_t float_to_e4m3(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    const uint8_t sign = uint8_t((u >> 24) & 0x80u);
    const uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return kE4m3NanCode;                       // NaN
    if (a >= 0x43E00000u) return uint8_t(sign | kE4m3MaxCode);      // |x| >= 448 (inf included)
    if (a >= 0x3C800000u) {                                         // |x| >= 2^-6: normal
        const uint32_t r = a + 0x7FFFFu + ((a >> 20) & 1u);        // round the 20 dropped bits to even
        const uint32_t code = (r >> 20) - ((127u - 7u) << 3);      // a carry into the exponent is right
        return uint8_t(sign | (code > kE4m3MaxCode ? kE4m3MaxCode : code));
    }
    float mag;
    std::memcpy(&mag, &a, sizeof mag);
    const float t = mag * 512.0f;  // exact
    volatile float big = t + 8388608.0f;  // 2^23: the sum's unit is 1, so this rounds t to nearest even
    const int m = int(big - 8388608.0f);   // (volatile: the rounding must happen, whatever the optimiser)
    return uint8_t(sign | m);              // m == 8 is code 0x08 = 2^-6, the smallest normal: same bits
}

// The dequantisation multiplier of a block whose largest magnitude is amax (amax / 448, or 1 when
// the block is all zeros so that it stays exactly zero).
inline float block_scale_inv(float amax) {
    return amax > 0.0f ? amax / kE4m3Max : 1.0f;
}

// Quantises one value with its block's multiplier: q = e4m3(v / scale_inv).
inline uint8_t quantize(float v, float scale_inv) {
    return float_to_e4m3(v / scale_inv);
}

// Quantises one band of a matrix: `band_rows` (<= 128) consecutive rows that share a row of blocks.
// band: [band_rows, cols] values; q: [band_rows, cols] codes; scale_inv: [n_blocks(cols)] multipliers,
// each over the band_rows x (<= 128) elements of its block that exist.
inline void quantize_band(const float* band, int band_rows, int64_t cols, uint8_t* q, float* scale_inv) {
    const int64_t nb = n_blocks(cols);
    for (int64_t b = 0; b < nb; ++b) {
        const int64_t c0 = b * kBlock, c1 = c0 + kBlock < cols ? c0 + kBlock : cols;
        float amax = 0.0f;
        for (int r = 0; r < band_rows; ++r)
            for (int64_t c = c0; c < c1; ++c) {
                const float a = std::fabs(band[r * cols + c]);
                amax = a > amax ? a : amax;  // std::fmax without the call: NaN is skipped either way
            }
        const float s = block_scale_inv(amax);
        scale_inv[b] = s;
        for (int r = 0; r < band_rows; ++r)
            for (int64_t c = c0; c < c1; ++c) q[r * cols + c] = quantize(band[r * cols + c], s);
    }
}

}  // namespace osprey::fp8
