// Hand-written scanner equivalent to the o200k pattern. Alternatives, tried in order at each start:
//   1  [^\r\n\p{L}\p{N}]?[Lu Lt Lm Lo M]*[Ll Lm Lo M]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//   2  [^\r\n\p{L}\p{N}]?[Lu Lt Lm Lo M]+[Ll Lm Lo M]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//   3  \p{N}{1,3}
//   4   ?[^\s\p{L}\p{N}]+[\r\n/]*
//   5  \s*[\r\n]+      6  \s+(?!\S)      7  \s+
// Each function below returns the end of its alternative's match at a start, or kNone, and says
// how backtracking resolves (the first success in the regex's priority order is the match).
#include "tokenizer/pretokenizer.h"

#include <cstdint>

#include "tokenizer/unicode_classes.h"

namespace osprey::tok {
namespace {

constexpr size_t kNone = ~size_t(0);

struct CodePoint {
    uint32_t cp;
    uint32_t len;  // bytes
};

// Decodes the (valid) UTF-8 sequence at s[i].
inline CodePoint at(std::string_view s, size_t i) {
    const auto b = [&](size_t k) { return uint32_t(uint8_t(s[i + k])); };
    const uint32_t c = b(0);
    if (c < 0x80) return {c, 1};
    if (c < 0xe0) return {((c & 0x1f) << 6) | (b(1) & 0x3f), 2};
    if (c < 0xf0) return {((c & 0x0f) << 12) | ((b(1) & 0x3f) << 6) | (b(2) & 0x3f), 3};
    return {((c & 0x07) << 18) | ((b(1) & 0x3f) << 12) | ((b(2) & 0x3f) << 6) | (b(3) & 0x3f), 4};
}

inline bool is_cr_lf(uint32_t cp) { return cp == '\r' || cp == '\n'; }
inline char lower_ascii(char c) { return (c >= 'A' && c <= 'Z') ? char(c + 32) : c; }

// (?i:'s|'t|'re|'ve|'m|'ll|'d)? at i: returns the end after the contraction, or i. Under Unicode
// simple case folding 's' also matches U+017F LATIN SMALL LETTER LONG S (bytes C5 BF); no other
// letter of these has a non-ASCII case variant.
size_t contraction(std::string_view s, size_t i) {
    const size_t n = s.size();
    if (i + 1 >= n || s[i] != '\'') return i;
    const char c = lower_ascii(s[i + 1]);
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
    if (uint8_t(s[i + 1]) == 0xc5 && i + 2 < n && uint8_t(s[i + 2]) == 0xbf) return i + 3;
    if (i + 2 < n) {
        const char c2 = lower_ascii(s[i + 2]);
        if ((c == 'r' || c == 'v') && c2 == 'e') return i + 3;
        if (c == 'l' && c2 == 'l') return i + 3;
    }
    return i;
}

// Alternative 1 after the optional prefix, from `start`: U* is greedy, then W+ needs one char, so
// U* gives back characters until W+ can start. The start chosen is the last position m (scanning
// back from the end e of the U run) whose char is in W: either e itself (an Ll after the run, then
// W+ runs on) or the last Lm/Lo/M inside the run (then W+ holds just that char, since nothing after
// it in the run nor at e is in W).
size_t letters_lower(std::string_view s, size_t start) {
    const size_t n = s.size();
    size_t j = start;
    size_t last_both_end = kNone;  // end of the last char of the U run that is also in W
    while (j < n) {
        const CodePoint c = at(s, j);
        const uint8_t f = classes_of(c.cp);
        if (!(f & kUpperish)) break;
        j += c.len;
        if (f & kLowerish) last_both_end = j;
    }
    if (j < n && (classes_of(at(s, j).cp) & kLowerish)) {
        while (j < n) {
            const CodePoint c = at(s, j);
            if (!(classes_of(c.cp) & kLowerish)) break;
            j += c.len;
        }
        return contraction(s, j);
    }
    if (last_both_end != kNone) return contraction(s, last_both_end);
    return kNone;
}

// Alternative 2 after the optional prefix: U+ then W* then the contraction, all greedy, no
// backtracking needed.
size_t letters_upper(std::string_view s, size_t start) {
    const size_t n = s.size();
    size_t j = start;
    while (j < n) {
        const CodePoint c = at(s, j);
        if (!(classes_of(c.cp) & kUpperish)) break;
        j += c.len;
    }
    if (j == start) return kNone;
    while (j < n) {
        const CodePoint c = at(s, j);
        if (!(classes_of(c.cp) & kLowerish)) break;
        j += c.len;
    }
    return contraction(s, j);
}

inline bool is_symbol(uint8_t f) { return !(f & (kSpace | kLetter | kNumber)); }  // [^\s\p{L}\p{N}]

// Alternative 4 from `start` (after the optional space): [^\s\p{L}\p{N}]+ then [\r\n/]*.
size_t symbols(std::string_view s, size_t start) {
    const size_t n = s.size();
    size_t j = start;
    while (j < n) {
        const CodePoint c = at(s, j);
        if (!is_symbol(classes_of(c.cp))) break;
        j += c.len;
    }
    if (j == start) return kNone;
    while (j < n && (s[j] == '\r' || s[j] == '\n' || s[j] == '/')) ++j;
    return j;
}

// Alternatives 5-7 at a whitespace char. 5: \s* gives back until [\r\n]+ can match, so the match
// ends right after the last \r or \n of the whitespace run. 6: \s+ gives back one char so that the
// look-ahead sees whitespace, unless the run reaches the end of input (then the whole run); it
// fails for a run of one char followed by a non-space. 7: the whole run.
size_t whitespace(std::string_view s, size_t start) {
    const size_t n = s.size();
    size_t j = start;
    size_t last_newline_end = kNone;
    size_t last_char_start = start;
    while (j < n) {
        const CodePoint c = at(s, j);
        if (!(classes_of(c.cp) & kSpace)) break;
        last_char_start = j;
        j += c.len;
        if (is_cr_lf(c.cp)) last_newline_end = j;
    }
    if (last_newline_end != kNone) return last_newline_end;
    if (j == n) return j;
    if (last_char_start > start) return last_char_start;
    return j;
}

}  // namespace

size_t piece_end(std::string_view s, size_t i) {
    const size_t n = s.size();
    const CodePoint c0 = at(s, i);
    const uint8_t f0 = classes_of(c0.cp);

    const bool prefix = !is_cr_lf(c0.cp) && !(f0 & (kLetter | kNumber));  // [^\r\n\p{L}\p{N}]
    if (prefix) {
        const size_t r = letters_lower(s, i + c0.len);
        if (r != kNone) return r;
    }
    if (f0 & (kUpperish | kLowerish)) {
        const size_t r = letters_lower(s, i);
        if (r != kNone) return r;
    }
    if (prefix) {
        const size_t r = letters_upper(s, i + c0.len);
        if (r != kNone) return r;
    }
    if (f0 & kUpperish) {
        const size_t r = letters_upper(s, i);
        if (r != kNone) return r;
    }
    if (f0 & kNumber) {
        size_t j = i + c0.len;
        for (int k = 1; k < 3 && j < n; ++k) {
            const CodePoint c = at(s, j);
            if (!(classes_of(c.cp) & kNumber)) break;
            j += c.len;
        }
        return j;
    }
    if (c0.cp == ' ' && i + 1 < n) {
        const size_t r = symbols(s, i + 1);
        if (r != kNone) return r;
    }
    if (is_symbol(f0)) return symbols(s, i);
    return whitespace(s, i);  // every char not handled above is whitespace
}

std::vector<std::string> split_pieces(std::string_view text) {
    std::vector<std::string> out;
    for_each_piece(text, [&](std::string_view p) { out.emplace_back(p); });
    return out;
}

}  // namespace osprey::tok
