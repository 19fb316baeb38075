#include "benchtool/png.h"

#include <algorithm>
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

// Deflate bit writer: bits go out least significant first; Huffman codes most significant first.
struct BitWriter {
    std::vector<uint8_t>& out;
    uint32_t acc = 0;
    int n = 0;
    void bits(uint32_t v, int count) {  // the low `count` bits of v, LSB first
        acc |= v << n;
        n += count;
        while (n >= 8) {
            out.push_back(uint8_t(acc));
            acc >>= 8;
            n -= 8;
        }
    }
    void code(uint32_t c, int len) {  // a Huffman code, MSB first
        uint32_t r = 0;
        for (int i = 0; i < len; ++i) r |= ((c >> i) & 1u) << (len - 1 - i);
        bits(r, len);
    }
    void flush() {
        if (n > 0) out.push_back(uint8_t(acc));
        acc = 0, n = 0;
    }
};

// The fixed literal/length code of RFC 1951 §3.2.6.
void put_literal_length(BitWriter& w, int v) {
    if (v < 144)
        w.code(0x30 + v, 8);
    else if (v < 256)
        w.code(0x190 + (v - 144), 9);
    else if (v < 280)
        w.code(v - 256, 7);
    else
        w.code(0xC0 + (v - 280), 8);
}

constexpr int kLengthBase[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
constexpr int kLengthExtra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                  2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
constexpr int kDistBase[30] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
                               193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
constexpr int kDistExtra[30] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

void put_match(BitWriter& w, int length, int distance) {
    int l = 28;
    while (kLengthBase[l] > length) --l;
    put_literal_length(w, 257 + l);
    w.bits(uint32_t(length - kLengthBase[l]), kLengthExtra[l]);
    int d = 29;
    while (kDistBase[d] > distance) --d;
    w.code(uint32_t(d), 5);
    w.bits(uint32_t(distance - kDistBase[d]), kDistExtra[d]);
}

// One final deflate block with the fixed Huffman codes and greedy LZ77 matching (hash chains over
// 3-byte prefixes, 32 KiB window). Charts are mostly runs of background and repeated rows, which
// this shrinks ~100x; no compression library needed.
void deflate_fixed(std::span<const uint8_t> in, std::vector<uint8_t>& out) {
    constexpr int kWindow = 32768, kMaxMatch = 258, kMaxChain = 32, kHashBits = 15;
    BitWriter w{out};
    w.bits(1, 1);  // BFINAL
    w.bits(1, 2);  // BTYPE 01: fixed Huffman codes
    std::vector<int> head(size_t(1) << kHashBits, -1), prev(in.size(), -1);
    auto hash = [&](size_t i) {
        return ((uint32_t(in[i]) << 16 | uint32_t(in[i + 1]) << 8 | in[i + 2]) * 2654435761u) >> (32 - kHashBits);
    };
    auto insert = [&](size_t i) {
        if (i + 2 >= in.size()) return;
        const uint32_t h = hash(i);
        prev[i] = head[h];
        head[h] = int(i);
    };
    size_t i = 0;
    while (i < in.size()) {
        int best = 0, best_dist = 0;
        if (i + 2 < in.size()) {
            const size_t limit = std::min<size_t>(kMaxMatch, in.size() - i);
            int cand = head[hash(i)];
            for (int chain = 0; cand >= 0 && chain < kMaxChain && int(i) - cand <= kWindow; ++chain) {
                size_t len = 0;
                while (len < limit && in[size_t(cand) + len] == in[i + len]) ++len;
                if (int(len) > best) best = int(len), best_dist = int(i) - cand;
                if (len == limit) break;
                cand = prev[size_t(cand)];
            }
        }
        if (best >= 3) {
            put_match(w, best, best_dist);
            for (int k = 0; k < best; ++k) insert(i + size_t(k));
            i += size_t(best);
        } else {
            put_literal_length(w, in[i]);
            insert(i);
            ++i;
        }
    }
    put_literal_length(w, 256);  // end of block
    w.flush();
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
    // zlib: CMF 0x78 (deflate, 32K window), FLG 0x01 (0x7801 % 31 == 0), one deflate block, Adler-32.
    std::vector<uint8_t> z = {0x78, 0x01};
    deflate_fixed(raw, z);
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
