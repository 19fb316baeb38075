// Unicode classes used by the o200k pre-tokenizer, per code point, from a generated table
// (unicode_classes_data.inc, made by tools/tokenizer/gen_unicode_classes.py from Unicode 16.0.0,
// the version of regex-syntax inside tiktoken). Test: tests/tokenizer/test_pretokenizer.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace osprey::tok {

// Flag bits of a code point's class.
enum ClassFlag : uint8_t {
    kUpperish = 1,  // Lu Lt Lm Lo M  (the pattern's [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])
    kLowerish = 2,  // Ll Lm Lo M     (the pattern's [\p{Ll}\p{Lm}\p{Lo}\p{M}])
    kLetter = 4,    // \p{L}
    kNumber = 8,    // \p{N}
    kSpace = 16,    // \s = White_Space
};

namespace detail {
// ASCII, by hand (the generated table agrees; a test checks it).
constexpr uint8_t ascii_class(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return kUpperish | kLetter;
    if (c >= 'a' && c <= 'z') return kLowerish | kLetter;
    if (c >= '0' && c <= '9') return kNumber;
    if ((c >= 0x09 && c <= 0x0d) || c == ' ') return kSpace;
    return 0;
}

extern const uint16_t* g_stage1;  // [0x1100] block index per 256 code points
extern const uint8_t* g_stage2;   // [n_blocks, 256] flags
}  // namespace detail

namespace detail {
// The generated table alone, without the ASCII shortcut (tests compare the two).
inline uint8_t table_classes_of(uint32_t cp) { return g_stage2[size_t(g_stage1[cp >> 8]) * 256 + (cp & 255)]; }
}  // namespace detail

// Flags of code point cp (≤ U+10FFFF). The tables are built once before main().
inline uint8_t classes_of(uint32_t cp) {
    if (cp < 128) return detail::ascii_class(cp);
    return detail::g_stage2[size_t(detail::g_stage1[cp >> 8]) * 256 + (cp & 255)];
}

}  // namespace osprey::tok
