// Token masks over the real o200k_harmony vocabulary: every allowed token keeps the output a prefix
// of the language, every refused one does not (checked token by token against the automaton),
// tokens ending mid-character are handled, and cached masks equal fresh ones.
#include <gtest/gtest.h>

#include "core/check.h"
#include "grammar/json_schema.h"
#include "grammar/parse.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer_fixture.h"

namespace osprey::grammar {
namespace {

std::shared_ptr<const VocabTrie> o200k_trie() {
    static const std::shared_ptr<const VocabTrie> trie = vocab_trie_of(tok::test::o200k());
    return trie;
}

// Checks the mask at the state after `prefix` against a direct run of every token.
void check_mask(const std::shared_ptr<const Grammar>& g, std::string_view prefix) {
    const tok::Tokenizer& t = tok::test::o200k();
    TokenMasker m(o200k_trie(), g);
    const int32_t s = m.automaton().next(m.automaton().start(), prefix);
    ASSERT_NE(s, Automaton::kDead) << prefix;
    const std::vector<uint32_t> mask = m.mask(s);
    Automaton direct(g);
    const int32_t d = direct.next(direct.start(), prefix);
    int n_allowed = 0;
    for (int i = 0; i < t.vocab_size(); ++i) {
        if (t.is_special(i)) {
            EXPECT_FALSE(mask_has(mask, i));
            continue;
        }
        std::string bytes;
        try {
            bytes = t.token_bytes(i);
        } catch (const Error&) {
            continue;
        }
        const bool want = direct.next(d, bytes) != Automaton::kDead;
        ASSERT_EQ(mask_has(mask, i), want) << "token " << i << " '" << bytes << "' after '" << prefix << "'";
        n_allowed += want;
    }
    EXPECT_GT(n_allowed, 0) << prefix;
    EXPECT_EQ(m.mask(s), mask) << "cached mask differs";
}

TEST(token_mask, json_schema_states_match_direct_runs) {
    auto g = std::make_shared<const Grammar>(json_schema_grammar(json::parse(
        R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
            "tags":{"type":"array","items":{"enum":["a","bc"]}}},"required":["name","age"]})")));
    for (const char* prefix : {"", "{", "{\"na", "{\"name\":\"x", "{\"name\":\"\xE6\x97", "{\"name\":\"x\",\"age\":1",
                               "{\"name\":\"x\",\"age\":12,\"tags\":[\"a\""})
        check_mask(g, prefix);
}

TEST(token_mask, regex_with_partial_utf8_tokens) {
    auto g = std::make_shared<const Grammar>([] {
        GrammarBuilder b;
        return b.build(b.add("root", parse_regex("[日本語]+ ?")));
    }());
    check_mask(g, "");
    check_mask(g, "日");
}

}  // namespace
}  // namespace osprey::grammar
