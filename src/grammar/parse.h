// The text forms of constraints: regular expressions and GBNF grammars (the syntax of llama.cpp's
// grammars, which vLLM's guided_grammar and xgrammar's EBNF also read). Both throw osprey::Error
// naming the offset and the problem; nothing is silently dropped. Syntax: docs/structured_output.md.
// Tests: tests/grammar/test_grammar.cpp.
#pragma once

#include <string_view>

#include "grammar/grammar.h"

namespace osprey::grammar {

// A regular expression matched against the whole text (a leading ^ and trailing $ are accepted and
// change nothing). Literals, ., classes [...] with ranges and negation, \d \w \s (ASCII) and their
// negations, escapes (\n \t \xHH \uHHHH), groups (...) (?:...) (?<name>...), |, * + ? {m} {m,} {m,n}
// (lazy and possessive suffixes are ignored). Refused: backreferences, lookaround, \b, inner anchors.
ExprPtr parse_regex(std::string_view pattern);

// GBNF: `name ::= alternatives` rules; "literal" or 'literal', [class], [^class], ., (group), rule
// names, * + ? {m} {m,} {m,n}, | and # comments. The start rule is `root`.
Grammar parse_gbnf(std::string_view text);

}  // namespace osprey::grammar
