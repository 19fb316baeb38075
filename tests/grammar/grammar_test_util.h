// Helpers for the grammar tests: does a grammar accept a whole text, a prefix of some sentence?
#pragma once

#include <memory>
#include <string_view>

#include "grammar/automaton.h"

namespace osprey::grammar::test {

struct Runner {
    explicit Runner(Grammar g) : a(std::make_shared<const Grammar>(std::move(g))) {}
    int32_t run(std::string_view text) { return a.next(a.start(), text); }
    bool full(std::string_view text) {
        const int32_t s = run(text);
        return s != Automaton::kDead && a.accepts(s);
    }
    bool prefix(std::string_view text) { return run(text) != Automaton::kDead; }
    Automaton a;
};

}  // namespace osprey::grammar::test
