#include "benchtool/png.h"

#include <array>
#include <fstream>

#include "core/check.h"

namespace osprey::benchtool {

namespace {

std::array<uint32_t, 256> make_crc_table() {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
        uint32_t c = n;
        for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        t[n] = c;
    }
    return t;
}

void put_u32_be(std::vector<uint8_t>& out, uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(uint8_t(v >> s));
}

void put_chunk(std::vector<uint8_t>& out, const char type[4], std::span<const uint8_t> data) {
    put_u32_be(out, uint32_t(data.size()));
    const size_t type_at = out.size();
    out.insert(out.end(), type, type + 4);
    out.insert(out.end(), data.begin(), data.end());
    put_u32_be(out, crc32({out.data() + type_at, 4 + data.size()}));  // CRC over type and data
}

}  // namespace

uint32_t crc32(std::span<const uint8_t> bytes, uint32_t crc) {
    static const std::array<uint32_t, 256> table = make_crc_table();
    uint32_t c = crc ^ 0xFFFFFFFFu;
    for (uint8_t b : bytes) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t adler32(std::span<const uint8_t> bytes) {
    constexpr uint32_t kMod = 65521;
    uint32_t a = 1, b = 0;
    for (uint8_t x : bytes) {
        a = (a + x) % kMod;
        b = (b + a) % kMod;
    }
    return (b << 16) | a;
}

std::vector<uint8_t> encode_png_rgb(std::span<const uint8_t> rgb, int width, int height) {
    OSPREY_CHECK(width >= 1 && height >= 1 && width <= 16384 && height <= 16384, "PNG size ", width, "x", height,
                 " outside [1, 16384]");
    const size_t row_bytes = size_t(width) * 3;
    OSPREY_CHECK(rgb.size() == row_bytes * size_t(height), "PNG: ", rgb.size(), " bytes of pixels for ", width, "x",
                 height, " RGB");
    // Scanlines, each with filter type 0 (none).
    std::vector<uint8_t> raw;
    raw.reserve((row_bytes + 1) * size_t(height));
    for (int y = 0; y < height; ++y) {
        raw.push_back(0);
        raw.insert(raw.end(), rgb.begin() + long(row_bytes * size_t(y)), rgb.begin() + long(row_bytes * size_t(y + 1)));
    }
    // zlib: CMF 0x78 (deflate, 32K window), FLG 0x01 (0x7801 % 31 == 0), stored blocks, Adler-32.
    std::vector<uint8_t> z = {0x78, 0x01};
    size_t at = 0;
    do {
        const size_t n = std::min<size_t>(65535, raw.size() - at);
        const bool last = at + n == raw.size();
        z.push_back(last ? 1 : 0);  // BFINAL, BTYPE 00 (stored)
        z.push_back(uint8_t(n & 0xFF));
        z.push_back(uint8_t(n >> 8));
        z.push_back(uint8_t(~n & 0xFF));
        z.push_back(uint8_t((~n >> 8) & 0xFF));
        z.insert(z.end(), raw.begin() + long(at), raw.begin() + long(at + n));
        at += n;
    } while (at < raw.size());
    put_u32_be(z, adler32(raw));

    std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
    std::vector<uint8_t> ihdr;
    put_u32_be(ihdr, uint32_t(width));
    put_u32_be(ihdr, uint32_t(height));
    ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // bit depth 8, colour type 2 (RGB), deflate, filter 0, no interlace
    put_chunk(png, "IHDR", ihdr);
    put_chunk(png, "IDAT", z);
    put_chunk(png, "IEND", {});
    return png;
}

void write_file(const std::string& path, std::span<const uint8_t> bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    OSPREY_CHECK(out.good(), "cannot open ", path, " for writing");
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    OSPREY_CHECK(out.good(), "writing ", path, " failed");
}

}  // namespace osprey::benchtool
