// The MXFP4 word decodes of kernels/cuda/mxfp4_words.h on the host: the published decode gives every
// nibble's FP4 value (core/mxfp4.h's table) as BF16 · 2^-126 with its sign, the decode layout is a
// permutation of the 32 bits, and its 9-operation decode gives the published decode's registers.
#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "core/mxfp4.h"
#include "kernel_test_util.h"
#include "kernels/cuda/mxfp4_words.h"

namespace osprey::cuda {
namespace {

// Half h (0: low 16 bits, 1: high) of a decoded register as a float, times 2^126.
float half_value(uint32_t reg, int h) {
    const uint32_t bits = (h == 0 ? reg & 0xFFFFu : reg >> 16) << 16;
    return std::ldexp(std::bit_cast<float>(bits), 126);
}

TEST(mxfp4_words, published_decode_is_the_fp4_table) {
    // Every nibble value at every position of the word, the other nibbles random.
    std::mt19937 rng(7);
    for (int pos = 0; pos < 8; ++pos)
        for (uint32_t nib = 0; nib < 16; ++nib)
            for (int rep = 0; rep < 8; ++rep) {
                const uint32_t w = (uint32_t(rng()) & ~(0xFu << (4 * pos))) | (nib << (4 * pos));
                uint32_t r[4];
                fp4x8_pairs_published(w, r);
                // register r holds nibbles (r, r + 4): nibble pos in register pos % 4, half pos / 4
                const float got = half_value(r[pos % 4], pos / 4);
                EXPECT_EQ(got, mxfp4::kFp4Values[nib]) << "word " << std::hex << w << " nibble " << pos;
                EXPECT_EQ(std::signbit(got), (nib & 8u) != 0) << "word " << std::hex << w << " nibble " << pos;
                for (int i = 0; i < 4; ++i) EXPECT_EQ(r[i] & ~kFp4PairMask, 0u) << "stray bits in register " << i;
            }
}

TEST(mxfp4_words, decode_layout_is_a_bit_permutation) {
    uint32_t seen = 0;
    for (int b = 0; b < 32; ++b) {
        const uint32_t v = mxfp4_word_to_decode_layout(1u << b);
        ASSERT_EQ(std::popcount(v), 1) << "bit " << b << " goes to " << std::hex << v;
        EXPECT_EQ(seen & v, 0u) << "bit " << b << " lands where another did";
        seen |= v;
    }
    EXPECT_EQ(seen, 0xFFFFFFFFu);
    EXPECT_EQ(mxfp4_word_to_decode_layout(0u), 0u);
}

TEST(mxfp4_words, decode_layout_decodes_to_the_published_registers) {
    std::mt19937 rng(11);
    auto check = [](uint32_t w) {
        uint32_t want[4], got[4];
        fp4x8_pairs_published(w, want);
        fp4x8_pairs_decode_layout(mxfp4_word_to_decode_layout(w), got);
        for (int i = 0; i < 4; ++i) ASSERT_EQ(got[i], want[i]) << "word " << std::hex << w << " register " << i;
    };
    for (int i = 0; i < 200000; ++i) check(uint32_t(rng()));
    for (uint32_t w : {0u, 0xFFFFFFFFu, 0x88888888u, 0x77777777u, 0x01234567u, 0xFEDCBA98u}) check(w);
}

}  // namespace
}  // namespace osprey::cuda
