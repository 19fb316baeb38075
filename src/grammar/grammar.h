// Grammars for constrained decoding: an expression tree (Expr) that the front ends build (GBNF text,
// regular expressions, JSON Schema), lowered to a flat context-free grammar over bytes (Grammar) that
// grammar/automaton.h runs. Terminals are byte sets; a Unicode character class becomes the UTF-8
// byte sequences of its code points, so the automaton never sees a partial character as special.
// Tests: tests/grammar/test_grammar.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace osprey::grammar {

// A set of byte values.
struct ByteSet {
    uint64_t w[4] = {0, 0, 0, 0};
    void add(uint8_t b) { w[b >> 6] |= uint64_t(1) << (b & 63); }
    void add_range(uint8_t lo, uint8_t hi) {
        for (int b = lo; b <= hi; ++b) add(uint8_t(b));
    }
    bool has(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1; }
    bool empty() const { return (w[0] | w[1] | w[2] | w[3]) == 0; }
    bool operator==(const ByteSet&) const = default;
};

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

// What a rule derives. Built with the helpers below; immutable and shareable once built.
struct Expr {
    enum class Kind { bytes, seq, alt, repeat, ref };
    Kind kind = Kind::seq;
    ByteSet set;                 // bytes: one byte of this set
    std::vector<ExprPtr> items;  // seq (in order), alt (any one), repeat (items[0])
    int min = 0, max = -1;       // repeat: min..max times, max -1 unbounded
    int rule = -1;               // ref: a rule of the builder
};

using CodepointRanges = std::vector<std::pair<uint32_t, uint32_t>>;  // inclusive [lo, hi]

ExprPtr bytes(ByteSet set);
ExprPtr literal(std::string_view text);  // these bytes in order
ExprPtr seq(std::vector<ExprPtr> items);
ExprPtr alt(std::vector<ExprPtr> items);  // alt({}) matches nothing
ExprPtr repeat(ExprPtr e, int min, int max);  // max -1: unbounded
inline ExprPtr opt(ExprPtr e) { return repeat(std::move(e), 0, 1); }
inline ExprPtr star(ExprPtr e) { return repeat(std::move(e), 0, -1); }
inline ExprPtr plus(ExprPtr e) { return repeat(std::move(e), 1, -1); }
inline ExprPtr empty() { return seq({}); }
ExprPtr ref(int rule);
// One UTF-8 encoded code point in `ranges` (or, negated, any valid code point outside them; surrogates
// are never matched).
ExprPtr codepoints(const CodepointRanges& ranges, bool negated = false);

// The lowered grammar. Every alternative is a run of elements in `elements` ending in an `end`
// element; rule_alts[r] holds the index of the first element of each alternative of rule r.
struct Element {
    enum class Kind : uint8_t { bytes, rule, end };
    Kind kind = Kind::end;
    int32_t arg = 0;  // bytes: index into sets; rule: rule id
};

struct Grammar {
    std::vector<ByteSet> sets;
    std::vector<Element> elements;
    std::vector<std::vector<int32_t>> rule_alts;
    std::vector<std::string> rule_names;
    int root = 0;

    // GBNF-like text of the lowered rules (for debugging and error messages).
    std::string to_text() const;
};

// Collects rules by name, then lowers them. Rule names are made unique ("item", "item-2", ...).
class GrammarBuilder {
public:
    int declare(std::string_view name);    // a new rule, to define later (allows recursion)
    void define(int rule, ExprPtr e);      // each declared rule exactly once
    int add(std::string_view name, ExprPtr e) {
        const int r = declare(name);
        define(r, std::move(e));
        return r;
    }
    int find(std::string_view name) const;  // -1 when absent
    const std::string& name(int rule) const { return names_[size_t(rule)]; }
    int size() const { return int(names_.size()); }

    // Lowers every rule reachable from `root`. Throws osprey::Error on an undefined rule or left
    // recursion (a rule that can reach itself without consuming a byte), naming the rule.
    Grammar build(int root) const;

private:
    std::vector<std::string> names_;
    std::vector<ExprPtr> defs_;
};

}  // namespace osprey::grammar
