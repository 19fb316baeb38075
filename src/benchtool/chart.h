// Speed-versus-cost charts of benchmark results, drawn by our own code as SVG (text) and PNG
// (rasterised on a Canvas, encoded by png.h): one curve per layout and context length, one point
// per batch size (decode) or prompt length (prefill), labelled.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"

namespace osprey::benchtool {

struct ChartPoint {
    double x = 0, y = 0;
    std::string tag;  // drawn next to the point ("b=8", "4k")
};

struct ChartSeries {
    std::string label;  // legend entry
    std::vector<ChartPoint> points;
};

struct Chart {
    std::string title, subtitle, x_label, y_label;
    bool x_log = false, y_log = true;
    std::vector<ChartSeries> series;
};

std::string render_svg(const Chart& chart, int width = 960, int height = 640);
std::vector<uint8_t> render_png(const Chart& chart, int width = 960, int height = 640);

// Charts of `osprey bench decode` / `prefill` JSON reports (several files: several layouts).
// Decode: x = tokens/s per user, y = cost per million output tokens, a curve per layout and context.
// Prefill: x = input tokens/s (one user), y = cost per million input tokens, a curve per layout.
// Reports of other commands are skipped; an empty list means none had plottable rows.
std::vector<std::pair<std::string, Chart>> charts_from_reports(const std::vector<json::Value>& reports);

}  // namespace osprey::benchtool
