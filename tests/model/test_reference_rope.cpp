// model/rope against shared/conformance/model/yarn_rope_constants.json: low/high (fractional, not
// truncated), the concentration, all 32 inverse frequencies and the spot-check cos/sin values.
#include <cmath>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "core/check.h"
#include "core/json.h"
#include "model/rope.h"

namespace osprey::model {
namespace {

json::Value load_constants() {
    const std::string path = std::string(OSPREY_SHARED_DIR) + "/conformance/model/yarn_rope_constants.json";
    std::ifstream in(path);
    if (!in) throw Error("missing " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    return json::parse(ss.str());
}

TEST(reference_rope, yarn_constants_match_conformance) {
    const json::Value doc = load_constants();
    const Config c;  // gpt-oss defaults: theta 150000, factor 32, L0 4096, beta 32/1, head_dim 64
    ASSERT_EQ(doc.at("head_dim").as_int(), c.head_dim);
    const YarnFrequencies f = YarnFrequencies::from_config(c);
    EXPECT_NEAR(f.low, doc.at("low").as_double(), 1e-12);
    EXPECT_NEAR(f.high, doc.at("high").as_double(), 1e-12);
    EXPECT_NEAR(f.concentration, doc.at("concentration").as_double(), 1e-15);
    const auto& table = doc.at("table").as_array();
    ASSERT_EQ(table.size(), f.inv_freq.size());
    for (const json::Value& row : table) {
        const int i = int(row.at("i").as_int());
        const double want = row.at("inv_freq").as_double();
        // FP32 computation (as the references) vs the float64 derivation: a few float ulps.
        EXPECT_NEAR(f.inv_freq[i], want, 4e-7 * want) << "inv_freq[" << i << "]";
    }
}

TEST(reference_rope, spot_checks_of_cos_and_sin) {
    const json::Value doc = load_constants();
    const Config c;
    RopeTable table(c);
    for (const json::Value& s : doc.at("spot_checks").as_array()) {
        const int p = int(s.at("position").as_int()), i = int(s.at("i").as_int());
        table.reserve(p + 1);
        const float cos = table.cos()[size_t(p) * table.half_dim() + i];
        const float sin = table.sin()[size_t(p) * table.half_dim() + i];
        // The angle p * inv_freq is an FP32 product: its rounding (half an ulp of the angle) bounds
        // the difference to the float64 values, scaled by the concentration.
        const double angle = double(p) * table.frequencies().inv_freq[i];
        const double tol = 1.3466 * (std::ldexp(std::abs(angle), -23) + 4e-7 * std::abs(angle)) + 2e-7;
        EXPECT_NEAR(cos, s.at("cos").as_double(), tol) << "position " << p << " i " << i;
        EXPECT_NEAR(sin, s.at("sin").as_double(), tol) << "position " << p << " i " << i;
    }
}

TEST(reference_rope, truncation_only_when_asked) {
    Config c;
    c.rope_truncate = true;
    const YarnFrequencies f = YarnFrequencies::from_config(c);
    EXPECT_EQ(f.low, 8.0);
    EXPECT_EQ(f.high, 18.0);
}

TEST(reference_rope, table_grows_and_stops_at_max_position) {
    Config c;
    c.max_position = 300;
    RopeTable table(c, 10);
    EXPECT_EQ(table.n_positions(), 10);
    table.reserve(300);
    EXPECT_EQ(table.n_positions(), 300);
    EXPECT_EQ(table.cos()[0], float(table.frequencies().concentration));  // position 0: cos = c, sin = 0
    EXPECT_EQ(table.sin()[0], 0.0f);
    EXPECT_THROW(table.reserve(301), Error);
}

TEST(reference_rope, rejects_bad_parameters) {
    Config c;
    c.rope_theta = 1.0;
    EXPECT_THROW(YarnFrequencies::from_config(c), Error);
    Config d;
    d.head_dim = 63;
    EXPECT_THROW(YarnFrequencies::from_config(d), Error);
}

}  // namespace
}  // namespace osprey::model
