// Expression helpers, UTF-8 expansion of code point classes and lowering to rules (see grammar.h).
#include "grammar/grammar.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>

#include "core/check.h"

namespace osprey::grammar {

namespace {

ExprPtr make(Expr e) {
    return std::make_shared<const Expr>(std::move(e));
}

// Splits [lo, hi] into ranges whose UTF-8 encodings are byte-wise ranges of one length, e.g.
// [0x80, 0x7FF] -> [C2-DF][80-BF]. Surrogates (D800-DFFF) are left out.
void utf8_split(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
    if (lo > hi) return;
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800) utf8_split(lo, 0xD7FF, out);
        if (hi > 0xDFFF) utf8_split(0xE000, hi, out);
        return;
    }
    for (uint32_t limit : {0x7Fu, 0x7FFu, 0xFFFFu})
        if (lo <= limit && hi > limit) {
            utf8_split(lo, limit, out);
            utf8_split(limit + 1, hi, out);
            return;
        }
    if (hi <= 0x7F) {
        out.push_back({{uint8_t(lo), uint8_t(hi)}});
        return;
    }
    const int n = lo <= 0x7FF ? 2 : lo <= 0xFFFF ? 3 : 4;
    for (int i = 1; i < n; ++i) {
        const uint32_t m = (uint32_t(1) << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_split(lo, lo | m, out);
                utf8_split((lo | m) + 1, hi, out);
                return;
            }
            if ((hi & m) != m) {
                utf8_split(lo, (hi & ~m) - 1, out);
                utf8_split(hi & ~m, hi, out);
                return;
            }
        }
    }
    auto encode = [n](uint32_t c, uint8_t* b) {
        if (n == 2) {
            b[0] = uint8_t(0xC0 | (c >> 6));
            b[1] = uint8_t(0x80 | (c & 0x3F));
        } else if (n == 3) {
            b[0] = uint8_t(0xE0 | (c >> 12));
            b[1] = uint8_t(0x80 | ((c >> 6) & 0x3F));
            b[2] = uint8_t(0x80 | (c & 0x3F));
        } else {
            b[0] = uint8_t(0xF0 | (c >> 18));
            b[1] = uint8_t(0x80 | ((c >> 12) & 0x3F));
            b[2] = uint8_t(0x80 | ((c >> 6) & 0x3F));
            b[3] = uint8_t(0x80 | (c & 0x3F));
        }
    };
    uint8_t a[4], b[4];
    encode(lo, a);
    encode(hi, b);
    std::vector<std::pair<uint8_t, uint8_t>> seq;
    for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
    out.push_back(std::move(seq));
}

// "name-7" (built by appends: GCC 12 warns falsely on operator+ chains of temporaries).
std::string numbered(std::string_view name, size_t i) {
    std::string s(name);
    s.append("-");
    s.append(std::to_string(i));
    return s;
}

std::string byte_text(uint8_t b) {
    if (b >= 0x21 && b < 0x7F && b != '[' && b != ']' && b != '\\' && b != '-' && b != '^' && b != '"')
        return std::string(1, char(b));
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02X", b);
    return buf;
}

}  // namespace

ExprPtr bytes(ByteSet set) {
    Expr e;
    e.kind = Expr::Kind::bytes;
    e.set = set;
    return make(std::move(e));
}

ExprPtr literal(std::string_view text) {
    std::vector<ExprPtr> items;
    for (char c : text) {
        ByteSet s;
        s.add(uint8_t(c));
        items.push_back(bytes(s));
    }
    return items.size() == 1 ? items[0] : seq(std::move(items));
}

ExprPtr seq(std::vector<ExprPtr> items) {
    Expr e;
    e.kind = Expr::Kind::seq;
    e.items = std::move(items);
    return make(std::move(e));
}

ExprPtr alt(std::vector<ExprPtr> items) {
    if (items.size() == 1) return items[0];
    Expr e;
    e.kind = Expr::Kind::alt;
    e.items = std::move(items);
    return make(std::move(e));
}

ExprPtr repeat(ExprPtr item, int min, int max) {
    OSPREY_CHECK(min >= 0 && (max < 0 || max >= min), "bad repetition {", min, ",", max, "}");
    if (min == 1 && max == 1) return item;
    Expr e;
    e.kind = Expr::Kind::repeat;
    e.items = {std::move(item)};
    e.min = min;
    e.max = max;
    return make(std::move(e));
}

ExprPtr ref(int rule) {
    Expr e;
    e.kind = Expr::Kind::ref;
    e.rule = rule;
    return make(std::move(e));
}

ExprPtr codepoints(const CodepointRanges& input, bool negated) {
    CodepointRanges r;
    for (auto [lo, hi] : input)
        if (lo <= hi && lo <= 0x10FFFF) r.emplace_back(lo, std::min<uint32_t>(hi, 0x10FFFF));
    std::sort(r.begin(), r.end());
    CodepointRanges merged;
    for (auto [lo, hi] : r) {
        if (!merged.empty() && lo <= merged.back().second + 1)
            merged.back().second = std::max(merged.back().second, hi);
        else
            merged.emplace_back(lo, hi);
    }
    if (negated) {
        CodepointRanges c;
        uint32_t next = 0;
        for (auto [lo, hi] : merged) {
            if (lo > next) c.emplace_back(next, lo - 1);
            next = hi + 1;
        }
        if (next <= 0x10FFFF) c.emplace_back(next, 0x10FFFF);
        merged = std::move(c);
    }
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    for (auto [lo, hi] : merged) utf8_split(lo, hi, seqs);
    // One byte set for all single-byte ranges, then the multi-byte sequences.
    ByteSet ascii;
    std::vector<ExprPtr> alts;
    for (const auto& s : seqs) {
        if (s.size() == 1) {
            ascii.add_range(s[0].first, s[0].second);
            continue;
        }
        std::vector<ExprPtr> items;
        for (auto [a, b] : s) {
            ByteSet set;
            set.add_range(a, b);
            items.push_back(bytes(set));
        }
        alts.push_back(seq(std::move(items)));
    }
    if (!ascii.empty()) alts.insert(alts.begin(), bytes(ascii));
    return alt(std::move(alts));
}

int GrammarBuilder::declare(std::string_view name) {
    std::string n(name.empty() ? "rule" : name);
    if (find(n) >= 0) {
        for (size_t i = 2;; ++i)
            if (find(numbered(n, i)) < 0) {
                n = numbered(n, i);
                break;
            }
    }
    names_.push_back(std::move(n));
    defs_.push_back(nullptr);
    return int(names_.size()) - 1;
}

void GrammarBuilder::define(int rule, ExprPtr e) {
    OSPREY_CHECK(rule >= 0 && rule < size(), "grammar: no rule ", rule);
    OSPREY_CHECK(!defs_[size_t(rule)], "grammar: rule '", names_[size_t(rule)], "' is defined twice");
    defs_[size_t(rule)] = std::move(e);
}

int GrammarBuilder::find(std::string_view name) const {
    for (size_t i = 0; i < names_.size(); ++i)
        if (names_[i] == name) return int(i);
    return -1;
}

namespace {

class Lowerer {
public:
    explicit Lowerer(const std::vector<std::string>& names, const std::vector<ExprPtr>& defs)
        : names_(names), defs_(defs), lowered_(names.size(), -1) {}

    Grammar run(int root) {
        g_.root = from_builder(root);
        while (!pending_.empty()) {
            auto [id, e] = pending_.back();
            pending_.pop_back();
            define(id, e);
        }
        check_left_recursion();
        return std::move(g_);
    }

private:
    int new_rule(std::string name) {
        g_.rule_alts.emplace_back();
        g_.rule_names.push_back(std::move(name));
        return int(g_.rule_alts.size()) - 1;
    }

    int from_builder(int r) {
        OSPREY_CHECK(r >= 0 && size_t(r) < names_.size(), "grammar: reference to rule ", r, " which does not exist");
        if (lowered_[size_t(r)] >= 0) return lowered_[size_t(r)];
        OSPREY_CHECK(defs_[size_t(r)] != nullptr, "grammar: rule '", names_[size_t(r)], "' is used but never defined");
        const int id = new_rule(names_[size_t(r)]);
        lowered_[size_t(r)] = id;
        pending_.emplace_back(id, defs_[size_t(r)]);
        return id;
    }

    int set_index(const ByteSet& s) {
        auto key = std::make_tuple(s.w[0], s.w[1], s.w[2], s.w[3]);
        auto [it, fresh] = set_ids_.try_emplace(key, int(g_.sets.size()));
        if (fresh) g_.sets.push_back(s);
        return it->second;
    }

    void define(int id, const ExprPtr& e) {
        if (e->kind == Expr::Kind::alt) {
            for (const ExprPtr& a : e->items) add_alternative(id, a);
        } else {
            add_alternative(id, e);
        }
    }

    void add_alternative(int id, const ExprPtr& e) {
        std::vector<Element> out;
        emit(e, out);
        g_.rule_alts[size_t(id)].push_back(int32_t(g_.elements.size()));
        g_.elements.insert(g_.elements.end(), out.begin(), out.end());
        g_.elements.push_back({Element::Kind::end, 0});
    }

    // A helper rule deriving `e` (memoised per expression, so repeats share it).
    int helper(const ExprPtr& e, const char* what) {
        auto it = helpers_.find(e.get());
        if (it != helpers_.end()) return it->second;
        const int id = new_rule(numbered(what, g_.rule_alts.size()));
        helpers_[e.get()] = id;
        keep_.push_back(e);
        define(id, e);
        return id;
    }

    // Helper rule for `n` optional repetitions of `item` (n > 0; n < 0 for unbounded).
    int optional_chain(const ExprPtr& item, int n) {
        auto key = std::make_pair(item.get(), n);
        auto it = chains_.find(key);
        if (it != chains_.end()) return it->second;
        const int id = new_rule(numbered("rep", g_.rule_alts.size()));
        chains_[key] = id;
        keep_.push_back(item);
        std::vector<Element> once;
        emit(item, once);
        if (n < 0) {
            once.push_back({Element::Kind::rule, id});  // item rep | ε (tail position: no stack growth)
        } else if (n > 1) {
            once.push_back({Element::Kind::rule, optional_chain(item, n - 1)});
        }
        g_.rule_alts[size_t(id)].push_back(int32_t(g_.elements.size()));
        g_.elements.insert(g_.elements.end(), once.begin(), once.end());
        g_.elements.push_back({Element::Kind::end, 0});
        g_.rule_alts[size_t(id)].push_back(int32_t(g_.elements.size()));
        g_.elements.push_back({Element::Kind::end, 0});
        return id;
    }

    void emit(const ExprPtr& e, std::vector<Element>& out) {
        if (auto it = lowered_ids_.find(e.get()); it != lowered_ids_.end()) {
            out.push_back({Element::Kind::rule, it->second});
            return;
        }
        switch (e->kind) {
            case Expr::Kind::bytes:
                out.push_back({Element::Kind::bytes, set_index(e->set)});
                return;
            case Expr::Kind::seq:
                for (const ExprPtr& i : e->items) emit(i, out);
                return;
            case Expr::Kind::alt:
                if (e->items.empty()) {
                    out.push_back({Element::Kind::bytes, set_index(ByteSet{})});  // matches nothing
                } else {
                    out.push_back({Element::Kind::rule, helper(e, "alt")});
                }
                return;
            case Expr::Kind::ref:
                out.push_back({Element::Kind::rule, from_builder(e->rule)});
                return;
            case Expr::Kind::repeat: {
                const ExprPtr& item = e->items[0];
                // A complex item is emitted once as a helper rule and referenced by each copy.
                ExprPtr unit = item;
                if (item->kind == Expr::Kind::seq && item->items.size() > 1) {
                    const int h = helper(item, "group");
                    unit = ref_lowered(h);
                }
                for (int i = 0; i < e->min; ++i) emit(unit, out);
                if (e->max < 0) {
                    out.push_back({Element::Kind::rule, optional_chain(unit, -1)});
                } else if (e->max > e->min) {
                    out.push_back({Element::Kind::rule, optional_chain(unit, e->max - e->min)});
                }
                return;
            }
        }
    }

    // An expression standing for an already lowered rule (emit() looks it up in lowered_ids_).
    ExprPtr ref_lowered(int id) {
        auto it = lowered_refs_.find(id);
        if (it != lowered_refs_.end()) return it->second;
        Expr e;
        e.kind = Expr::Kind::seq;  // placeholder; emitted through lowered_ids_
        auto p = std::make_shared<const Expr>(std::move(e));
        lowered_refs_[id] = p;
        lowered_ids_[p.get()] = id;
        return p;
    }

    void check_left_recursion() {
        const size_t n = g_.rule_alts.size();
        std::vector<char> nullable(n, 0);
        auto alt_nullable = [&](int32_t start) {
            for (int32_t i = start; g_.elements[size_t(i)].kind != Element::Kind::end; ++i) {
                const Element& el = g_.elements[size_t(i)];
                if (el.kind == Element::Kind::bytes || !nullable[size_t(el.arg)]) return false;
            }
            return true;
        };
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < n; ++r) {
                if (nullable[r]) continue;
                for (int32_t a : g_.rule_alts[r])
                    if (alt_nullable(a)) {
                        nullable[r] = 1;
                        changed = true;
                        break;
                    }
            }
        }
        std::vector<std::vector<int>> left(n);  // rules reachable leftmost without consuming
        for (size_t r = 0; r < n; ++r)
            for (int32_t a : g_.rule_alts[r])
                for (int32_t i = a; g_.elements[size_t(i)].kind == Element::Kind::rule; ++i) {
                    left[r].push_back(g_.elements[size_t(i)].arg);
                    if (!nullable[size_t(g_.elements[size_t(i)].arg)]) break;
                }
        std::vector<int> color(n, 0);
        std::function<void(int)> visit = [&](int r) {
            color[size_t(r)] = 1;
            for (int s : left[size_t(r)]) {
                OSPREY_CHECK(color[size_t(s)] != 1, "grammar: rule '", g_.rule_names[size_t(s)],
                             "' is left-recursive (it can reach itself without consuming input)");
                if (color[size_t(s)] == 0) visit(s);
            }
            color[size_t(r)] = 2;
        };
        for (size_t r = 0; r < n; ++r)
            if (color[r] == 0) visit(int(r));
    }

    const std::vector<std::string>& names_;
    const std::vector<ExprPtr>& defs_;
    std::vector<int> lowered_;  // builder rule -> lowered rule
    std::vector<std::pair<int, ExprPtr>> pending_;
    std::map<const Expr*, int> helpers_;
    std::map<std::pair<const Expr*, int>, int> chains_;
    std::map<int, ExprPtr> lowered_refs_;
    std::map<const Expr*, int> lowered_ids_;
    std::vector<ExprPtr> keep_;
    std::map<std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>, int> set_ids_;
    Grammar g_;
};

}  // namespace

Grammar GrammarBuilder::build(int root) const {
    OSPREY_CHECK(root >= 0 && root < size(), "grammar: no root rule");
    return Lowerer(names_, defs_).run(root);
}

std::string Grammar::to_text() const {
    std::string out;
    auto set_text = [&](const ByteSet& s) {
        std::string t = "[";
        for (int b = 0; b < 256;) {
            if (!s.has(uint8_t(b))) {
                ++b;
                continue;
            }
            int e = b;
            while (e + 1 < 256 && s.has(uint8_t(e + 1))) ++e;
            t += byte_text(uint8_t(b));
            if (e > b) {
                t.push_back('-');
                t.append(byte_text(uint8_t(e)));
            }
            b = e + 1;
        }
        return t + "]";
    };
    for (size_t r = 0; r < rule_alts.size(); ++r) {
        out += rule_names[r] + " ::=";
        for (size_t a = 0; a < rule_alts[r].size(); ++a) {
            out += a == 0 ? " " : " | ";
            bool any = false;
            for (int32_t i = rule_alts[r][a]; elements[size_t(i)].kind != Element::Kind::end; ++i) {
                const Element& el = elements[size_t(i)];
                out += any ? " " : "";
                out += el.kind == Element::Kind::bytes ? set_text(sets[size_t(el.arg)]) : rule_names[size_t(el.arg)];
                any = true;
            }
            if (!any) out += "\"\"";
        }
        out += "\n";
    }
    return out;
}

}  // namespace osprey::grammar
