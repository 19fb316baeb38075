#include "benchtool/chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include "benchtool/canvas.h"
#include "benchtool/png.h"
#include "core/check.h"

namespace osprey::benchtool {

namespace {

constexpr Rgb kPalette[] = {{31, 119, 180}, {214, 39, 40},  {44, 160, 44},  {255, 127, 14},
                            {148, 103, 189}, {140, 86, 75}, {227, 119, 194}, {23, 190, 207}};
constexpr Rgb kInk{34, 34, 34}, kGrid{225, 225, 225}, kWhite{255, 255, 255};

std::string hex(Rgb c) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c.r, c.g, c.b);
    return buf;
}

std::string tick_label(double v) {
    char buf[32];
    const double a = std::fabs(v);
    if (a >= 1e6) std::snprintf(buf, sizeof buf, "%gM", v / 1e6);
    else if (a >= 1e4) std::snprintf(buf, sizeof buf, "%gk", v / 1e3);
    else std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

// One axis: data range to pixels, with tick positions.
struct Axis {
    bool log = false;
    double lo = 0, hi = 1;       // data range (log10 of it for a log axis)
    double p0 = 0, p1 = 1;       // pixel range
    std::vector<double> ticks;   // data values

    double map(double v) const {
        const double t = ((log ? std::log10(v) : v) - lo) / (hi - lo);
        return p0 + t * (p1 - p0);
    }
};

Axis make_axis(std::vector<double> values, bool log, double p0, double p1) {
    Axis a;
    a.p0 = p0, a.p1 = p1;
    a.log = log && std::all_of(values.begin(), values.end(), [](double v) { return v > 0; });
    double mn = *std::min_element(values.begin(), values.end()), mx = *std::max_element(values.begin(), values.end());
    if (a.log) {
        a.lo = std::floor(std::log10(mn));
        a.hi = std::ceil(std::log10(mx));
        if (a.hi <= a.lo) a.hi = a.lo + 1;
        const bool fine = a.hi - a.lo <= 2;
        for (int e = int(a.lo); e <= int(a.hi); ++e)
            for (double m : {1.0, 2.0, 5.0}) {
                if (m != 1.0 && !fine) continue;
                const double v = m * std::pow(10.0, e);
                if (std::log10(v) <= a.hi + 1e-9) a.ticks.push_back(v);
            }
        return a;
    }
    mn = std::min(mn, 0.0);
    if (mx <= mn) mx = mn + 1;
    const double raw = (mx - mn) / 5;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (double m : {1.0, 2.0, 5.0, 10.0})
        if (m * mag >= raw) {
            step = m * mag;
            break;
        }
    a.lo = std::floor(mn / step) * step;
    a.hi = std::ceil(mx * 1.05 / step) * step;
    for (double v = a.lo; v <= a.hi + step * 1e-9; v += step) a.ticks.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
    return a;
}

// The drawing operations a chart needs, for SVG and for the raster.
class Painter {
public:
    virtual ~Painter() = default;
    virtual void line(double x0, double y0, double x1, double y1, double w, Rgb c) = 0;
    virtual void disc(double x, double y, double r, Rgb c) = 0;
    // anchor: 0 left, 1 centre, 2 right; size: 1 small, 2 normal, 3 title
    virtual void text(double x, double y, const std::string& s, int size, int anchor, Rgb c, bool vertical = false) = 0;
};

class SvgPainter : public Painter {
public:
    std::string body;
    void line(double x0, double y0, double x1, double y1, double w, Rgb c) override {
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"%.1f\"/>\n", x0,
                      y0, x1, y1, hex(c).c_str(), w);
        body += buf;
    }
    void disc(double x, double y, double r, Rgb c) override {
        char buf[160];
        std::snprintf(buf, sizeof buf, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"%s\"/>\n", x, y, r,
                      hex(c).c_str());
        body += buf;
    }
    void text(double x, double y, const std::string& s, int size, int anchor, Rgb c, bool vertical) override {
        static const char* anchors[] = {"start", "middle", "end"};
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "<text x=\"%.1f\" y=\"%.1f\" font-family=\"sans-serif\" font-size=\"%d\" fill=\"%s\" "
                      "text-anchor=\"%s\" dominant-baseline=\"middle\"%s>",
                      x, y, size == 1 ? 11 : size == 2 ? 13 : 17, hex(c).c_str(), anchors[anchor],
                      vertical ? str(" transform=\"rotate(-90 ", x, " ", y, ")\"").c_str() : "");
        body += buf;
        for (char ch : s) {  // XML escapes
            if (ch == '<') body += "&lt;";
            else if (ch == '>') body += "&gt;";
            else if (ch == '&') body += "&amp;";
            else if (ch == '"') body += "&quot;";
            else body += ch;
        }
        body += "</text>\n";
    }
};

class RasterPainter : public Painter {
public:
    Canvas canvas;
    RasterPainter(int w, int h) : canvas(w, h, kWhite) {}
    void line(double x0, double y0, double x1, double y1, double w, Rgb c) override { canvas.line(x0, y0, x1, y1, w, c); }
    void disc(double x, double y, double r, Rgb c) override { canvas.disc(x, y, r, c); }
    void text(double x, double y, const std::string& s, int size, int anchor, Rgb c, bool vertical) override {
        const int scale = size == 3 ? 3 : size == 2 ? 2 : 1;
        const double w = Canvas::text_width(s, scale);
        const double shift = anchor == 0 ? 0 : anchor == 1 ? w / 2 : w;
        if (vertical) canvas.text(x, y + shift, s, scale, c, true);
        else canvas.text(x - shift, y, s, scale, c);
    }
};

void draw(const Chart& chart, int width, int height, Painter& p) {
    std::vector<double> xs, ys;
    for (const auto& s : chart.series)
        for (const auto& pt : s.points) {
            OSPREY_CHECK(std::isfinite(pt.x) && std::isfinite(pt.y), "chart '", chart.title, "': point (", pt.x, ", ",
                         pt.y, ") of '", s.label, "' is not finite");
            xs.push_back(pt.x);
            ys.push_back(pt.y);
        }
    OSPREY_CHECK(!xs.empty(), "chart '", chart.title, "' has no points");
    // The legend takes the right-hand side: as wide as its longest label at the normal size (12 px
    // per character in the raster font), at most 40% of the chart, else its labels go small.
    size_t longest = 0;
    for (const auto& s : chart.series) longest = std::max(longest, s.label.size());
    const double legend_normal = 70 + 12.0 * double(longest);
    const bool legend_small = legend_normal > 0.4 * width;
    const double legend = legend_small ? std::min(70 + 6.0 * double(longest), 0.4 * width) : std::max(160.0, legend_normal);
    const double left = 90, right = width - legend, top = 70, bottom = height - 70.0;
    const Axis ax = make_axis(xs, chart.x_log, left, right);
    const Axis ay = make_axis(ys, chart.y_log, bottom, top);

    p.text(width / 2.0, 22, chart.title, 3, 1, kInk);
    if (!chart.subtitle.empty()) p.text(width / 2.0, 48, chart.subtitle, 1, 1, kInk);
    for (double t : ax.ticks) {
        const double x = ax.map(t);
        p.line(x, top, x, bottom, 1, kGrid);
        p.line(x, bottom, x, bottom + 5, 1, kInk);
        p.text(x, bottom + 16, tick_label(t), 2, 1, kInk);
    }
    for (double t : ay.ticks) {
        const double y = ay.map(t);
        p.line(left, y, right, y, 1, kGrid);
        p.line(left - 5, y, left, y, 1, kInk);
        p.text(left - 9, y, tick_label(t), 2, 2, kInk);
    }
    p.line(left, bottom, right, bottom, 1.5, kInk);
    p.line(left, top, left, bottom, 1.5, kInk);
    p.text((left + right) / 2, height - 22.0, chart.x_label + (ax.log ? " (log scale)" : ""), 2, 1, kInk);
    p.text(24, (top + bottom) / 2, chart.y_label + (ay.log ? " (log scale)" : ""), 2, 1, kInk, true);

    for (size_t i = 0; i < chart.series.size(); ++i) {
        const ChartSeries& s = chart.series[i];
        const Rgb c = kPalette[i % std::size(kPalette)];
        for (size_t k = 0; k + 1 < s.points.size(); ++k)
            p.line(ax.map(s.points[k].x), ay.map(s.points[k].y), ax.map(s.points[k + 1].x), ay.map(s.points[k + 1].y),
                   2.5, c);
        for (const auto& pt : s.points) {
            p.disc(ax.map(pt.x), ay.map(pt.y), 4.5, c);
            if (!pt.tag.empty()) p.text(ax.map(pt.x) + 7, ay.map(pt.y) - 10, pt.tag, 1, 0, c);
        }
        const double ly = top + 10 + 26.0 * double(i);
        p.line(right + 20, ly, right + 50, ly, 3, c);
        p.disc(right + 35, ly, 4.5, c);
        p.text(right + 58, ly, s.label, legend_small ? 1 : 2, 0, kInk);
    }
}

std::string short_count(int64_t n) {
    if (n >= 1024 && n % 1024 == 0) return std::to_string(n / 1024) + "k";
    return std::to_string(n);
}

}  // namespace

std::string render_svg(const Chart& chart, int width, int height) {
    SvgPainter p;
    draw(chart, width, height, p);
    return str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", width,
               "\" height=\"", height, "\" viewBox=\"0 0 ", width, " ", height, "\">\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n",
               p.body, "</svg>\n");
}

std::vector<uint8_t> render_png(const Chart& chart, int width, int height) {
    RasterPainter p(width, height);
    draw(chart, width, height, p);
    return encode_png_rgb(p.canvas.pixels(), width, height);
}

std::vector<std::pair<std::string, Chart>> charts_from_reports(const std::vector<json::Value>& reports) {
    Chart decode{"Decode: speed per user vs cost", "", "output tokens/s per user", "USD per million output tokens",
                 false, true, {}};
    Chart prefill{"Prefill (batch 1): speed vs cost", "", "input tokens/s", "USD per million input tokens", false,
                  true, {}};
    std::map<std::string, std::pair<size_t, size_t>> decode_index, prefill_index;  // label -> (series, report)
    std::string models;
    // The series of `label` from report `k`: a label another report already used gets " (file k+1)".
    auto series_of = [](Chart& chart, std::map<std::string, std::pair<size_t, size_t>>& index, std::string label,
                        size_t k) -> ChartSeries& {
        auto it = index.find(label);
        if (it != index.end() && it->second.second != k) {
            label += str(" (file ", k + 1, ")");
            it = index.find(label);
        }
        if (it == index.end()) {
            it = index.emplace(label, std::make_pair(chart.series.size(), k)).first;
            chart.series.push_back({label, {}});
        }
        return chart.series[it->second.first];
    };
    // Reports of more than one model: every curve's label starts with the model's short name
    // ("gpt-oss-120b shape: 36 layers, ..." -> "gpt-oss-120b").
    auto short_model = [](const json::Value& r) {
        const std::string m = r.at("run").at("model").as_string();
        return m.substr(0, std::min(m.find(" shape"), m.find(':')));
    };
    bool several_models = false;
    for (const json::Value& r : reports) several_models = several_models || short_model(r) != short_model(reports[0]);
    for (size_t k = 0; k < reports.size(); ++k) {
        const json::Value& r = reports[k];
        const json::Value& run = r.at("run");
        const std::string command = run.at("command").as_string();
        const std::string layout =
            (several_models ? short_model(r) + " " : std::string()) + run.at("layout").at("label").as_string();
        const std::string who =
            (several_models ? short_model(r) : run.at("model").as_string()) + " on " + run.at("device").as_string();
        if (models.find(who) == std::string::npos) models += (models.empty() ? "" : "; ") + who;
        if (command == "decode") {
            for (const json::Value& row : r.at("results").as_array()) {
                const json::Value* fill = row.find("kv_fill");
                const bool shared = fill && fill->is_string() && fill->as_string() == "shared";
                const std::string label =
                    str(layout, " ctx ", short_count(row.at("context").as_int()), shared ? " shared-KV" : "");
                series_of(decode, decode_index, label, k)
                    .points.push_back({row.at("tokens_per_s_per_user").as_double(),
                                       row.at("cost_per_million_output_usd").as_double(),
                                       str("b", row.at("batch").as_int())});
            }
        } else if (command == "prefill") {
            for (const json::Value& row : r.at("results").as_array())
                series_of(prefill, prefill_index, layout, k)
                    .points.push_back({row.at("input_tokens_per_s").as_double(),
                                       row.at("cost_per_million_input_usd").as_double(),
                                       short_count(row.at("prompt_tokens").as_int())});
        }
    }
    std::vector<std::pair<std::string, Chart>> out;
    if (!decode.series.empty()) {
        decode.subtitle = models;
        out.emplace_back("decode", std::move(decode));
    }
    if (!prefill.series.empty()) {
        prefill.subtitle = models;
        out.emplace_back("prefill", std::move(prefill));
    }
    return out;
}

}  // namespace osprey::benchtool
