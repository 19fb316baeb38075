#include "core/utf8.h"

namespace osprey::utf8 {

size_t sequence_length(std::string_view s, size_t i) {
    const size_t n = s.size();
    if (i >= n) return 0;
    const auto b = [&](size_t k) { return uint8_t(s[k]); };
    const uint8_t c = b(i);
    if (c < 0x80) return 1;
    auto cont = [&](size_t k) { return k < n && (b(k) & 0xc0) == 0x80; };
    if (c >= 0xc2 && c <= 0xdf) return cont(i + 1) ? 2 : 0;
    if (c >= 0xe0 && c <= 0xef) {
        if (!cont(i + 1) || !cont(i + 2)) return 0;
        if (c == 0xe0 && b(i + 1) < 0xa0) return 0;   // overlong
        if (c == 0xed && b(i + 1) >= 0xa0) return 0;  // surrogate
        return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return 0;
        if (c == 0xf0 && b(i + 1) < 0x90) return 0;  // overlong
        if (c == 0xf4 && b(i + 1) >= 0x90) return 0;  // above U+10FFFF
        return 4;
    }
    return 0;
}

uint32_t decode(std::string_view s, size_t& i) {
    const size_t len = sequence_length(s, i);
    const auto b = [&](size_t k) { return uint32_t(uint8_t(s[i + k])); };
    uint32_t cp = 0;
    switch (len) {
        case 1: cp = b(0); break;
        case 2: cp = ((b(0) & 0x1f) << 6) | (b(1) & 0x3f); break;
        case 3: cp = ((b(0) & 0x0f) << 12) | ((b(1) & 0x3f) << 6) | (b(2) & 0x3f); break;
        case 4: cp = ((b(0) & 0x07) << 18) | ((b(1) & 0x3f) << 12) | ((b(2) & 0x3f) << 6) | (b(3) & 0x3f); break;
        default: ++i; return 0xfffd;
    }
    i += len;
    return cp;
}

void append(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xc0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        out += char(0xe0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3f));
        out += char(0x80 | (cp & 0x3f));
    } else {
        out += char(0xf0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3f));
        out += char(0x80 | ((cp >> 6) & 0x3f));
        out += char(0x80 | (cp & 0x3f));
    }
}

size_t first_invalid(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        if (uint8_t(s[i]) < 0x80) {
            ++i;
            continue;
        }
        const size_t len = sequence_length(s, i);
        if (len == 0) return i;
        i += len;
    }
    return std::string_view::npos;
}

size_t complete_prefix_length(std::string_view s) {
    // Look back at most 3 bytes for a lead byte whose sequence is not yet complete.
    const size_t n = s.size();
    for (size_t back = 1; back <= 3 && back <= n; ++back) {
        const uint8_t c = uint8_t(s[n - back]);
        if ((c & 0xc0) == 0x80) continue;  // continuation byte: keep looking for the lead
        size_t need = 0;
        if (c >= 0xc0 && c < 0xe0) need = 2;
        else if (c >= 0xe0 && c < 0xf0) need = 3;
        else if (c >= 0xf0 && c < 0xf8) need = 4;
        if (need > back) return n - back;  // an unfinished sequence: hold it back
        return n;
    }
    return n;
}

}  // namespace osprey::utf8
