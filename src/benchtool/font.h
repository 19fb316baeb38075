// A 5x7 bitmap font for chart labels in PNG output: digits, letters (lower case drawn as small
// capitals), and the punctuation charts use. Unknown characters draw as an open box.
#pragma once

#include <array>
#include <cstdint>

namespace osprey::benchtool {

constexpr int kGlyphWidth = 5, kGlyphHeight = 7, kGlyphAdvance = 6;

// Row bits of one glyph, [7] rows top to bottom, bit 4 = leftmost column.
std::array<uint8_t, kGlyphHeight> glyph(char c);

}  // namespace osprey::benchtool
