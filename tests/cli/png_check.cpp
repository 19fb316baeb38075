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
    // zlib stream of stored or fixed-Huffman deflate blocks (RFC 1951), inflated bit by bit.
    need(idat.size() >= 6, "IDAT too short");
    need(idat[0] == 0x78 && ((idat[0] << 8) | idat[1]) % 31 == 0 && !(idat[1] & 0x20), "bad zlib header");
    std::vector<uint8_t> raw;
    size_t bitpos = 16;
    auto bit = [&]() -> uint32_t {
        need(bitpos / 8 < idat.size(), "deflate stream runs past the IDAT data");
        const uint32_t b = idat[bitpos / 8] >> (bitpos % 8) & 1u;
        ++bitpos;
        return b;
    };
    auto bits = [&](int n) {  // n bits, least significant first
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) v |= bit() << i;
        return v;
    };
    // Fixed literal/length code: read 7 bits MSB first, then extend to 8 or 9 by the code ranges.
    auto literal_length = [&]() -> int {
        uint32_t c = 0;
        for (int i = 0; i < 7; ++i) c = c << 1 | bit();
        if (c <= 0x17) return int(c) + 256;  // 7-bit codes 0000000..0010111
        c = c << 1 | bit();
        if (c >= 0x30 && c <= 0xBF) return int(c - 0x30);        // 8-bit 00110000..10111111 -> 0..143
        if (c >= 0xC0 && c <= 0xC7) return int(c - 0xC0) + 280;  // 8-bit 11000000..11000111 -> 280..287
        c = c << 1 | bit();
        need(c >= 0x190 && c <= 0x1FF, "bad fixed literal/length code");
        return int(c - 0x190) + 144;  // 9-bit -> 144..255
    };
    static const int len_base[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                     31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
    static const int dist_base[30] = {1,    2,    3,    4,    5,    7,    9,    13,    17,    25,
                                      33,   49,   65,   97,   129,  193,  257,  385,   513,   769,
                                      1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
    for (bool last = false; !last;) {
        last = bit();
        const uint32_t type = bits(2);
        if (type == 0) {
            bitpos = (bitpos + 7) / 8 * 8;
            const size_t p = bitpos / 8;
            need(p + 4 <= idat.size(), "truncated stored block header");
            const uint16_t n = uint16_t(idat[p] | idat[p + 1] << 8), nn = uint16_t(idat[p + 2] | idat[p + 3] << 8);
            need(uint16_t(~n) == nn, "stored block LEN/NLEN mismatch");
            need(p + 4 + n <= idat.size(), "stored block past the end");
            raw.insert(raw.end(), idat.begin() + long(p + 4), idat.begin() + long(p + 4 + n));
            bitpos = (p + 4 + n) * 8;
            continue;
        }
        need(type == 1, "only stored and fixed-Huffman deflate blocks are expected");
        for (;;) {
            const int v = literal_length();
            if (v < 256) {
                raw.push_back(uint8_t(v));
                continue;
            }
            if (v == 256) break;
            need(v <= 285, "bad length code");
            const int li = v - 257;
            const int extra = li < 8 || li == 28 ? 0 : (li - 4) / 4;
            const int length = len_base[li] + int(bits(extra));
            uint32_t dc = 0;
            for (int i = 0; i < 5; ++i) dc = dc << 1 | bit();
            need(dc < 30, "bad distance code");
            const int dextra = dc < 4 ? 0 : int(dc / 2 - 1);
            const size_t distance = size_t(dist_base[dc]) + bits(dextra);
            need(distance <= raw.size(), "distance before the start of the data");
            for (int k = 0; k < length; ++k) raw.push_back(raw[raw.size() - distance]);
        }
    }
    const size_t p = (bitpos + 7) / 8;
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
