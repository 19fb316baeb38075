// MXFP4 expert words (4 bytes = 8 FP4 nibbles of one 32-group) and the two bit layouts the kernels read.
//
// published: the checkpoint's bytes, nibble j of the word at bits 4j..4j+3 (m, e0, e1, sign from the
//   low bit), element 2i in the low nibble of byte i. Every MXFP4 kernel reads it.
// decode: the same word with its 32 bits permuted (made once at load, mxfp4_word_to_decode_layout) so
//   that moe_decode turns it into its four BF16x2 registers with 9 integer operations instead of 13
//   (docs/architecture.md "The decode step"; scripts/fp4_word_layout.py found it). Only moe_decode reads
//   it (MoeDecodeArgs::words), from a second copy of the experts.
//
// Both decodes give register r = nibbles (r, r + 4) of the word as one BF16x2 of FP4 · 2^-126 (sign at
// bits 15 / 31, e1 e0 m at 8:6 / 24:22, every other bit zero), before the multiply by the group's scale.
// The decode layout is defined as the inverse of its decode: the register bits of the published decode
// are put back where the decode-layout decode takes them from (P, P + 4, P + 10, and the last register
// from two rotations), and these four sets partition the word, so the map is a bijection (tested:
// tests/kernels/test_mxfp4_words.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define OSPREY_FP4_HD __host__ __device__ __forceinline__
#else
#define OSPREY_FP4_HD inline
#endif

namespace osprey::cuda {

enum class Mxfp4WordLayout : uint8_t { published, decode };

inline constexpr uint32_t kFp4PairMask = 0x81C081C0u;  // P: bits 6, 7, 8, 15, 22, 23, 24, 31
inline constexpr uint32_t kFp4LastA = 0x80C080C0u;     // P less bits 8 and 24: from rotl(v, 2)
inline constexpr uint32_t kFp4LastB = 0x01000100u;     // bits 8 and 24: from rotl(v, 10)

// One SHF.L.W / SHF.R.W on the device.
OSPREY_FP4_HD uint32_t rotl32(uint32_t w, int n) {
#if defined(__CUDA_ARCH__)
    return __funnelshift_l(w, w, n);
#else
    return n == 0 ? w : (w << n) | (w >> (32 - n));
#endif
}
OSPREY_FP4_HD uint32_t rotr32(uint32_t w, int n) {
#if defined(__CUDA_ARCH__)
    return __funnelshift_r(w, w, n);
#else
    return n == 0 ? w : (w >> n) | (w << (32 - n));
#endif
}

// Published layout: with the two nibbles isolated at bits [3:0] and [19:16] (multiplier 4160 = 2^12 +
// 2^6) or [7:4] and [23:20] (260 = 2^8 + 2^2), the product holds each nibble twice without carries; the
// mask keeps the sign from the high copy (bit 15) and e1 e0 m from the low copy (bits 8:6), in both
// halves. 13 integer operations (a shift, then AND, IMAD, AND per register).
OSPREY_FP4_HD void fp4x8_pairs_published(uint32_t w, uint32_t (&r)[4]) {
    const uint32_t hi = w >> 8;
    r[0] = ((w & 0x000F000Fu) * 4160u) & kFp4PairMask;
    r[1] = ((w & 0x00F000F0u) * 260u) & kFp4PairMask;
    r[2] = ((hi & 0x000F000Fu) * 4160u) & kFp4PairMask;
    r[3] = ((hi & 0x00F000F0u) * 260u) & kFp4PairMask;
}

// Decode layout: 9 integer operations (no multiply).
OSPREY_FP4_HD void fp4x8_pairs_decode_layout(uint32_t v, uint32_t (&r)[4]) {
    r[0] = v & kFp4PairMask;
    r[1] = rotr32(v, 4) & kFp4PairMask;
    r[2] = rotr32(v, 10) & kFp4PairMask;
    r[3] = (rotl32(v, 2) & kFp4LastA) | (rotl32(v, 10) & kFp4LastB);
}

// A published word in the decode layout: fp4x8_pairs_decode_layout(mxfp4_word_to_decode_layout(w)) ==
// fp4x8_pairs_published(w) for every w.
OSPREY_FP4_HD uint32_t mxfp4_word_to_decode_layout(uint32_t w) {
    uint32_t r[4];
    fp4x8_pairs_published(w, r);
    return r[0] | rotl32(r[1], 4) | rotl32(r[2], 10) | rotr32(r[3] & kFp4LastA, 2) | rotr32(r[3] & kFp4LastB, 10);
}

// The host's conversion of bytes (a multiple of 4) of MXFP4 blocks, word by word (the device's:
// moe_decode.h's mxfp4_to_decode_layout). dst may equal src.
inline void mxfp4_blocks_to_decode_layout(const uint8_t* src, uint8_t* dst, size_t bytes) {
    for (size_t i = 0; i + 4 <= bytes; i += 4) {
        uint32_t w;
        std::memcpy(&w, src + i, 4);
        w = mxfp4_word_to_decode_layout(w);
        std::memcpy(dst + i, &w, 4);
    }
}

}  // namespace osprey::cuda
