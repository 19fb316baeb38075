#include "core/json.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "core/check.h"
#include "core/utf8.h"

namespace osprey::json {

const char* type_name(Type t) {
    switch (t) {
        case Type::null:
            return "null";
        case Type::boolean:
            return "boolean";
        case Type::number:
            return "number";
        case Type::string:
            return "string";
        case Type::array:
            return "array";
        case Type::object:
            return "object";
    }
    return "?";
}

Value::Value(double d) {
    Number n{d, 0, false, true};
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) {
        n.i = int64_t(d);
        n.is_int = true;
    }
    v_ = n;
}

bool Value::is_integer() const {
    return is_number() && std::get<Number>(v_).is_int;
}
bool Value::is_float() const {
    return is_number() && std::get<Number>(v_).is_float;
}
bool Value::is_big_unsigned() const {
    return is_number() && std::get<Number>(v_).is_big_unsigned;
}
uint64_t Value::as_big_unsigned() const {
    OSPREY_CHECK(is_big_unsigned(), "expected an integer above 2^63 - 1");
    return std::get<Number>(v_).u;
}

#define OSPREY_JSON_EXPECT(want) \
    OSPREY_CHECK(type() == Type::want, "expected a JSON ", type_name(Type::want), ", got ", type_name(type()))

bool Value::as_bool() const {
    OSPREY_JSON_EXPECT(boolean);
    return std::get<bool>(v_);
}
double Value::as_double() const {
    OSPREY_JSON_EXPECT(number);
    return std::get<Number>(v_).d;
}
int64_t Value::as_int() const {
    OSPREY_JSON_EXPECT(number);
    const Number& n = std::get<Number>(v_);
    OSPREY_CHECK(n.is_int, "expected an integer, got ", format_number(n.d));
    return n.i;
}
const std::string& Value::as_string() const {
    OSPREY_JSON_EXPECT(string);
    return std::get<std::string>(v_);
}
const Array& Value::as_array() const {
    OSPREY_JSON_EXPECT(array);
    return *std::get<std::shared_ptr<Array>>(v_);
}
Array& Value::as_array() {
    OSPREY_JSON_EXPECT(array);
    auto& p = std::get<std::shared_ptr<Array>>(v_);
    if (p.use_count() > 1) p = std::make_shared<Array>(*p);  // copy on write
    return *p;
}
const Object& Value::as_object() const {
    OSPREY_JSON_EXPECT(object);
    return *std::get<std::shared_ptr<Object>>(v_);
}
Object& Value::as_object() {
    OSPREY_JSON_EXPECT(object);
    auto& p = std::get<std::shared_ptr<Object>>(v_);
    if (p.use_count() > 1) p = std::make_shared<Object>(*p);  // copy on write
    return *p;
}
#undef OSPREY_JSON_EXPECT

const Value* Value::find(std::string_view key) const {
    if (!is_object()) return nullptr;
    for (const auto& [k, v] : as_object())
        if (k == key) return &v;
    return nullptr;
}

const Value& Value::at(std::string_view key) const {
    const Value* v = find(key);
    OSPREY_CHECK(v != nullptr, "missing field '", key, "'");
    return *v;
}

Value& Value::set(std::string_view key, Value v) {
    if (is_null()) *this = Value(Object{});
    Object& o = as_object();
    for (auto& [k, old] : o)
        if (k == key) return old = std::move(v);
    o.emplace_back(std::string(key), std::move(v));
    return o.back().second;
}

Value& Value::push_back(Value v) {
    if (is_null()) *this = Value(Array{});
    Array& a = as_array();
    a.push_back(std::move(v));
    return a.back();
}

size_t Value::size() const {
    if (is_array()) return as_array().size();
    if (is_object()) return as_object().size();
    return 0;
}

bool Value::operator==(const Value& o) const {
    if (type() != o.type()) return false;
    switch (type()) {
        case Type::null:
            return true;
        case Type::boolean:
            return as_bool() == o.as_bool();
        case Type::number: {
            const Number& a = std::get<Number>(v_);
            const Number& b = std::get<Number>(o.v_);
            if (a.is_big_unsigned && b.is_big_unsigned) return a.u == b.u;
            if (a.is_big_unsigned || b.is_big_unsigned) return a.d == b.d;  // e.g. a double written as digits
            return a.is_int && b.is_int ? a.i == b.i : a.d == b.d;
        }
        case Type::string:
            return as_string() == o.as_string();
        case Type::array:
            return as_array() == o.as_array();
        case Type::object:
            return as_object() == o.as_object();
    }
    return false;
}

std::string format_number(double d) {
    if (!std::isfinite(d)) return "null";  // JSON has no NaN or infinity
    if (d == std::floor(d) && std::fabs(d) < 9007199254740992.0) {
        char buf[32];
        auto r = std::to_chars(buf, buf + sizeof buf, int64_t(d));
        return std::string(buf, r.ptr);
    }
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, d);  // shortest round-trip form
    return std::string(buf, r.ptr);
}

void append_quoted(std::string& out, std::string_view s, bool ensure_ascii) {
    static const char* kHex = "0123456789abcdef";
    out += '"';
    size_t i = 0;
    while (i < s.size()) {
        const uint8_t c = uint8_t(s[i]);
        if (c < 0x80) {
            switch (c) {
                case '"':
                    out += "\\\"";
                    break;
                case '\\':
                    out += "\\\\";
                    break;
                case '\n':
                    out += "\\n";
                    break;
                case '\r':
                    out += "\\r";
                    break;
                case '\t':
                    out += "\\t";
                    break;
                case '\b':
                    out += "\\b";
                    break;
                case '\f':
                    out += "\\f";
                    break;
                default:
                    if (c < 0x20) {
                        out += "\\u00";
                        out += kHex[c >> 4];
                        out += kHex[c & 15];
                    } else {
                        out += char(c);
                    }
            }
            ++i;
            continue;
        }
        const size_t len = utf8::sequence_length(s, i);
        uint32_t cp = 0xfffd;
        if (len == 0) {
            ++i;  // invalid byte: replaced
        } else {
            cp = utf8::decode(s, i);
        }
        if (!ensure_ascii) {
            utf8::append(out, cp);
            continue;
        }
        auto u16 = [&](uint32_t u) {
            out += "\\u";
            for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(u >> shift) & 15];
        };
        if (cp >= 0x10000) {
            cp -= 0x10000;
            u16(0xd800 + (cp >> 10));
            u16(0xdc00 + (cp & 0x3ff));
        } else {
            u16(cp);
        }
    }
    out += '"';
}

std::string quote(std::string_view s, bool ensure_ascii) {
    std::string out;
    append_quoted(out, s, ensure_ascii);
    return out;
}

void Value::dump_to(std::string& out, int indent, int depth) const {
    auto newline = [&](int d) {
        if (indent <= 0) return;
        out += '\n';
        out.append(size_t(indent) * size_t(d), ' ');
    };
    switch (type()) {
        case Type::null:
            out += "null";
            break;
        case Type::boolean:
            out += std::get<bool>(v_) ? "true" : "false";
            break;
        case Type::number: {
            const Number& n = std::get<Number>(v_);
            if (n.is_int) {
                out += std::to_string(n.i);
            } else if (n.is_big_unsigned) {
                out += std::to_string(n.u);
            } else {
                out += format_number(n.d);
            }
            break;
        }
        case Type::string:
            append_quoted(out, std::get<std::string>(v_));
            break;
        case Type::array: {
            const Array& a = as_array();
            out += '[';
            for (size_t i = 0; i < a.size(); ++i) {
                if (i) out += indent > 0 ? "," : ",";
                newline(depth + 1);
                a[i].dump_to(out, indent, depth + 1);
            }
            if (!a.empty()) newline(depth);
            out += ']';
            break;
        }
        case Type::object: {
            const Object& o = as_object();
            out += '{';
            for (size_t i = 0; i < o.size(); ++i) {
                if (i) out += ',';
                newline(depth + 1);
                append_quoted(out, o[i].first);
                out += indent > 0 ? ": " : ":";
                o[i].second.dump_to(out, indent, depth + 1);
            }
            if (!o.empty()) newline(depth);
            out += '}';
            break;
        }
    }
}

std::string Value::dump(int indent) const {
    std::string out;
    dump_to(out, indent, 0);
    return out;
}

// Recursive-descent parser over a string_view; depth-limited so hostile input cannot overflow the stack.
class Parser {
public:
    Parser(std::string_view s, const ParseOptions& o) : s_(s), opt_(o) {}

    Value parse_document() {
        skip_ws();
        Value v = parse_value(0);
        skip_ws();
        if (!opt_.allow_trailing && pos_ != s_.size()) error("unexpected text after the JSON value");
        return v;
    }

private:
    std::string_view s_;
    ParseOptions opt_;
    size_t pos_ = 0;

    [[noreturn]] void error(std::string_view what) const {
        size_t line = 1, col = 1;
        for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
            if (s_[i] == '\n') {
                ++line;
                col = 1;
            } else {
                ++col;
            }
        }
        OSPREY_FAIL("invalid JSON at line ", line, ", column ", col, ": ", what);
    }

    void skip_ws() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
            ++pos_;
    }

    bool consume(std::string_view lit) {
        if (s_.substr(pos_, lit.size()) == lit) {
            pos_ += lit.size();
            return true;
        }
        return false;
    }

    Value parse_value(int depth) {
        if (depth > opt_.max_depth) error("nesting deeper than the limit of " + std::to_string(opt_.max_depth));
        if (pos_ >= s_.size()) error("unexpected end of input, expected a value");
        const char c = s_[pos_];
        switch (c) {
            case '{':
                return parse_object(depth);
            case '[':
                return parse_array(depth);
            case '"':
                return Value(parse_string());
            case 't':
                if (consume("true")) return Value(true);
                break;
            case 'f':
                if (consume("false")) return Value(false);
                break;
            case 'n':
                if (consume("null")) return Value();
                break;
            default:
                if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
        }
        error(std::string("unexpected character '") +
              (uint8_t(c) >= 0x20 && uint8_t(c) < 0x7f ? std::string(1, c) : "\\x" + to_hex(uint8_t(c))) + "'");
    }

    static std::string to_hex(uint8_t b) {
        static const char* kHex = "0123456789abcdef";
        return std::string{kHex[b >> 4], kHex[b & 15]};
    }

    Value parse_object(int depth) {
        ++pos_;  // {
        Object o;
        std::unordered_map<std::string, size_t> index;  // key -> position in o, once o is large
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == '}') {
            ++pos_;
            return Value(std::move(o));
        }
        for (;;) {
            skip_ws();
            if (pos_ >= s_.size() || s_[pos_] != '"') error("expected a string key in object");
            std::string key = parse_string();
            skip_ws();
            if (pos_ >= s_.size() || s_[pos_] != ':') error("expected ':' after object key");
            ++pos_;
            skip_ws();
            Value v = parse_value(depth + 1);
            // Duplicate keys: the last one wins, as in most parsers. Large objects (a tokenizer.json
            // vocab has 200k members) look keys up in an index instead of scanning.
            constexpr size_t kIndexFrom = 32;
            if (o.size() == kIndexFrom && index.empty()) {
                for (size_t k = 0; k < o.size(); ++k) index.emplace(o[k].first, k);
            }
            bool replaced = false;
            if (o.size() >= kIndexFrom) {
                const auto it = index.find(key);
                if (it != index.end()) {
                    o[it->second].second = std::move(v);
                    replaced = true;
                } else {
                    index.emplace(key, o.size());
                }
            } else {
                for (auto& [k, old] : o) {
                    if (k == key) {
                        old = std::move(v);
                        replaced = true;
                        break;
                    }
                }
            }
            if (!replaced) o.emplace_back(std::move(key), std::move(v));
            skip_ws();
            if (pos_ >= s_.size()) error("unexpected end of input in object");
            if (s_[pos_] == ',') {
                ++pos_;
                continue;
            }
            if (s_[pos_] == '}') {
                ++pos_;
                return Value(std::move(o));
            }
            error("expected ',' or '}' in object");
        }
    }

    Value parse_array(int depth) {
        ++pos_;  // [
        Array a;
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ']') {
            ++pos_;
            return Value(std::move(a));
        }
        for (;;) {
            skip_ws();
            a.push_back(parse_value(depth + 1));
            skip_ws();
            if (pos_ >= s_.size()) error("unexpected end of input in array");
            if (s_[pos_] == ',') {
                ++pos_;
                continue;
            }
            if (s_[pos_] == ']') {
                ++pos_;
                return Value(std::move(a));
            }
            error("expected ',' or ']' in array");
        }
    }

    uint32_t parse_hex4() {
        if (pos_ + 4 > s_.size()) error("truncated \\u escape");
        uint32_t v = 0;
        for (int i = 0; i < 4; ++i) {
            const char c = s_[pos_++];
            v <<= 4;
            if (c >= '0' && c <= '9')
                v |= uint32_t(c - '0');
            else if (c >= 'a' && c <= 'f')
                v |= uint32_t(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F')
                v |= uint32_t(c - 'A' + 10);
            else
                error("invalid hex digit in \\u escape");
        }
        return v;
    }

    std::string parse_string() {
        ++pos_;  // opening quote
        std::string out;
        for (;;) {
            if (pos_ >= s_.size()) error("unterminated string");
            const uint8_t c = uint8_t(s_[pos_]);
            if (c == '"') {
                ++pos_;
                return out;
            }
            if (c < 0x20) error("control character in string (must be escaped)");
            if (c == '\\') {
                ++pos_;
                if (pos_ >= s_.size()) error("unterminated escape");
                const char e = s_[pos_++];
                switch (e) {
                    case '"':
                        out += '"';
                        break;
                    case '\\':
                        out += '\\';
                        break;
                    case '/':
                        out += '/';
                        break;
                    case 'b':
                        out += '\b';
                        break;
                    case 'f':
                        out += '\f';
                        break;
                    case 'n':
                        out += '\n';
                        break;
                    case 'r':
                        out += '\r';
                        break;
                    case 't':
                        out += '\t';
                        break;
                    case 'u': {
                        uint32_t cp = parse_hex4();
                        if (cp >= 0xd800 && cp < 0xdc00) {
                            if (!consume("\\u")) error("unpaired surrogate in \\u escape");
                            const uint32_t lo = parse_hex4();
                            if (lo < 0xdc00 || lo >= 0xe000) error("unpaired surrogate in \\u escape");
                            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                        } else if (cp >= 0xdc00 && cp < 0xe000) {
                            error("unpaired surrogate in \\u escape");
                        }
                        utf8::append(out, cp);
                        break;
                    }
                    default:
                        --pos_;
                        error("invalid escape character");
                }
                continue;
            }
            if (c < 0x80) {
                out += char(c);
                ++pos_;
                continue;
            }
            const size_t len = utf8::sequence_length(s_, pos_);
            if (len == 0) error("invalid UTF-8 in string");
            out.append(s_.substr(pos_, len));
            pos_ += len;
        }
    }

    Value parse_number() {
        const size_t start = pos_;
        if (s_[pos_] == '-') ++pos_;
        auto digits = [&] {
            const size_t d0 = pos_;
            while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
            return pos_ - d0;
        };
        if (pos_ >= s_.size()) error("truncated number");
        if (s_[pos_] == '0') {
            ++pos_;
        } else if (digits() == 0) {
            error("invalid number");
        }
        bool integral = true;
        if (pos_ < s_.size() && s_[pos_] == '.') {
            ++pos_;
            integral = false;
            if (digits() == 0) error("expected digits after '.'");
        }
        if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
            ++pos_;
            integral = false;
            if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
            if (digits() == 0) error("expected digits in exponent");
        }
        const std::string_view text = s_.substr(start, pos_ - start);
        if (integral) {
            int64_t i = 0;
            auto r = std::from_chars(text.data(), text.data() + text.size(), i);
            if (r.ec == std::errc() && r.ptr == text.data() + text.size()) return Value(i);
            uint64_t u = 0;  // above INT64_MAX: exact up to UINT64_MAX (serde_json's u64)
            auto ru = std::from_chars(text.data(), text.data() + text.size(), u);
            if (ru.ec == std::errc() && ru.ptr == text.data() + text.size()) return Value(u);
        }
        double d = 0;
        auto r = std::from_chars(text.data(), text.data() + text.size(), d);
        if (r.ec == std::errc::result_out_of_range) error("number out of range");
        if (r.ec != std::errc()) error("invalid number");
        return Value(d);
    }
};

Value parse(std::string_view text, const ParseOptions& options) {
    return Parser(text, options).parse_document();
}

}  // namespace osprey::json
