// Pre-tokenizer pieces for each alternative of the o200k pattern and the backtracking cases between
// them. Expected splits were checked against tiktoken's regex (tools/tokenizer/differential.py covers
// the rest at scale).
#include <gtest/gtest.h>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode_classes.h"

namespace osprey::tok {
namespace {

using Pieces = std::vector<std::string>;

TEST(pretokenizer, words_take_one_leading_space_or_symbol) {
    EXPECT_EQ(split_pieces("hello world"), (Pieces{"hello", " world"}));
    EXPECT_EQ(split_pieces("'hello"), (Pieces{"'hello"}));
    EXPECT_EQ(split_pieces("...hello"), (Pieces{"...", "hello"}));
    EXPECT_EQ(split_pieces("\thello"), (Pieces{"\thello"}));
}

TEST(pretokenizer, case_runs) {
    EXPECT_EQ(split_pieces("HelloWorld"), (Pieces{"Hello", "World"}));
    EXPECT_EQ(split_pieces("HELLO world"), (Pieces{"HELLO", " world"}));
    EXPECT_EQ(split_pieces("HTTPServer"), (Pieces{"HTTPServer"}));
    EXPECT_EQ(split_pieces("camelCaseWord"), (Pieces{"camel", "Case", "Word"}));
}

TEST(pretokenizer, contractions_case_insensitive_and_long_s) {
    EXPECT_EQ(split_pieces("don't"), (Pieces{"don't"}));
    EXPECT_EQ(split_pieces("HE'S"), (Pieces{"HE'S"}));
    EXPECT_EQ(split_pieces("we'Ll they'rE"), (Pieces{"we'Ll", " they'rE"}));
    EXPECT_EQ(split_pieces("x'\xC5\xBF"), (Pieces{"x'\xC5\xBF"}));  // U+017F folds to s
    EXPECT_EQ(split_pieces("x'K"), (Pieces{"x", "'K"}));
    EXPECT_EQ(split_pieces("x'r"), (Pieces{"x", "'r"}));
}

TEST(pretokenizer, marks_count_as_letters_of_both_cases) {
    EXPECT_EQ(split_pieces("a\xCC\x81"), (Pieces{"a\xCC\x81"}));       // a + U+0301
    EXPECT_EQ(split_pieces("\xCC\x81"), (Pieces{"\xCC\x81"}));          // a lone mark
    EXPECT_EQ(split_pieces("\xCC\x81\xCC\x81x"), (Pieces{"\xCC\x81\xCC\x81x"}));
    EXPECT_EQ(split_pieces("A\xCC\x81" "B"), (Pieces{"A\xCC\x81", "B"}));  // U* gives back the mark to W+
}

TEST(pretokenizer, digits_in_groups_of_three) {
    EXPECT_EQ(split_pieces("1234567"), (Pieces{"123", "456", "7"}));
    EXPECT_EQ(split_pieces("x 12"), (Pieces{"x", " ", "12"}));
    EXPECT_EQ(split_pieces("\xD9\xA1\xD9\xA2\xD9\xA3\xD9\xA4"), (Pieces{"\xD9\xA1\xD9\xA2\xD9\xA3", "\xD9\xA4"}));
}

TEST(pretokenizer, symbols_take_trailing_newlines_and_slashes) {
    EXPECT_EQ(split_pieces(" {}\n\nx"), (Pieces{" {}\n\n", "x"}));
    EXPECT_EQ(split_pieces("a//b"), (Pieces{"a", "//", "b"}));
    EXPECT_EQ(split_pieces(" ;\r\n/"), (Pieces{" ;\r\n/"}));
}

TEST(pretokenizer, whitespace_runs) {
    EXPECT_EQ(split_pieces("  \n  x"), (Pieces{"  \n", " ", " x"}));
    EXPECT_EQ(split_pieces("hello  "), (Pieces{"hello", "  "}));
    EXPECT_EQ(split_pieces("a   b"), (Pieces{"a", "  ", " b"}));
    EXPECT_EQ(split_pieces("a \n\n b"), (Pieces{"a", " \n\n", " b"}));
    EXPECT_EQ(split_pieces("a\n1"), (Pieces{"a", "\n", "1"}));
    EXPECT_EQ(split_pieces(" 1"), (Pieces{" ", "1"}));
    EXPECT_EQ(split_pieces("\xE3\x80\x80\xE3\x80\x80x"), (Pieces{"\xE3\x80\x80", "\xE3\x80\x80x"}));  // U+3000
    EXPECT_EQ(split_pieces("This is a test         with"),
              (Pieces{"This", " is", " a", " test", "        ", " with"}));
}

TEST(pretokenizer, pieces_cover_the_text) {
    const std::string text = "Mixed: 日本語テキスト, Ελληνικά 123,456.78 — emoji 👍🏽!\r\n\tend";
    std::string joined;
    for (const auto& p : split_pieces(text)) {
        EXPECT_FALSE(p.empty());
        joined += p;
    }
    EXPECT_EQ(joined, text);
}

TEST(unicode_classes, ascii_shortcut_agrees_with_generated_table) {
    for (uint32_t c = 0; c < 128; ++c) EXPECT_EQ(classes_of(c), detail::table_classes_of(c)) << "code point " << c;
}

TEST(unicode_classes, samples_from_unicode_16) {
    EXPECT_EQ(classes_of(0x00E9), kLowerish | kLetter);             // é Ll
    EXPECT_EQ(classes_of(0x01C5), kUpperish | kLetter);             // ǅ Lt
    EXPECT_EQ(classes_of(0x02B0), kUpperish | kLowerish | kLetter);  // ʰ Lm
    EXPECT_EQ(classes_of(0x4E2D), kUpperish | kLowerish | kLetter);  // 中 Lo
    EXPECT_EQ(classes_of(0x0301), kUpperish | kLowerish);            // combining acute, Mn
    EXPECT_EQ(classes_of(0x2167), kNumber);                          // Ⅷ Nl
    EXPECT_EQ(classes_of(0x00A0), kSpace);
    EXPECT_EQ(classes_of(0x0085), kSpace);
    EXPECT_EQ(classes_of(0x200B), 0);                                // zero width space is not \s
    EXPECT_EQ(classes_of(0x1F600), 0);                               // emoji: So
    EXPECT_EQ(classes_of(0x0897), kUpperish | kLowerish);            // new in Unicode 16 (Mn)
    EXPECT_EQ(classes_of(0x10FFFF), 0);
}

}  // namespace
}  // namespace osprey::tok
