#include "png_check.h"

#include <cstring>
#include <stdexcept>

namespace osprey::test {

namespace {

// Bitwise CRC-32 (no table), independent of the encoder's table-driven one.
uint32_t crc32_bitwise(const uint8_t* p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; ++i) {
        c ^= p[i];
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

uint32_t be32(const uint8_t* p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }

void need(bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error("PNG check: " + what);
}

}  // namespace

DecodedPng check_and_decode_png(const std::vector<uint8_t>& f) {
    static const uint8_t kSig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
    need(f.size() >= 8 && std::memcmp(f.data(), kSig, 8) == 0, "bad signature");
    DecodedPng out;
    std::vector<uint8_t> idat;
    size_t at = 8;
    bool seen_ihdr = false, seen_iend = false;
    while (at < f.size()) {
        need(at + 12 <= f.size(), "truncated chunk header");
        const uint32_t len = be32(&f[at]);
        need(at + 12 + len <= f.size(), "chunk length past the end");
        const std::string type(reinterpret_cast<const char*>(&f[at + 4]), 4);
        const uint32_t crc = be32(&f[at + 8 + len]);
        need(crc == crc32_bitwise(&f[at + 4], 4 + len), "CRC mismatch in " + type);
        const uint8_t* d = &f[at + 8];
        ++out.n_chunks;
        if (type == "IHDR") {
            need(!seen_ihdr && out.n_chunks == 1 && len == 13, "IHDR must come first, once, with 13 bytes");
            seen_ihdr = true;
            out.width = int(be32(d));
            out.height = int(be32(d + 4));
            need(out.width > 0 && out.height > 0, "zero size");
            need(d[8] == 8 && d[9] == 2 && d[10] == 0 && d[11] == 0 && d[12] == 0,
                 "expected 8-bit RGB, deflate, filter 0, no interlace");
        } else if (type == "IDAT") {
            need(seen_ihdr, "IDAT before IHDR");
            idat.insert(idat.end(), d, d + len);
        } else if (type == "IEND") {
            need(len == 0, "IEND with data");
            seen_iend = true;
        }
        at += 12 + len;
        if (seen_iend) break;
    }
    need(seen_iend && at == f.size(), "missing IEND or bytes after it");
    // zlib stream of stored blocks.
    need(idat.size() >= 6, "IDAT too short");
    need(idat[0] == 0x78 && ((idat[0] << 8) | idat[1]) % 31 == 0 && !(idat[1] & 0x20), "bad zlib header");
    std::vector<uint8_t> raw;
    size_t p = 2;
    for (bool last = false; !last;) {
        need(p + 5 <= idat.size(), "truncated deflate block header");
        last = idat[p] & 1;
        need((idat[p] >> 1 & 3) == 0, "only stored deflate blocks are expected");
        const uint16_t n = uint16_t(idat[p + 1] | idat[p + 2] << 8), nn = uint16_t(idat[p + 3] | idat[p + 4] << 8);
        need(uint16_t(~n) == nn, "stored block LEN/NLEN mismatch");
        p += 5;
        need(p + n <= idat.size(), "stored block past the end");
        raw.insert(raw.end(), idat.begin() + long(p), idat.begin() + long(p + n));
        p += n;
    }
    need(p + 4 == idat.size(), "bytes after the Adler-32");
    uint32_t a = 1, b = 0;
    for (uint8_t x : raw) a = (a + x) % 65521, b = (b + a) % 65521;
    need(((b << 16) | a) == be32(&idat[p]), "Adler-32 mismatch");
    const size_t row = size_t(out.width) * 3;
    need(raw.size() == (row + 1) * size_t(out.height), "decompressed size does not match IHDR");
    for (int y = 0; y < out.height; ++y) {
        need(raw[size_t(y) * (row + 1)] == 0, "unexpected filter type");
        const auto* src = &raw[size_t(y) * (row + 1) + 1];
        out.rgb.insert(out.rgb.end(), src, src + row);
    }
    return out;
}

}  // namespace osprey::test
