// An RGB raster for charts: anti-aliased lines and discs (coverage from the distance to the shape),
// filled rectangles, and 5x7 bitmap text at integer scales, horizontal or rotated 90° left.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace osprey::benchtool {

struct Rgb {
    uint8_t r = 0, g = 0, b = 0;
};

class Canvas {
public:
    Canvas(int width, int height, Rgb background);
    int width() const { return width_; }
    int height() const { return height_; }
    const std::vector<uint8_t>& pixels() const { return rgb_; }  // [height, width, 3]

    void blend(int x, int y, Rgb c, double alpha);  // alpha in [0, 1]; outside the canvas: ignored
    void fill_rect(double x0, double y0, double x1, double y1, Rgb c);
    void line(double x0, double y0, double x1, double y1, double width, Rgb c);
    void disc(double cx, double cy, double radius, Rgb c);
    // Text with its left end at x and its vertical centre at y (vertical: reads bottom to top, x is
    // the horizontal centre and y the bottom end). Returns the drawn length in pixels.
    double text(double x, double y, std::string_view s, int scale, Rgb c, bool vertical = false);
    static double text_width(std::string_view s, int scale);

private:
    int width_, height_;
    std::vector<uint8_t> rgb_;  // [height, width, 3]
};

}  // namespace osprey::benchtool
