// The grammar core: expression lowering, the automaton (whole sentences, prefixes, dead ends), the
// regular-expression and GBNF front ends and their errors.
#include <gtest/gtest.h>

#include "core/check.h"
#include "grammar/parse.h"
#include "grammar_test_util.h"

namespace osprey::grammar {
namespace {

using test::Runner;

Grammar regex_grammar(std::string_view pattern) {
    GrammarBuilder b;
    return b.build(b.add("root", parse_regex(pattern)));
}

TEST(grammar, literal_and_prefixes) {
    Runner r(regex_grammar("abc"));
    EXPECT_TRUE(r.full("abc"));
    EXPECT_FALSE(r.full("ab"));
    EXPECT_TRUE(r.prefix("ab"));
    EXPECT_FALSE(r.prefix("abd"));
    EXPECT_FALSE(r.prefix("abcd"));
}

TEST(grammar, repetition_runs_in_constant_states) {
    Runner r(regex_grammar("(ab)*c"));
    EXPECT_TRUE(r.full("c"));
    EXPECT_TRUE(r.full("ababababc"));
    EXPECT_FALSE(r.full("abac"));
    std::string many;
    for (int i = 0; i < 1000; ++i) many += "ab";
    EXPECT_TRUE(r.full(many + "c"));
    EXPECT_LT(r.a.n_states(), 10u) << "right recursion must not grow the configurations";
}

TEST(grammar, bounded_repetition) {
    Runner r(regex_grammar("x{2,4}"));
    EXPECT_FALSE(r.full("x"));
    EXPECT_TRUE(r.full("xx"));
    EXPECT_TRUE(r.full("xxxx"));
    EXPECT_FALSE(r.prefix("xxxxx"));
    Runner exact(regex_grammar("[0-9]{3}"));
    EXPECT_TRUE(exact.full("123"));
    EXPECT_FALSE(exact.full("12"));
    Runner open(regex_grammar("a{2,}"));
    EXPECT_TRUE(open.full("aaaaaaa"));
    EXPECT_FALSE(open.full("a"));
}

TEST(grammar, regex_classes_and_escapes) {
    Runner r(regex_grammar("^[A-Z][a-z]+\\d?\\s\\w*$"));
    EXPECT_TRUE(r.full("Hello7 x_1"));
    EXPECT_TRUE(r.full("Ab "));
    EXPECT_FALSE(r.full("hello "));
    Runner alt(regex_grammar("cat|dog|(?:bird|fish)s?"));
    for (const char* ok : {"cat", "dog", "birds", "fish"}) EXPECT_TRUE(alt.full(ok)) << ok;
    EXPECT_FALSE(alt.full("cats"));
    Runner neg(regex_grammar("[^a-c]+"));
    EXPECT_TRUE(neg.full("xyz"));
    EXPECT_FALSE(neg.full("xaz"));
    Runner named(regex_grammar("(?<year>[0-9]{4})-(?P<m>[0-9]{2})"));
    EXPECT_TRUE(named.full("2024-05"));
}

TEST(grammar, utf8_classes_work_byte_by_byte) {
    Runner r(regex_grammar("[à-ÿ]+"));  // U+00E0..U+00FF: two bytes each
    EXPECT_TRUE(r.full("àéÿ"));
    EXPECT_FALSE(r.full("a"));
    EXPECT_TRUE(r.prefix("\xC3"));    // the first byte of é: a partial character is a valid prefix
    EXPECT_FALSE(r.prefix("\xC4"));   // U+0100 and up: out of the class
    Runner any(regex_grammar(".+"));
    EXPECT_TRUE(any.full("日本語 ok 🎉"));
    EXPECT_FALSE(any.full("a\nb"));
    EXPECT_FALSE(any.prefix("\xFF"));     // never valid UTF-8
    EXPECT_FALSE(any.prefix("\xED\xA0"));  // a surrogate
    Runner cjk(regex_grammar("[\\u4e00-\\u9fff]{2}"));
    EXPECT_TRUE(cjk.full("日本"));
    EXPECT_FALSE(cjk.full("日"));
}

TEST(grammar, regex_errors_name_the_feature) {
    auto message = [](const char* p) {
        try {
            parse_regex(p);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(message("(a)\\1").find("backreferences"), std::string::npos);
    EXPECT_NE(message("(?=a)b").find("lookaround"), std::string::npos);
    EXPECT_NE(message("a\\bc").find("word boundaries"), std::string::npos);
    EXPECT_NE(message("(ab").find("missing ')'"), std::string::npos);
    EXPECT_NE(message("[ab").find("unterminated"), std::string::npos);
    EXPECT_NE(message("*a").find("nothing to repeat"), std::string::npos);
}

TEST(grammar, gbnf) {
    Runner r(parse_gbnf(R"G(
        # arithmetic
        root   ::= expr
        expr   ::= term (("+" | "-") term)*
        term   ::= factor ("*" factor)*
        factor ::= [0-9]+ | "(" expr ")"
    )G"));
    EXPECT_TRUE(r.full("1+2*(3-4)"));
    EXPECT_TRUE(r.full("((7))"));
    EXPECT_FALSE(r.full("1+"));
    EXPECT_TRUE(r.prefix("(1+("));
    EXPECT_FALSE(r.prefix("1)"));
    Runner quoted(parse_gbnf("root ::= 'yes' | \"no\" | [\\u00e9]{2} x\nx ::= \"\\n\"?"));
    EXPECT_TRUE(quoted.full("yes"));
    EXPECT_TRUE(quoted.full("éé\n"));
    EXPECT_TRUE(quoted.full("éé"));
}

TEST(grammar, gbnf_errors) {
    auto message = [](const char* g) {
        try {
            parse_gbnf(g);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(message("start ::= \"a\"").find("no 'root' rule"), std::string::npos);
    EXPECT_NE(message("root ::= item\n").find("'item' is used but never defined"), std::string::npos);
    EXPECT_NE(message("root ::= root \"a\" | \"b\"").find("left-recursive"), std::string::npos);
    EXPECT_NE(message("root ::= \"a").find("unterminated string"), std::string::npos);
    EXPECT_NE(message("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
}

TEST(grammar, to_text_lists_rules) {
    const Grammar g = parse_gbnf("root ::= \"a\" b\nb ::= [x-z]*");
    const std::string t = g.to_text();
    EXPECT_NE(t.find("root ::="), std::string::npos) << t;
    EXPECT_NE(t.find("[x-z]"), std::string::npos) << t;
}

}  // namespace
}  // namespace osprey::grammar
