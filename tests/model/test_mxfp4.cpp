// core/mxfp4.h against shared/conformance/model/mxfp4_decode.json, plus the encoder's round trip.
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "core/json.h"
#include "core/mxfp4.h"

namespace osprey::mxfp4 {
namespace {

json::Value conformance() {
    std::ifstream f(std::string(OSPREY_SHARED_DIR) + "/conformance/model/mxfp4_decode.json");
    EXPECT_TRUE(f.good());
    std::stringstream ss;
    ss << f.rdbuf();
    return json::parse(ss.str());
}

TEST(mxfp4, table_and_constants_match_conformance) {
    const json::Value c = conformance();
    const auto& table = c.at("fp4_e2m1_values_by_nibble").as_array();
    ASSERT_EQ(table.size(), 16u);
    for (int i = 0; i < 16; ++i) {
        EXPECT_EQ(kFp4Values[i], float(table[size_t(i)].as_double())) << "nibble " << i;
        EXPECT_EQ(std::signbit(kFp4Values[i]), i >= 8) << "nibble " << i << " sign (incl. -0)";
    }
    EXPECT_EQ(kScaleBias, c.at("e8m0_bias").as_int());
    EXPECT_EQ(kBlockElements, c.at("block_size_elements").as_int());
    EXPECT_EQ(kBlockBytes, c.at("bytes_per_block").as_int());
}

TEST(mxfp4, worked_examples_decode_exactly) {
    const json::Value c = conformance();  // keeps the examples alive during the loop
    for (const json::Value& ex : c.at("worked_examples").as_array()) {
        const std::string hex = ex.at("block_bytes_hex").as_string();
        ASSERT_EQ(hex.size(), 32u);
        uint8_t block[16];
        for (int j = 0; j < 16; ++j) block[j] = uint8_t(std::stoi(hex.substr(size_t(2 * j), 2), nullptr, 16));
        float out[32];
        decode_block(block, uint8_t(ex.at("scale_byte").as_int()), out);
        const auto& want = ex.at("decoded_first_4").as_array();
        for (size_t i = 0; i < want.size(); ++i) {
            EXPECT_EQ(out[i], float(want[i].as_double())) << ex.at("note").as_string() << " element " << i;
            EXPECT_EQ(std::signbit(out[i]), std::signbit(want[i].as_double())) << "element " << i;
        }
        EXPECT_EQ(decode(block[0] & 0xF, uint8_t(ex.at("scale_byte").as_int())), out[0]);
    }
}

TEST(mxfp4, low_nibble_is_the_even_element) {
    uint8_t block[16] = {};
    block[3] = 0x72;  // element 6 = +1 (nibble 2), element 7 = +6 (nibble 7)
    float out[32];
    decode_block(block, 127, out);
    EXPECT_EQ(out[6], 1.0f);
    EXPECT_EQ(out[7], 6.0f);
    uint8_t blocks[32] = {}, scales[2] = {127, 128};
    blocks[16] = 0x0b;  // second block, element 32 = -1.5 * 2
    float row[64];
    decode_row(blocks, scales, 64, row);
    EXPECT_EQ(row[32], -3.0f);
}

TEST(mxfp4, encoder_round_trips_representable_blocks) {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 200; ++trial) {
        const int e = int(rng() % 40) - 20;
        float x[32];
        for (float& v : x) v = std::ldexp(kFp4Values[rng() % 16], e);
        x[rng() % 32] = std::ldexp(rng() % 2 ? 6.0f : -6.0f, e);  // the block maximum fixes the scale
        uint8_t block[16];
        const uint8_t scale = encode_block(x, block);
        EXPECT_EQ(int(scale), e + 127);
        float y[32];
        decode_block(block, scale, y);
        for (int i = 0; i < 32; ++i) ASSERT_EQ(y[i], x[i]) << "trial " << trial << " element " << i;
    }
}

TEST(mxfp4, encoder_rounds_to_nearest_and_covers_the_maximum) {
    EXPECT_EQ(encode_nibble(0.2f), 0);
    EXPECT_EQ(encode_nibble(0.3f), 1);
    EXPECT_EQ(encode_nibble(0.25f), 0);   // tie -> even code
    EXPECT_EQ(encode_nibble(0.75f), 2);   // tie between 0.5 (code 1) and 1.0 (code 2) -> even
    EXPECT_EQ(encode_nibble(5.0f), 6);    // tie between 4 and 6 -> even code 6
    EXPECT_EQ(encode_nibble(100.0f), 7);  // saturates
    EXPECT_EQ(encode_nibble(-2.6f), 8 | 5);
    std::mt19937 rng(11);
    std::normal_distribution<float> d(0.0f, 0.03f);
    for (int trial = 0; trial < 200; ++trial) {
        float x[32], y[32];
        float amax = 0;
        for (float& v : x) v = d(rng), amax = std::fmax(amax, std::fabs(v));
        uint8_t block[16];
        const uint8_t scale = encode_block(x, block);
        const float m = scale_multiplier(scale);
        EXPECT_GE(6.0f * m, amax);       // range covers the block
        EXPECT_LT(3.0f * m, amax);       // and is the smallest that does
        decode_block(block, scale, y);
        for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(y[i] - x[i]), 1.0f * m + 1e-12f) << i;  // half the widest step
    }
    float zeros[32] = {};
    uint8_t block[16];
    EXPECT_EQ(encode_block(zeros, block), 127);
}

}  // namespace
}  // namespace osprey::mxfp4
