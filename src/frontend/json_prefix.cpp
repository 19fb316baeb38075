// Incremental JSON-prefix check (see json_prefix.h). Mirrors core/json.cpp's grammar byte by byte;
// the two places where the parser's verdict is not local to the grammar are handled exactly too:
// \u escapes (a lone low surrogate, or a high one not followed by a low one, is rejected as soon as
// its digits show it) and numbers out of double range (a number whose exponent can still be
// extended is viable while some extension lands in range).
#include "frontend/json_prefix.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace osprey::frontend {

namespace {

bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
int hex_value(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// json::parse's verdict on a complete number token.
bool number_ok(std::string_view text) {
    if (text.find_first_of(".eE") == std::string_view::npos) {
        int64_t i = 0;
        auto r = std::from_chars(text.data(), text.data() + text.size(), i);
        if (r.ec == std::errc() && r.ptr == text.data() + text.size()) return true;
    }
    double d = 0;
    auto r = std::from_chars(text.data(), text.data() + text.size(), d);
    return r.ec == std::errc();
}

// -1: out of range on the side where a larger exponent magnitude moves toward the range; 0: in
// range; +1: out of range on the far side.
int exponent_side(const std::string& mantissa, bool negative, int64_t x) {
    const std::string text = mantissa + "e" + (negative ? "-" : "") + std::to_string(x);
    if (number_ok(text)) return 0;
    const bool overflow = std::isinf(std::strtod(text.c_str(), nullptr));
    // A negative exponent shrinks the value as it grows: overflow is before the range.
    return overflow == negative ? -1 : 1;
}

}  // namespace

size_t JsonPrefix::push(std::string_view s) {
    for (size_t i = 0; i < s.size(); ++i)
        if (!push(s[i])) return i;
    return s.size();
}

bool JsonPrefix::push(char c) {
    if (!viable_) return false;
    viable_ = step(uint8_t(c));
    return viable_;
}

bool JsonPrefix::complete() const {
    if (!viable_ || !stack_.empty()) return false;
    if (mode_ == Mode::after) return true;
    return mode_ == Mode::number && (num_ == Num::zero || num_ == Num::int_digits || num_ == Num::frac || num_ == Num::exp) &&
           number_in_range();
}

bool JsonPrefix::end_value() {
    mode_ = Mode::after;
    if (stack_.empty()) top_done_ = true;
    return true;
}

bool JsonPrefix::start_value(uint8_t c) {
    if (int(stack_.size()) > max_depth_) return false;  // the parser's nesting limit
    switch (c) {
        case '{':
            stack_.push_back('{');
            mode_ = Mode::first_key;
            return true;
        case '[':
            stack_.push_back('[');
            mode_ = Mode::first_value;
            return true;
        case '"':
            mode_ = Mode::string;
            is_key_ = false;
            return true;
        case 't': literal_ = "true"; break;
        case 'f': literal_ = "false"; break;
        case 'n': literal_ = "null"; break;
        default:
            if (c != '-' && !is_digit(c)) return false;
            mode_ = Mode::number;
            number_.assign(1, char(c));
            num_ = c == '-' ? Num::minus : c == '0' ? Num::zero : Num::int_digits;
            return true;
    }
    mode_ = Mode::literal;
    literal_pos_ = 1;
    return true;
}

bool JsonPrefix::step(uint8_t c) {
    switch (mode_) {
        case Mode::value:
        case Mode::first_value:
            if (is_ws(c)) return true;
            if (mode_ == Mode::first_value && c == ']') {
                stack_.pop_back();
                return end_value();
            }
            return start_value(c);
        case Mode::key:
        case Mode::first_key:
            if (is_ws(c)) return true;
            if (mode_ == Mode::first_key && c == '}') {
                stack_.pop_back();
                return end_value();
            }
            if (c != '"') return false;
            mode_ = Mode::string;
            is_key_ = true;
            return true;
        case Mode::colon:
            if (is_ws(c)) return true;
            if (c != ':') return false;
            mode_ = Mode::value;
            return true;
        case Mode::after:
            if (is_ws(c)) return true;
            if (stack_.empty()) return false;  // text after the document
            if (c == ',') {
                mode_ = stack_.back() == '[' ? Mode::value : Mode::key;
                return true;
            }
            if ((c == ']' && stack_.back() == '[') || (c == '}' && stack_.back() == '{')) {
                stack_.pop_back();
                return end_value();
            }
            return false;
        case Mode::string: return string_byte(c);
        case Mode::literal:
            if (c != uint8_t(literal_[literal_pos_])) return false;
            if (++literal_pos_ == literal_.size()) return end_value();
            return true;
        case Mode::number: return number_byte(c);
    }
    return false;
}

bool JsonPrefix::string_byte(uint8_t c) {
    if (utf8_left_ > 0) {
        if (c < utf8_lo_ || c > utf8_hi_) return false;
        utf8_lo_ = 0x80;
        utf8_hi_ = 0xbf;
        --utf8_left_;
        return true;
    }
    if (surrogate_ == 1) {  // a high surrogate must be followed by \u and a low one
        if (c != '\\') return false;
        surrogate_ = 2;
        return true;
    }
    if (surrogate_ == 2) {
        if (c != 'u') return false;
        surrogate_ = 3;
        escape_ = 2;
        hex_ = 0;
        return true;
    }
    if (escape_ == 1) {
        switch (c) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                escape_ = 0;
                return true;
            case 'u':
                escape_ = 2;
                hex_ = 0;
                return true;
            default: return false;
        }
    }
    if (escape_ >= 2) {
        const int v = hex_value(c);
        if (v < 0) return false;
        hex_ = hex_ * 16 + uint32_t(v);
        const int digits = escape_ - 1;  // read so far
        if (surrogate_ == 3) {           // the low surrogate: dc00..dfff
            if (digits == 1 && hex_ != 0xd) return false;
            if (digits == 2 && (hex_ < 0xdc || hex_ > 0xdf)) return false;
        } else if (digits == 2 && hex_ >= 0xdc && hex_ <= 0xdf) {
            return false;  // a lone low surrogate
        }
        if (digits < 4) {
            ++escape_;
            return true;
        }
        escape_ = 0;
        if (surrogate_ == 3) surrogate_ = 0;
        else if (hex_ >= 0xd800 && hex_ < 0xdc00) surrogate_ = 1;
        return true;
    }
    if (c == '"') {
        if (is_key_) {
            mode_ = Mode::colon;
            return true;
        }
        return end_value();
    }
    if (c == '\\') {
        escape_ = 1;
        return true;
    }
    if (c < 0x20) return false;
    if (c < 0x80) return true;
    // UTF-8 lead bytes, as core/utf8.cpp's sequence_length accepts them.
    utf8_lo_ = 0x80;
    utf8_hi_ = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) utf8_left_ = 1;
    else if (c >= 0xe0 && c <= 0xef) utf8_left_ = 2;
    else if (c >= 0xf0 && c <= 0xf4) utf8_left_ = 3;
    else return false;
    if (c == 0xe0) utf8_lo_ = 0xa0;  // overlong
    if (c == 0xed) utf8_hi_ = 0x9f;  // surrogates
    if (c == 0xf0) utf8_lo_ = 0x90;  // overlong
    if (c == 0xf4) utf8_hi_ = 0x8f;  // above U+10FFFF
    return true;
}

bool JsonPrefix::number_in_range() const { return number_ok(number_); }

bool JsonPrefix::number_viable() const {
    // Before the exponent a number can always be brought into range (by the exponent, or it is 0);
    // after "e" either sign is still open. With the sign fixed, the exponent digits D so far can
    // reach exactly [D*10^k, D*10^k + 10^k - 1] for k more digits (k ≥ 1 when D is empty).
    if (num_ != Num::e_sign && num_ != Num::exp) return true;
    const size_t e = number_.find_first_of("eE");
    const std::string mantissa = number_.substr(0, e);
    if (mantissa.find_first_of("123456789") == std::string::npos) return true;  // zero: any exponent
    size_t d = e + 1;
    const bool negative = d < number_.size() && number_[d] == '-';
    if (d < number_.size() && (number_[d] == '-' || number_[d] == '+')) ++d;
    const std::string digits = number_.substr(d);
    constexpr int64_t kCap = int64_t(1) << 40;  // no in-range exponent is anywhere near this
    int64_t base = 0;
    for (char ch : digits) {
        base = base * 10 + (ch - '0');
        if (base > kCap) return false;  // every extension is at least this far out
    }
    int64_t width = 1;  // 10^k
    for (int k = digits.empty() ? 1 : 0;; ++k) {
        if (k > 0) {
            if (base > kCap / 10) return false;
            base *= 10;
            width = 1;
            for (int i = 0; i < k; ++i) width *= 10;
        }
        const int lo = exponent_side(mantissa, negative, base);
        if (lo == 0) return true;
        if (lo == 1) return false;  // every longer exponent is further out
        const int hi = exponent_side(mantissa, negative, base + width - 1);
        if (hi >= 0) return true;  // the side changes within the interval: one step is ×10, range is wider
        if (base + width - 1 > kCap) return false;
    }
}

bool JsonPrefix::number_byte(uint8_t c) {
    auto extend = [&](Num next) {
        number_ += char(c);
        num_ = next;
        return number_viable();
    };
    switch (num_) {
        case Num::minus:
            if (c == '0') return extend(Num::zero);
            if (is_digit(c)) return extend(Num::int_digits);
            return false;
        case Num::zero:
        case Num::int_digits:
            if (num_ == Num::int_digits && is_digit(c)) return extend(Num::int_digits);
            if (c == '.') return extend(Num::dot);
            if (c == 'e' || c == 'E') return extend(Num::e);
            break;
        case Num::dot:
            return is_digit(c) ? extend(Num::frac) : false;
        case Num::frac:
            if (is_digit(c)) return extend(Num::frac);
            if (c == 'e' || c == 'E') return extend(Num::e);
            break;
        case Num::e:
            if (c == '+' || c == '-') return extend(Num::e_sign);
            return is_digit(c) ? extend(Num::exp) : false;
        case Num::e_sign:
            return is_digit(c) ? extend(Num::exp) : false;
        case Num::exp:
            if (is_digit(c)) return extend(Num::exp);
            break;
    }
    // The number ended before c.
    if (!number_in_range()) return false;
    end_value();
    return step(c);
}

}  // namespace osprey::frontend
