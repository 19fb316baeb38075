// tokenizer.json: export from the rank file, load it back, and get the same ids as the rank-file
// loader; malformed files give errors that name the problem.
#include <gtest/gtest.h>

#include <fstream>

#include "core/check.h"
#include "core/json.h"
#include "tokenizer/hf_json.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer_fixture.h"

namespace osprey::tok {
namespace {

const std::string& exported() {
    static const std::string text = export_hf_tokenizer_json(test::o200k());
    return text;
}

std::string error_of(std::string_view text) {
    try {
        parse_hf_tokenizer_json(text, "tokenizer.json");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(hf_json, export_has_the_converter_layout) {
    const json::Value v = json::parse(exported());
    EXPECT_EQ(v.at("model").at("type").as_string(), "BPE");
    EXPECT_EQ(v.at("model").at("vocab").size(), 199998u);
    EXPECT_EQ(v.at("model").at("vocab").at("hello").as_int(), 24912);
    EXPECT_EQ(v.at("model").at("vocab").at("\xC4\xA0world").as_int(), 2375);  // Ġworld
    // Every cut of a token into two tokens (446 189 for o200k), as the gpt-oss converter writes them.
    EXPECT_EQ(v.at("model").at("merges").size(), 446189u);
    const auto& m0 = v.at("model").at("merges").as_array()[0].as_array();
    EXPECT_EQ(m0[0].as_string() + m0[1].as_string(), "\xC4\xA0\xC4\xA0");  // "  " = rank 256, the first merge
    EXPECT_EQ(v.at("added_tokens").size(), 21u);
    EXPECT_EQ(v.at("added_tokens").as_array()[8].at("content").as_string(), "<|start|>");
    EXPECT_EQ(v.at("added_tokens").as_array()[8].at("id").as_int(), 200006);
    EXPECT_EQ(v.at("added_tokens").as_array()[20].at("content").as_string(), "<|endofprompt|>");
    const auto& pre = v.at("pre_tokenizer").at("pretokenizers").as_array();
    EXPECT_EQ(pre[0].at("type").as_string(), "Split");
    EXPECT_EQ(pre[1].at("type").as_string(), "ByteLevel");
}

TEST(hf_json, both_loaders_give_identical_results) {
    const auto path = std::filesystem::temp_directory_path() / "osprey_test_tokenizer.json";
    std::ofstream(path, std::ios::binary) << exported();
    const Tokenizer hf = Tokenizer::from_hf_json(path);
    std::filesystem::remove(path);
    const Tokenizer& tt = test::o200k();
    for (int32_t id = 0; id < kVocabSize; ++id) ASSERT_EQ(hf.token_bytes(id), tt.token_bytes(id)) << "id " << id;
    const std::string text =
        "Hello world! <|start|>user<|message|>Grüße, 日本語, Ελληνικά, 12345678, 👍🏽\n\n  \tcode() {}\r\n";
    EXPECT_EQ(hf.encode(text), tt.encode(text));
    EXPECT_EQ(hf.encode(text, Specials::allowed), tt.encode(text, Specials::allowed));
    EXPECT_EQ(hf.special_id("<|call|>"), 200012);
}

TEST(hf_json, old_style_string_merges_are_accepted) {
    json::Value v = json::parse(exported());
    json::Array merges;
    for (const json::Value& m : v.at("model").at("merges").as_array()) {
        merges.push_back(m.as_array()[0].as_string() + " " + m.as_array()[1].as_string());
    }
    v.at("model");
    json::Value model = v.at("model");
    model.set("merges", json::Value(std::move(merges)));
    v.set("model", model);
    EXPECT_EQ(parse_hf_tokenizer_json(v.dump(), "t").size(), 199998u);
}

TEST(hf_json, malformed_files_are_named) {
    EXPECT_NE(error_of("{").find("tokenizer.json: invalid JSON"), std::string::npos) << error_of("{");
    EXPECT_NE(error_of("[]").find("top level"), std::string::npos);
    EXPECT_NE(error_of("{}").find("has no \"model\""), std::string::npos);
    EXPECT_NE(error_of(R"({"model":{"type":"WordPiece"}})").find("BPE"), std::string::npos);

    // Each case edits a shallow copy of the parsed export: members that change are rebuilt, never
    // modified in place (json::Value shares arrays and objects between copies).
    static const json::Value base = json::parse(exported());
    auto with = [&](auto&& edit) {
        json::Value copy = json::Value(json::Object(base.as_object()));
        edit(copy);
        try {
            hf_tokenizer_tokens(copy, "tokenizer.json");
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_EQ(with([](json::Value&) {}), "") << "the unedited export must load";
    EXPECT_NE(with([](json::Value& c) { c.set("normalizer", json::Object{{"type", "NFC"}}); }).find("normalizer"),
              std::string::npos);
    EXPECT_NE(with([](json::Value& c) { c.set("pre_tokenizer", json::Object{{"type", "Whitespace"}}); })
                  .find("o200k pattern"),
              std::string::npos);
    EXPECT_NE(with([](json::Value& c) {
                  json::Value m = json::Value(json::Object(c.at("model").as_object()));
                  json::Value vocab = json::Value(json::Object(m.at("vocab").as_object()));
                  vocab.set("hello", 5);
                  m.set("vocab", vocab);
                  c.set("model", m);
              }).find("appears twice"),
              std::string::npos);
    EXPECT_NE(with([](json::Value& c) {
                  json::Value m = json::Value(json::Object(c.at("model").as_object()));
                  json::Array merges = m.at("merges").as_array();
                  std::swap(merges[10], merges[5000]);
                  m.set("merges", json::Value(merges));
                  c.set("model", m);
              }).find("merges must follow the ranks"),
              std::string::npos);
    EXPECT_NE(with([](json::Value& c) {
                  json::Value m = json::Value(json::Object(c.at("model").as_object()));
                  json::Array merges = m.at("merges").as_array();
                  merges[3] = json::Array{"zzzzqq", "h"};
                  m.set("merges", json::Value(merges));
                  c.set("model", m);
              }).find("not in the vocab"),
              std::string::npos);
    EXPECT_NE(with([](json::Value& c) {
                  json::Array added = c.at("added_tokens").as_array();
                  added[0] = json::Value(json::Object(added[0].as_object()));
                  added[0].set("id", 5);
                  c.set("added_tokens", json::Value(added));
              }).find("not an o200k_harmony special token"),
              std::string::npos);
    EXPECT_NE(with([](json::Value& c) {
                  json::Value m = json::Value(json::Object(c.at("model").as_object()));
                  json::Value vocab = json::Value(json::Object(m.at("vocab").as_object()));
                  vocab.set("a b", 300000);
                  m.set("vocab", vocab);
                  c.set("model", m);
              }).find("has id 300000"),
              std::string::npos);
}

}  // namespace
}  // namespace osprey::tok
