// Statistics, the PNG encoder's framing (CRC-32, Adler-32, stored deflate blocks) checked by an
// independent reader, the canvas and the chart writer.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "benchtool/canvas.h"
#include "benchtool/chart.h"
#include "benchtool/png.h"
#include "benchtool/stats.h"
#include "core/check.h"
#include "png_check.h"

namespace osprey::benchtool {
namespace {

std::span<const uint8_t> bytes(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

TEST(Stats, PercentilesInterpolateBetweenOrderStatistics) {
    const Summary s = summarize({5, 1, 4, 2, 3});
    EXPECT_EQ(s.n, 5);
    EXPECT_DOUBLE_EQ(s.median, 3);
    EXPECT_DOUBLE_EQ(s.p90, 4.6);  // numpy.percentile([1..5], 90)
    EXPECT_DOUBLE_EQ(s.mean, 3);
    EXPECT_DOUBLE_EQ(s.min, 1);
    EXPECT_DOUBLE_EQ(s.max, 5);
    const Summary even = summarize({10, 20});
    EXPECT_DOUBLE_EQ(even.median, 15);
    EXPECT_DOUBLE_EQ(even.p90, 19);
    EXPECT_EQ(summarize({}).n, 0);
    EXPECT_THROW(percentile({}, 0.5), Error);
    EXPECT_THROW(percentile({1.0}, 1.5), Error);
}

TEST(Png, ChecksumsMatchKnownValues) {
    EXPECT_EQ(crc32(bytes("123456789")), 0xCBF43926u);  // the CRC-32 check value
    EXPECT_EQ(crc32(bytes("")), 0u);
    EXPECT_EQ(adler32(bytes("Wikipedia")), 0x11E60398u);
    EXPECT_EQ(adler32(bytes("")), 1u);
}

TEST(Png, RoundTripsThroughAnIndependentReader) {
    // 200 x 150 RGB = 90,150 bytes of scanlines: pseudo-random pixels (mostly literals), a flat band
    // (long matches at distance 3) and rows repeated from the row above (matches at distance 601).
    const int w = 200, h = 150;
    std::vector<uint8_t> rgb(size_t(w) * h * 3);
    uint32_t x = 12345;
    for (size_t i = 0; i < rgb.size(); ++i) {
        x = x * 1664525u + 1013904223u;
        const size_t row = i / (size_t(w) * 3);
        rgb[i] = row < 50 ? uint8_t(x >> 24) : row < 100 ? uint8_t(200 + i % 3) : rgb[i - size_t(w) * 3 * (row % 2)];
    }
    const std::vector<uint8_t> png = encode_png_rgb(rgb, w, h);
    const test::DecodedPng d = test::check_and_decode_png(png);
    EXPECT_EQ(d.width, w);
    EXPECT_EQ(d.height, h);
    EXPECT_EQ(d.n_chunks, 3);
    EXPECT_EQ(d.rgb, rgb);
    // A flipped byte anywhere is caught by a CRC.
    std::vector<uint8_t> bad = png;
    bad[bad.size() / 2] ^= 0x40;
    EXPECT_THROW(test::check_and_decode_png(bad), std::runtime_error);
    EXPECT_THROW(encode_png_rgb(rgb, w + 1, h), Error);
    EXPECT_THROW(encode_png_rgb({}, 0, 0), Error);
}

TEST(Canvas, DrawsLinesDiscsAndText) {
    Canvas c(40, 30, {255, 255, 255});
    c.line(2, 5, 37, 5, 2, {0, 0, 0});
    const uint8_t* px = &c.pixels()[(5 * 40 + 20) * 3];
    EXPECT_LT(px[0], 60);  // on the line
    EXPECT_EQ(c.pixels()[(20 * 40 + 20) * 3], 255);  // far from it
    c.disc(20, 20, 3, {255, 0, 0});
    EXPECT_EQ(c.pixels()[(20 * 40 + 20) * 3 + 1], 0);
    Canvas t(20, 12, {255, 255, 255});
    EXPECT_DOUBLE_EQ(t.text(1, 6, "1", 1, {0, 0, 0}), 5);
    int dark = 0;
    for (size_t i = 0; i < t.pixels().size(); i += 3) dark += t.pixels()[i] == 0;
    EXPECT_EQ(dark, 10);  // the glyph '1' of the 5x7 font has 10 pixels
    EXPECT_THROW(Canvas(0, 10, {}), Error);
}

Chart sample_chart() {
    Chart c{"Decode <test> & co", "sub", "tokens/s per user", "USD per M tokens", false, true, {}};
    c.series.push_back({"TP1 ctx 8k", {{100, 2.0, "b1"}, {80, 0.5, "b8"}, {40, 0.1, "b64"}}});
    c.series.push_back({"TP1 ctx 32k", {{70, 3.0, "b1"}, {30, 0.4, "b64"}}});
    return c;
}

TEST(Chart, SvgIsWellFormedAndEscaped) {
    const std::string svg = render_svg(sample_chart(), 800, 500);
    EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
    EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"800\" height=\"500\""), std::string::npos);
    EXPECT_NE(svg.find("Decode &lt;test&gt; &amp; co"), std::string::npos);
    EXPECT_NE(svg.find("TP1 ctx 32k"), std::string::npos);
    EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
    size_t circles = 0;
    for (size_t at = 0; (at = svg.find("<circle", at)) != std::string::npos; ++at) ++circles;
    EXPECT_EQ(circles, 5u + 2u);  // points + legend markers
}

TEST(Chart, PngHasTheRequestedSizeAndColouredCurves) {
    const test::DecodedPng d = test::check_and_decode_png(render_png(sample_chart(), 640, 400));
    EXPECT_EQ(d.width, 640);
    EXPECT_EQ(d.height, 400);
    int blue = 0;
    for (size_t i = 0; i < d.rgb.size(); i += 3) blue += d.rgb[i] == 31 && d.rgb[i + 1] == 119 && d.rgb[i + 2] == 180;
    EXPECT_GT(blue, 100);  // the first series' colour, fully covered pixels
    // Compressed: a chart is mostly background, far below its 768,400 bytes of scanlines.
    EXPECT_LT(render_png(sample_chart(), 640, 400).size(), size_t(60000));
}

TEST(Chart, RejectsEmptyAndNonFiniteData) {
    Chart c = sample_chart();
    c.series.clear();
    EXPECT_THROW(render_svg(c), Error);
    c = sample_chart();
    c.series[0].points[0].y = std::nan("");
    EXPECT_THROW(render_png(c), Error);
}

TEST(Chart, ChartsFromReportsMakeOneCurvePerLayoutAndContext) {
    const json::Value report = json::parse(R"({"osprey_bench":1,
      "run":{"command":"decode","layout":{"label":"TP1"},"model":"m","device":"d"},"settings":{},
      "results":[
        {"context":8192,"batch":1,"kv_fill":"prefill","tokens_per_s_per_user":100,"cost_per_million_output_usd":8},
        {"context":8192,"batch":2,"kv_fill":"prefill","tokens_per_s_per_user":90,"cost_per_million_output_usd":4},
        {"context":32768,"batch":1,"kv_fill":"shared","tokens_per_s_per_user":60,"cost_per_million_output_usd":12}]})");
    const auto charts = charts_from_reports({report});
    ASSERT_EQ(charts.size(), 1u);
    EXPECT_EQ(charts[0].first, "decode");
    ASSERT_EQ(charts[0].second.series.size(), 2u);
    EXPECT_EQ(charts[0].second.series[0].label, "TP1 ctx 8k");
    EXPECT_EQ(charts[0].second.series[0].points.size(), 2u);
    EXPECT_EQ(charts[0].second.series[1].label, "TP1 ctx 32k shared-KV");
    // The same label from a second file becomes its own curve.
    const auto two = charts_from_reports({report, report});
    EXPECT_EQ(two[0].second.series.size(), 4u);
    EXPECT_EQ(two[0].second.series[2].label, "TP1 ctx 8k (file 2)");
    // Reports of two models: the curves are named after the models.
    json::Value other = report;
    json::Value run = other.at("run");
    run.set("model", "gpt-oss-120b shape: 36 layers, d_model 2880");
    other.set("run", run);
    const auto both = charts_from_reports({report, other});
    ASSERT_EQ(both[0].second.series.size(), 4u);
    EXPECT_EQ(both[0].second.series[0].label, "m TP1 ctx 8k");
    EXPECT_EQ(both[0].second.series[2].label, "gpt-oss-120b TP1 ctx 8k");
}

}  // namespace
}  // namespace osprey::benchtool
