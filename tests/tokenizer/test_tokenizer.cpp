// Tokenizer end to end: every case of shared/conformance/tokenizer/o200k_known_answers.json, special
// tokens, decode errors, the streaming decoder, the model-folder search order.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "core/check.h"
#include "core/file.h"
#include "core/json.h"
#include "core/utf8.h"
#include "tokenizer/rank_file.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer_fixture.h"

namespace osprey::tok {
namespace {

const json::Value& known_answers() {
    static const json::Value v = json::parse(
        read_file(std::filesystem::path(OSPREY_SHARED_DIR) / "conformance/tokenizer/o200k_known_answers.json"));
    return v;
}

std::vector<TokenId> ids_of(const json::Value& array) {
    std::vector<TokenId> ids;
    for (const json::Value& v : array.as_array()) ids.push_back(TokenId(v.as_int()));
    return ids;
}

Specials mode_of(const json::Value& c) {
    return c.at("mode").as_string() == "all_special" ? Specials::allowed : Specials::as_text;
}

TEST(tokenizer_known_answers, encode_cases) {
    const auto& cases = known_answers().at("encode_cases").as_array();
    ASSERT_GE(cases.size(), 8u);
    for (const json::Value& c : cases) {
        const std::string& text = c.at("text").as_string();
        const auto want = ids_of(c.at("tokens"));
        EXPECT_EQ(test::o200k().encode(text, mode_of(c)), want) << text;
        EXPECT_EQ(test::o200k().decode(want), text);
    }
}

TEST(tokenizer_known_answers, encode_prefix_cases) {
    for (const json::Value& c : known_answers().at("encode_prefix_cases").as_array()) {
        const auto want = ids_of(c.at("tokens_prefix"));
        const auto got = test::o200k().encode(c.at("text_prefix_checked").as_string(), mode_of(c));
        EXPECT_EQ(got, want);
    }
}

TEST(tokenizer_known_answers, decode_cases) {
    for (const json::Value& c : known_answers().at("decode_cases").as_array()) {
        const auto ids = ids_of(c.at("tokens"));
        if (ids[0] >= kVocabSize) {
            // Only harmony's Rust tokenizer has id 201088; the model (and tiktoken) do not.
            EXPECT_THROW(test::o200k().decode(ids), Error);
            continue;
        }
        if (const json::Value* bytes = c.find("bytes")) {
            std::string want;
            for (const json::Value& b : bytes->as_array()) want += char(b.as_int());
            EXPECT_EQ(test::o200k().decode_bytes(ids), want);
            EXPECT_THROW(test::o200k().decode(ids), Error) << "strict decode of a partial character";
        } else {
            EXPECT_EQ(test::o200k().decode(ids), c.at("text").as_string());
        }
    }
}

TEST(tokenizer_known_answers, split_cases_and_roundtrips) {
    for (const json::Value& c : known_answers().at("split_cases").as_array()) {
        std::vector<std::string> want;
        for (const json::Value& p : c.at("pieces").as_array()) want.push_back(p.as_string());
        std::vector<std::string> got;
        for (TokenId id : test::o200k().encode(c.at("text").as_string())) got.push_back(test::o200k().token_bytes(id));
        EXPECT_EQ(got, want) << "each piece of this text is one token";
    }
    for (const json::Value& t : known_answers().at("roundtrip_only").as_array()) {
        EXPECT_EQ(test::o200k().decode(test::o200k().encode(t.as_string())), t.as_string());
    }
}

TEST(tokenizer, handy_ids_from_the_spec) {
    const Tokenizer& t = test::o200k();
    EXPECT_EQ(t.encode("system"), (std::vector<TokenId>{17360}));
    EXPECT_EQ(t.encode("assistant"), (std::vector<TokenId>{173781}));
    EXPECT_EQ(t.encode("commentary"), (std::vector<TokenId>{12606, 815}));
    EXPECT_EQ(t.encode("\n\n"), (std::vector<TokenId>{279}));
    EXPECT_EQ(t.encode(" json"), (std::vector<TokenId>{5701}));
    EXPECT_EQ(t.vocab_size(), 201088);
}

TEST(tokenizer, special_tokens) {
    const Tokenizer& t = test::o200k();
    EXPECT_EQ(t.special_id("<|start|>"), 200006);
    EXPECT_EQ(t.special_id("<|call|>"), 200012);
    EXPECT_EQ(t.special_id("<|endofprompt|>"), 200018);
    EXPECT_EQ(t.special_id("<|reserved_200018|>"), 200018);
    EXPECT_EQ(t.special_id("<|reserved_201087|>"), 201087);
    EXPECT_EQ(t.special_id("<|reserved_201088|>"), std::nullopt);
    EXPECT_EQ(t.special_id("start"), std::nullopt);
    EXPECT_TRUE(t.is_special(199998));
    EXPECT_FALSE(t.is_special(199997));
    EXPECT_EQ(t.token_bytes(200018), "<|endofprompt|>");
    EXPECT_EQ(t.token_bytes(201087), "<|reserved_201087|>");
    // Unknown <|...|> text stays text; a special right after "<|" is still found.
    EXPECT_EQ(t.encode("<|bogus|><|end|>", Specials::allowed), [&] {
        auto ids = t.encode("<|bogus|>");
        ids.push_back(200007);
        return ids;
    }());
    EXPECT_EQ(t.encode("<|<|end|>", Specials::allowed).back(), 200007);
    // Text next to a special is pre-tokenized on its own: the trailing spaces stay one piece.
    EXPECT_EQ(t.encode("hi  <|end|>", Specials::allowed),
              (std::vector<TokenId>{t.encode("hi  ")[0], t.encode("hi  ")[1], 200007}));
    EXPECT_EQ(t.encode("<|end|>", Specials::as_text), t.encode("<|end|>"));
}

TEST(tokenizer, errors_name_the_problem) {
    const Tokenizer& t = test::o200k();
    try {
        t.encode("ok\xff");
        FAIL() << "invalid UTF-8 must throw";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("byte 2"), std::string::npos) << e.what();
    }
    EXPECT_THROW(t.encode("\xed\xa0\x80"), Error);  // a UTF-8-encoded surrogate
    EXPECT_THROW(t.token_bytes(-1), Error);
    EXPECT_THROW(t.token_bytes(201088), Error);
    const std::vector<TokenId> bad = {1, 300000};
    EXPECT_THROW(t.decode_bytes(bad), Error);
    EXPECT_EQ(t.encode(""), std::vector<TokenId>{});
}

TEST(stream_decoder, never_emits_half_a_character) {
    const Tokenizer& t = test::o200k();
    const std::string text = "Chicken 🐔 and 日本語 — naïve 👨‍👩‍👧‍👦!";
    const auto ids = t.encode(text);
    StreamDecoder d(t);
    std::string got;
    for (TokenId id : ids) {
        const std::string piece = d.push(id);
        EXPECT_TRUE(utf8::is_valid(piece)) << "token " << id;
        got += piece;
    }
    got += d.flush();
    EXPECT_EQ(got, text);
}

TEST(stream_decoder, holds_a_partial_character_and_replaces_it_at_flush) {
    const Tokenizer& t = test::o200k();
    StreamDecoder d(t);
    EXPECT_EQ(d.push(132990), "Chicken");
    EXPECT_EQ(d.push(9552), " ");  // the space; the first two bytes of a 4-byte char are held
    EXPECT_EQ(d.flush(), "\xEF\xBF\xBD\xEF\xBF\xBD");  // each held byte becomes U+FFFD
    EXPECT_EQ(d.flush(), "");
}

TEST(tokenizer, model_dir_search_order) {
    const auto dir = std::filesystem::temp_directory_path() / "osprey_test_model_dir";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir / "original");
    std::filesystem::copy_file(test::rank_file_path(), dir / "original" / "o200k_base.tiktoken");
    const auto paths = tokenizer_search_paths(dir);
    ASSERT_GE(paths.size(), 3u);
    EXPECT_EQ(paths[0], dir / "tokenizer.json");
    EXPECT_EQ(paths[1], dir / "o200k_base.tiktoken");
    EXPECT_EQ(paths[2], dir / "original" / "o200k_base.tiktoken");
    EXPECT_EQ(Tokenizer::from_model_dir(dir).encode("hello world"), (std::vector<TokenId>{24912, 2375}));

    std::filesystem::remove_all(dir / "original");
    const char* old_env = std::getenv("OSPREY_TIKTOKEN_FILE");
    const std::string saved = old_env ? old_env : "";
    const char* old_home = std::getenv("HOME");
    const std::string saved_home = old_home ? old_home : "";
    setenv("HOME", dir.c_str(), 1);
    unsetenv("OSPREY_TIKTOKEN_FILE");
    try {
        Tokenizer::from_model_dir(dir);
        FAIL() << "an empty folder must throw";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
    }
    setenv("OSPREY_TIKTOKEN_FILE", test::rank_file_path().c_str(), 1);
    EXPECT_EQ(Tokenizer::from_model_dir(dir).encode("hello world"), (std::vector<TokenId>{24912, 2375}));
    if (old_env) setenv("OSPREY_TIKTOKEN_FILE", saved.c_str(), 1); else unsetenv("OSPREY_TIKTOKEN_FILE");
    if (old_home) setenv("HOME", saved_home.c_str(), 1);
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace osprey::tok
