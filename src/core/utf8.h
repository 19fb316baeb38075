// UTF-8 validation and decoding (strict: no overlongs, no surrogates, nothing above U+10FFFF).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace osprey::utf8 {

// Length in bytes of the valid UTF-8 sequence starting at s[i], or 0 if it is invalid or truncated.
size_t sequence_length(std::string_view s, size_t i);

// Decodes the sequence at s[i] (which must be valid: see sequence_length) and advances i.
uint32_t decode(std::string_view s, size_t& i);

// Appends code point cp (≤ U+10FFFF, not a surrogate) as UTF-8.
void append(std::string& out, uint32_t cp);

// Byte offset of the first invalid sequence, or npos when all of s is valid UTF-8.
size_t first_invalid(std::string_view s);
inline bool is_valid(std::string_view s) { return first_invalid(s) == std::string_view::npos; }

// Length of the longest prefix of s that does not end inside a multi-byte sequence which the next
// bytes could still complete (for streaming decoders that must never emit half a character).
size_t complete_prefix_length(std::string_view s);

}  // namespace osprey::utf8
