// MXFP4: the worked examples of shared/conformance/model/mxfp4_decode.json, and mxfp4_matmul equal to
// dequantise-then-matmul (in double).
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "core/json.h"
#include "kernel_test_util.h"
#include "kernels/cpu/mxfp4_matmul.h"

namespace osprey::cpu {
namespace {

json::Value load_conformance() {
    std::ifstream in(std::string(OSPREY_SHARED_DIR) + "/conformance/model/mxfp4_decode.json");
    EXPECT_TRUE(in.good()) << "missing " << OSPREY_SHARED_DIR << "/conformance/model/mxfp4_decode.json";
    std::stringstream ss;
    ss << in.rdbuf();
    return json::parse(ss.str());
}

TEST(cpu_mxfp4, conformance_table_and_worked_examples) {
    const json::Value doc = load_conformance();
    ASSERT_EQ(doc.at("e8m0_bias").as_int(), 127);
    const auto& table = doc.at("fp4_e2m1_values_by_nibble").as_array();
    ASSERT_EQ(table.size(), 16u);
    // Every nibble, placed as low (even element) and high (odd element) nibble, at scale 127.
    for (int nib = 0; nib < 16; ++nib) {
        std::vector<uint8_t> blocks(16, 0);
        blocks[3] = uint8_t(nib | (nib << 4));
        const uint8_t scale = 127;
        std::vector<float> row(32);
        mxfp4_dequantize_row(row, blocks.data(), &scale);
        EXPECT_EQ(row[6], float(table[nib].as_double())) << "low nibble " << nib;
        EXPECT_EQ(row[7], float(table[nib].as_double())) << "high nibble " << nib;
        EXPECT_EQ(std::signbit(row[6]), std::signbit(table[nib].as_double())) << nib;
    }
    for (const json::Value& ex : doc.at("worked_examples").as_array()) {
        const std::string hex = ex.at("block_bytes_hex").as_string();
        std::vector<uint8_t> blocks(16);
        for (int j = 0; j < 16; ++j) blocks[j] = uint8_t(std::stoi(hex.substr(2 * j, 2), nullptr, 16));
        const uint8_t scale = uint8_t(ex.at("scale_byte").as_int());
        std::vector<float> row(32);
        mxfp4_dequantize_row(row, blocks.data(), &scale);
        const auto& want = ex.at("decoded_first_4").as_array();
        for (int i = 0; i < 4; ++i) EXPECT_EQ(row[i], float(want[i].as_double())) << hex << " element " << i;
    }
}

TEST(cpu_mxfp4, matmul_equals_dequantise_then_matmul) {
    const int rows = 3, n_in = 96, n_out = 37;
    std::mt19937 rng(11);
    std::vector<uint8_t> blocks(size_t(n_out) * n_in / 2), scales(size_t(n_out) * n_in / 32);
    for (auto& b : blocks) b = uint8_t(rng());
    for (auto& s : scales) s = uint8_t(120 + rng() % 10);
    const auto x = test::random_floats(rows * n_in, 12);
    const auto bias = test::random_floats(n_out, 13);
    std::vector<float> y(rows * n_out);
    mxfp4_matmul(y, x, blocks, scales, bias, rows, n_in, n_out);

    std::vector<double> want(y.size());
    std::vector<float> w(n_in);
    for (int o = 0; o < n_out; ++o) {
        mxfp4_dequantize_row(w, blocks.data() + size_t(o) * n_in / 2, scales.data() + size_t(o) * n_in / 32);
        for (int r = 0; r < rows; ++r) {
            double s = bias[o];
            for (int i = 0; i < n_in; ++i) s += double(w[i]) * x[r * n_in + i];
            want[r * n_out + o] = s;
        }
    }
    test::expect_close(y, want, 1e-5, 1e-5, "mxfp4 matmul");
}

TEST(cpu_mxfp4, rejects_bad_shapes) {
    std::vector<float> x(40), y(2);
    std::vector<uint8_t> blocks(40), scales(2);
    EXPECT_THROW(mxfp4_matmul(y, x, blocks, scales, {}, 1, 40, 2), Error);  // 40 is not a multiple of 32
    std::vector<float> x32(32);
    std::vector<uint8_t> blocks31(31);
    EXPECT_THROW(mxfp4_matmul(y, x32, blocks31, scales, {}, 1, 32, 2), Error);
}

}  // namespace
}  // namespace osprey::cpu
