// An independent reader of the PNGs `osprey bench plot` writes, for tests: checks the signature,
// chunk order and every chunk's CRC-32, the IHDR fields, the zlib header, the deflate blocks (stored
// or fixed Huffman, inflated by its own decoder), the Adler-32, the filter bytes, and returns the
// pixels. Throws std::runtime_error naming the first problem.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace osprey::test {

struct DecodedPng {
    int width = 0, height = 0;
    std::vector<uint8_t> rgb;  // [height, width, 3]
    int n_chunks = 0;
};

DecodedPng check_and_decode_png(const std::vector<uint8_t>& file);

}  // namespace osprey::test
