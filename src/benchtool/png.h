// A PNG encoder for 8-bit RGB images: IHDR, one IDAT holding a zlib stream (one deflate block with
// the fixed Huffman codes and LZ77 matches) with its Adler-32, IEND; every chunk carries its CRC-32.
// No compression library.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace osprey::benchtool {

uint32_t crc32(std::span<const uint8_t> bytes, uint32_t crc = 0);  // PNG/zlib CRC-32 (reflected 0xEDB88320)
uint32_t adler32(std::span<const uint8_t> bytes);

// rgb: [height, width, 3] row-major. Returns the PNG file's bytes.
std::vector<uint8_t> encode_png_rgb(std::span<const uint8_t> rgb, int width, int height);
void write_file(const std::string& path, std::span<const uint8_t> bytes);

}  // namespace osprey::benchtool
