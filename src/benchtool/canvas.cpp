#include "benchtool/canvas.h"

#include <algorithm>
#include <cmath>

#include "benchtool/font.h"
#include "core/check.h"

namespace osprey::benchtool {

Canvas::Canvas(int width, int height, Rgb background) : width_(width), height_(height) {
    OSPREY_CHECK(width >= 1 && height >= 1 && width <= 16384 && height <= 16384, "canvas size ", width, "x", height,
                 " outside [1, 16384]");
    rgb_.resize(size_t(width) * size_t(height) * 3);
    for (size_t i = 0; i < rgb_.size(); i += 3) {
        rgb_[i] = background.r;
        rgb_[i + 1] = background.g;
        rgb_[i + 2] = background.b;
    }
}

void Canvas::blend(int x, int y, Rgb c, double alpha) {
    if (x < 0 || y < 0 || x >= width_ || y >= height_ || alpha <= 0) return;
    alpha = std::min(alpha, 1.0);
    uint8_t* p = &rgb_[(size_t(y) * size_t(width_) + size_t(x)) * 3];
    const uint8_t src[3] = {c.r, c.g, c.b};
    for (int k = 0; k < 3; ++k) p[k] = uint8_t(std::lround(p[k] * (1 - alpha) + src[k] * alpha));
}

void Canvas::fill_rect(double x0, double y0, double x1, double y1, Rgb c) {
    const int xa = std::max(0, int(std::lround(std::min(x0, x1))));
    const int xb = std::min(width_, int(std::lround(std::max(x0, x1))));
    const int ya = std::max(0, int(std::lround(std::min(y0, y1))));
    const int yb = std::min(height_, int(std::lround(std::max(y0, y1))));
    for (int y = ya; y < yb; ++y)
        for (int x = xa; x < xb; ++x) blend(x, y, c, 1.0);
}

void Canvas::line(double x0, double y0, double x1, double y1, double width, Rgb c) {
    const double half = width / 2;
    const int xa = int(std::floor(std::min(x0, x1) - half - 1)), xb = int(std::ceil(std::max(x0, x1) + half + 1));
    const int ya = int(std::floor(std::min(y0, y1) - half - 1)), yb = int(std::ceil(std::max(y0, y1) + half + 1));
    const double dx = x1 - x0, dy = y1 - y0, len2 = dx * dx + dy * dy;
    for (int y = std::max(ya, 0); y <= std::min(yb, height_ - 1); ++y) {
        for (int x = std::max(xa, 0); x <= std::min(xb, width_ - 1); ++x) {
            const double px = x + 0.5, py = y + 0.5;  // pixel centre
            const double t = len2 > 0 ? std::clamp(((px - x0) * dx + (py - y0) * dy) / len2, 0.0, 1.0) : 0.0;
            const double d = std::hypot(px - (x0 + t * dx), py - (y0 + t * dy));
            blend(x, y, c, std::clamp(half + 0.5 - d, 0.0, 1.0));
        }
    }
}

void Canvas::disc(double cx, double cy, double radius, Rgb c) {
    for (int y = std::max(0, int(cy - radius - 1)); y <= std::min(height_ - 1, int(cy + radius + 1)); ++y)
        for (int x = std::max(0, int(cx - radius - 1)); x <= std::min(width_ - 1, int(cx + radius + 1)); ++x)
            blend(x, y, c, std::clamp(radius + 0.5 - std::hypot(x + 0.5 - cx, y + 0.5 - cy), 0.0, 1.0));
}

double Canvas::text_width(std::string_view s, int scale) {
    return s.empty() ? 0.0 : double(s.size() * kGlyphAdvance - 1) * scale;
}

double Canvas::text(double x, double y, std::string_view s, int scale, Rgb c, bool vertical) {
    const int x0 = int(std::lround(x)), y0 = int(std::lround(y - kGlyphHeight * scale / 2.0));
    const int xv = int(std::lround(x - kGlyphHeight * scale / 2.0)), yv = int(std::lround(y));
    for (size_t i = 0; i < s.size(); ++i) {
        const auto rows = glyph(s[i]);
        for (int r = 0; r < kGlyphHeight; ++r)
            for (int col = 0; col < kGlyphWidth; ++col) {
                if (!(rows[size_t(r)] & (0x10 >> col))) continue;
                const int along = int(i) * kGlyphAdvance + col;  // pixels along the text direction
                for (int sy = 0; sy < scale; ++sy)
                    for (int sx = 0; sx < scale; ++sx) {
                        if (!vertical)
                            blend(x0 + along * scale + sx, y0 + r * scale + sy, c, 1.0);
                        else  // rotated 90° left: along goes up, rows go right
                            blend(xv + r * scale + sy, yv - along * scale - sx, c, 1.0);
                    }
            }
    }
    return text_width(s, scale);
}

}  // namespace osprey::benchtool
