// Regular expressions and GBNF text -> expressions (see parse.h).
#include "grammar/parse.h"

#include <algorithm>
#include <map>
#include <string>

#include "core/check.h"

namespace osprey::grammar {

namespace {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr int kMaxRepeat = 4096;

std::string utf8(uint32_t c) {
    std::string s;
    if (c < 0x80) {
        s += char(c);
    } else if (c < 0x800) {
        s += char(0xC0 | (c >> 6));
        s += char(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        s += char(0xE0 | (c >> 12));
        s += char(0x80 | ((c >> 6) & 0x3F));
        s += char(0x80 | (c & 0x3F));
    } else {
        s += char(0xF0 | (c >> 18));
        s += char(0x80 | ((c >> 12) & 0x3F));
        s += char(0x80 | ((c >> 6) & 0x3F));
        s += char(0x80 | (c & 0x3F));
    }
    return s;
}

// Shared by both syntaxes: a cursor over UTF-8 text with error reporting.
class Cursor {
public:
    Cursor(std::string_view text, const char* what) : s_(text), what_(what) {}

    bool done() const { return i_ >= s_.size(); }
    char peek(size_t ahead = 0) const { return i_ + ahead < s_.size() ? s_[i_ + ahead] : '\0'; }
    char take() { return done() ? '\0' : s_[i_++]; }
    bool eat(char c) {
        if (peek() != c || done()) return false;
        ++i_;
        return true;
    }
    bool eat(std::string_view w) {
        if (s_.substr(i_, w.size()) != w) return false;
        i_ += w.size();
        return true;
    }
    size_t pos() const { return i_; }
    void seek(size_t p) { i_ = p; }

    template <typename... A>
    [[noreturn]] void fail(const A&... a) const {
        OSPREY_FAIL(what_, " at offset ", i_, ": ", a...);
    }

    // One UTF-8 encoded code point.
    uint32_t codepoint() {
        const auto b = uint8_t(take());
        if (b < 0x80) return b;
        const int n = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : b >= 0xC0 ? 1 : -1;
        if (n < 0) fail("invalid UTF-8");
        uint32_t c = b & (0x3F >> n);
        for (int k = 0; k < n; ++k) {
            const auto x = uint8_t(take());
            if ((x & 0xC0) != 0x80) fail("invalid UTF-8");
            c = (c << 6) | (x & 0x3F);
        }
        return c;
    }

    uint32_t hex(int n) {
        uint32_t v = 0;
        for (int k = 0; k < n; ++k) {
            const char c = take();
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) fail("expected ", n, " hexadecimal digits");
            v = v * 16 + uint32_t(d);
        }
        return v;
    }

    int number() {
        if (!(peek() >= '0' && peek() <= '9')) fail("expected a number");
        long v = 0;
        while (peek() >= '0' && peek() <= '9') {
            v = v * 10 + (take() - '0');
            if (v > kMaxRepeat) fail("repetition count over ", kMaxRepeat);
        }
        return int(v);
    }

private:
    std::string_view s_;
    const char* what_;
    size_t i_ = 0;
};

CodepointRanges ascii_class(char c) {  // \d \w \s
    switch (c) {
        case 'd':
            return {{'0', '9'}};
        case 'w':
            return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
        case 's':
            return {{'\t', '\r'}, {' ', ' '}};
    }
    return {};
}

CodepointRanges complement(const CodepointRanges& r) {
    CodepointRanges sorted = r, out;
    std::sort(sorted.begin(), sorted.end());
    uint32_t next = 0;
    for (auto [lo, hi] : sorted) {
        if (lo > next) out.emplace_back(next, lo - 1);
        next = std::max(next, hi + 1);
    }
    if (next <= kMaxCodepoint) out.emplace_back(next, kMaxCodepoint);
    return out;
}

// The escape after a backslash that stands for one code point (both syntaxes), or -1.
int64_t simple_escape(Cursor& c, char e) {
    switch (e) {
        case 'n': return '\n';
        case 't': return '\t';
        case 'r': return '\r';
        case 'f': return '\f';
        case 'v': return '\v';
        case '0': return 0;
        case 'x': return c.hex(2);
        case 'u':
            if (c.eat('{')) {
                uint32_t v = 0;
                while (!c.eat('}')) v = v * 16 + c.hex(1);
                return v;
            }
            return c.hex(4);
        case 'U': return c.hex(8);
    }
    return -1;
}

// [...] after the '['. `regex`: \d \w \s allowed inside.
ExprPtr parse_class(Cursor& c, bool regex) {
    const bool negated = c.eat('^');
    CodepointRanges ranges;
    bool first = true;
    for (;;) {
        if (c.done()) c.fail("unterminated character class");
        if (c.peek() == ']' && !first) {
            c.take();
            break;
        }
        first = false;
        uint32_t lo;
        if (c.eat('\\')) {
            const char e = c.take();
            if (regex && (e == 'd' || e == 'w' || e == 's')) {
                auto r = ascii_class(e);
                ranges.insert(ranges.end(), r.begin(), r.end());
                continue;
            }
            if (regex && (e == 'D' || e == 'W' || e == 'S')) {
                auto r = complement(ascii_class(char(e - 'A' + 'a')));
                ranges.insert(ranges.end(), r.begin(), r.end());
                continue;
            }
            const int64_t v = simple_escape(c, e);
            lo = v >= 0 ? uint32_t(v) : uint32_t(uint8_t(e));
        } else {
            lo = c.codepoint();
        }
        uint32_t hi = lo;
        if (c.peek() == '-' && c.peek(1) != ']' && c.peek(1) != '\0') {
            c.take();
            if (c.eat('\\')) {
                const char e = c.take();
                const int64_t v = simple_escape(c, e);
                hi = v >= 0 ? uint32_t(v) : uint32_t(uint8_t(e));
            } else {
                hi = c.codepoint();
            }
            if (hi < lo) c.fail("character range out of order");
        }
        ranges.emplace_back(lo, hi);
    }
    return codepoints(ranges, negated);
}

ExprPtr any_char_but_newline() {
    return codepoints({{'\n', '\n'}}, true);
}

// Quantifiers after an atom (both syntaxes).
ExprPtr quantified(Cursor& c, ExprPtr atom, bool regex) {
    for (;;) {
        int min, max;
        if (c.eat('*')) {
            min = 0, max = -1;
        } else if (c.eat('+')) {
            min = 1, max = -1;
        } else if (c.eat('?')) {
            min = 0, max = 1;
        } else if (c.peek() == '{' && c.peek(1) >= '0' && c.peek(1) <= '9') {
            c.take();
            min = c.number();
            max = min;
            if (c.eat(',')) max = c.peek() == '}' ? -1 : c.number();
            if (!c.eat('}')) c.fail("expected '}' after a repetition count");
            if (max >= 0 && max < min) c.fail("repetition {", min, ",", max, "} has max < min");
        } else {
            return atom;
        }
        if (regex && !c.eat('?')) c.eat('+');  // lazy / possessive: same language
        atom = repeat(atom, min, max);
    }
}

class RegexParser {
public:
    explicit RegexParser(std::string_view p) : c_(p, "regex") {}

    ExprPtr run() {
        c_.eat('^');
        ExprPtr e = alternatives();
        if (!c_.done()) c_.fail("unexpected ')'");
        return e;
    }

private:
    ExprPtr alternatives() {
        std::vector<ExprPtr> alts{sequence()};
        while (c_.eat('|')) alts.push_back(sequence());
        return alt(std::move(alts));
    }

    ExprPtr sequence() {
        std::vector<ExprPtr> items;
        while (!c_.done() && c_.peek() != '|' && c_.peek() != ')') {
            if (c_.peek() == '$') {
                c_.take();
                if (!c_.done() && c_.peek() != '|' && c_.peek() != ')') c_.fail("'$' is only supported at the end");
                continue;
            }
            items.push_back(quantified(c_, atom(), true));
        }
        return items.size() == 1 ? items[0] : seq(std::move(items));
    }

    ExprPtr atom() {
        const char ch = c_.peek();
        if (ch == '(') {
            c_.take();
            if (c_.eat("?:")) {
            } else if (c_.eat("?P<") || (c_.peek() == '?' && c_.peek(1) == '<' && c_.peek(2) != '=' &&
                                         c_.peek(2) != '!' && c_.eat("?<"))) {
                while (!c_.done() && c_.take() != '>') {
                }
            }
            if (c_.peek() == '?') c_.fail("lookaround and inline flags are not supported");
            ExprPtr e = alternatives();
            if (!c_.eat(')')) c_.fail("missing ')'");
            return e;
        }
        if (ch == '[') {
            c_.take();
            return parse_class(c_, true);
        }
        if (ch == '.') {
            c_.take();
            return any_char_but_newline();
        }
        if (ch == '^') c_.fail("'^' is only supported at the start");
        if (ch == '*' || ch == '+' || ch == '?' || ch == '{') c_.fail("nothing to repeat");
        if (ch == '\\') {
            c_.take();
            const char e = c_.take();
            if (e == 'd' || e == 'w' || e == 's') return codepoints(ascii_class(e));
            if (e == 'D' || e == 'W' || e == 'S') return codepoints(ascii_class(char(e - 'A' + 'a')), true);
            if (e == 'b' || e == 'B') c_.fail("word boundaries (\\b) are not supported");
            if (e >= '1' && e <= '9') c_.fail("backreferences are not supported");
            if (e == '\0') c_.fail("trailing backslash");
            const int64_t v = simple_escape(c_, e);
            return literal(utf8(v >= 0 ? uint32_t(v) : uint32_t(uint8_t(e))));
        }
        return literal(utf8(c_.codepoint()));
    }

    Cursor c_;
};

class GbnfParser {
public:
    explicit GbnfParser(std::string_view text) : c_(text, "grammar") {}

    Grammar run() {
        skip_space(true);
        while (!c_.done()) {
            const std::string name = rule_name();
            if (name.empty()) c_.fail("expected a rule name");
            skip_space(true);
            if (!c_.eat("::=")) c_.fail("expected '::=' after '", name, "'");
            const int r = rule(name);
            if (defined_[r]) c_.fail("rule '", name, "' is defined twice");
            defined_[r] = true;
            b_.define(r, alternatives());
            skip_space(true);
        }
        const int root = b_.find("root");
        if (root < 0 || !defined_[root]) OSPREY_FAIL("grammar: no 'root' rule");
        for (const auto& [name, id] : ids_)
            if (!defined_[id]) OSPREY_FAIL("grammar: rule '", name, "' is used but never defined");
        return b_.build(root);
    }

private:
    static bool name_char(char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
               ch == '-' || ch == '.';
    }

    void skip_space(bool newlines) {
        for (;;) {
            const char ch = c_.peek();
            if (ch == ' ' || ch == '\t' || ch == '\r' || (newlines && ch == '\n')) {
                c_.take();
            } else if (ch == '#') {
                while (!c_.done() && c_.peek() != '\n') c_.take();
            } else {
                return;
            }
        }
    }

    std::string rule_name() {
        std::string n;
        while (name_char(c_.peek()) && !c_.done()) n += c_.take();
        return n;
    }

    int rule(const std::string& name) {
        auto [it, fresh] = ids_.try_emplace(name, 0);
        if (fresh) {
            it->second = b_.declare(name);
            defined_.resize(size_t(b_.size()), false);
        }
        return it->second;
    }

    // True when the text at the cursor starts the next rule (`name ::=`).
    bool at_rule_start() {
        const size_t p = c_.pos();
        const std::string n = rule_name();
        skip_space(true);
        const bool yes = !n.empty() && c_.eat("::=");
        c_.seek(p);
        return yes;
    }

    ExprPtr alternatives() {
        std::vector<ExprPtr> alts{sequence()};
        while (c_.eat('|')) alts.push_back(sequence());
        return alt(std::move(alts));
    }

    ExprPtr sequence() {
        std::vector<ExprPtr> items;
        for (;;) {
            skip_space(true);
            const char ch = c_.peek();
            if (c_.done() || ch == '|' || ch == ')') break;
            if (name_char(ch) && at_rule_start()) break;
            items.push_back(quantified(c_, atom(), false));
        }
        return items.size() == 1 ? items[0] : seq(std::move(items));
    }

    ExprPtr atom() {
        const char ch = c_.take();
        if (ch == '"' || ch == '\'') {
            std::string bytes;
            while (!c_.eat(ch)) {
                if (c_.done()) c_.fail("unterminated string");
                if (c_.eat('\\')) {
                    const char e = c_.take();
                    const int64_t v = simple_escape(c_, e);
                    bytes += v >= 0 ? utf8(uint32_t(v)) : std::string(1, e);
                } else {
                    bytes += c_.take();
                }
            }
            return literal(bytes);
        }
        if (ch == '[') return parse_class(c_, false);
        if (ch == '.') return codepoints({}, true);
        if (ch == '(') {
            ExprPtr e = alternatives();
            skip_space(true);
            if (!c_.eat(')')) c_.fail("missing ')'");
            return e;
        }
        if (name_char(ch)) {
            std::string n(1, ch);
            n += rule_name();
            return ref(rule(n));
        }
        c_.fail("unexpected '", std::string(1, ch), "'");
    }

    Cursor c_;
    GrammarBuilder b_;
    std::map<std::string, int> ids_;
    std::vector<bool> defined_;
};

}  // namespace

ExprPtr parse_regex(std::string_view pattern) {
    return RegexParser(pattern).run();
}

Grammar parse_gbnf(std::string_view text) {
    return GbnfParser(text).run();
}

}  // namespace osprey::grammar
