// tiktoken rank-file parser (see rank_file.h). Test: tests/tokenizer/test_rank_file.cpp.
#include "tokenizer/rank_file.h"

#include <charconv>

#include "core/check.h"

namespace osprey::tok {
namespace {

int base64_value(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

// Strict standard base64 with padding; false on anything else.
bool decode_base64(std::string_view in, std::string& out) {
    out.clear();
    if (in.empty() || in.size() % 4 != 0) return false;
    for (size_t i = 0; i < in.size(); i += 4) {
        const bool last = i + 4 == in.size();
        int v[4];
        int n_pad = 0;
        for (int k = 0; k < 4; ++k) {
            const char c = in[i + k];
            if (c == '=' && last && k >= 2) {
                v[k] = 0;
                ++n_pad;
            } else {
                if (n_pad > 0) return false;  // data after padding
                v[k] = base64_value(c);
                if (v[k] < 0) return false;
            }
        }
        const uint32_t w = uint32_t(v[0]) << 18 | uint32_t(v[1]) << 12 | uint32_t(v[2]) << 6 | uint32_t(v[3]);
        out += char(w >> 16);
        if (n_pad < 2) out += char((w >> 8) & 0xff);
        if (n_pad < 1) out += char(w & 0xff);
    }
    return true;
}

}  // namespace

std::vector<std::string> parse_tiktoken_ranks(std::string_view text, std::string_view source) {
    std::vector<std::string> tokens;
    std::vector<bool> seen;
    size_t pos = 0;
    size_t line_no = 0;
    std::string bytes;
    while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string_view::npos) end = text.size();
        std::string_view line = text.substr(pos, end - pos);
        pos = end + 1;
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.empty()) continue;
        const size_t space = line.find(' ');
        OSPREY_CHECK(space != std::string_view::npos, source, ":", line_no,
                     ": expected '<base64 token> <rank>', found no space");
        const std::string_view b64 = line.substr(0, space);
        const std::string_view rank_text = line.substr(space + 1);
        OSPREY_CHECK(decode_base64(b64, bytes), source, ":", line_no, ": invalid base64 '", b64.substr(0, 64), "'");
        int64_t rank = -1;
        const auto [ptr, ec] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
        OSPREY_CHECK(ec == std::errc() && ptr == rank_text.data() + rank_text.size() && rank >= 0 && rank < (1 << 24),
                     source, ":", line_no, ": invalid rank '", rank_text.substr(0, 32), "'");
        if (size_t(rank) >= tokens.size()) {
            tokens.resize(size_t(rank) + 1);
            seen.resize(size_t(rank) + 1, false);
        }
        OSPREY_CHECK(!seen[size_t(rank)], source, ":", line_no, ": rank ", rank, " appears twice");
        seen[size_t(rank)] = true;
        tokens[size_t(rank)] = bytes;
    }
    OSPREY_CHECK(!tokens.empty(), source, ": no tokens in the rank file");
    for (size_t r = 0; r < tokens.size(); ++r) {
        OSPREY_CHECK(seen[r], source, ": rank ", r, " is missing (ranks must be 0..", tokens.size() - 1, ")");
    }
    return tokens;
}

}  // namespace osprey::tok
