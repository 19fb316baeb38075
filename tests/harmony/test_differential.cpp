// Differential test against openai-harmony: replays cases written by tools/harmony/differential.py
// (renders of random conversations, and StreamableParser results and per-token deltas on random
// well-formed streams). Default: the committed tests/harmony/data/differential_cases.jsonl (100 + 100
// cases); OSPREY_HARMONY_DIFF_CASES=path replays a freshly generated (larger) file.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>

#include "core/check.h"
#include "harmony/conversation_json.h"
#include "harmony/render.h"
#include "harmony/stream_parser.h"
#include "harmony_fixture.h"

namespace osprey::harmony {
namespace {

std::string cases_path() {
    if (const char* env = std::getenv("OSPREY_HARMONY_DIFF_CASES")) return env;
    return std::string(OSPREY_SOURCE_DIR) + "/tests/harmony/data/differential_cases.jsonl";
}

std::vector<TokenId> ids_of(const json::Value& v) {
    std::vector<TokenId> out;
    for (const json::Value& x : v.as_array()) out.push_back(TokenId(x.as_int()));
    return out;
}

// "" when equal, else where they differ (decoded around the first differing token).
std::string compare_tokens(const std::vector<TokenId>& got, const std::vector<TokenId>& want) {
    size_t i = 0;
    while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
    if (i == got.size() && i == want.size()) return "";
    auto context = [&](const std::vector<TokenId>& v) {
        const size_t a = i >= 8 ? i - 8 : 0, b = std::min(v.size(), i + 8);
        return test::o200k().decode_bytes(std::span<const TokenId>(v.data() + a, b - a));
    };
    return "token " + std::to_string(i) + " of " + std::to_string(want.size()) + ": got '" + context(got) +
           "' want '" + context(want) + "'";
}

std::string check_render(const json::Value& c) {
    const Conversation conv = conversation_from_json(c.at("conversation"));
    RenderOptions options;
    options.drop_analysis = c.at("auto_drop_analysis").as_bool() ? AnalysisPolicy::first_final : AnalysisPolicy::none;
    const std::string& mode = c.at("mode").as_string();
    Rendered r = mode == "completion"     ? render_for_completion(conv, *parse_role(c.at("next_role").as_string()), options)
                 : mode == "conversation" ? render_conversation(conv, options)
                                          : render_for_training(conv, options);
    return compare_tokens(r.tokens(test::o200k()), ids_of(c.at("tokens")));
}

std::string check_parse(const json::Value& c) {
    StreamParserOptions options;
    options.first_role = c.at("role").is_null() ? std::nullopt : parse_role(c.at("role").as_string());
    StreamParser parser(test::o200k(), options);
    const std::vector<TokenId> ids = ids_of(c.at("tokens"));
    std::vector<std::pair<size_t, std::string>> deltas;
    for (size_t i = 0; i < ids.size(); ++i) {
        std::string d;
        for (const Event& e : parser.push(ids[i]))
            if (e.kind == EventKind::content_delta) d += e.text;
        if (!d.empty()) deltas.emplace_back(i, d);
    }
    parser.finish();
    std::vector<std::pair<size_t, std::string>> want_deltas;
    for (const json::Value& d : c.at("deltas").as_array())
        want_deltas.emplace_back(size_t(d.as_array()[0].as_int()), d.as_array()[1].as_string());
    std::vector<std::string> got, want;
    for (const Message& m : parser.messages()) got.push_back(test::describe(m));
    for (const json::Value& m : c.at("messages").as_array()) want.push_back(test::describe(message_from_json(m)));
    if (got != want) {
        std::string s = "messages differ:";
        for (size_t i = 0; i < std::max(got.size(), want.size()); ++i)
            s += "\n  got  " + (i < got.size() ? got[i] : "-") + "\n  want " + (i < want.size() ? want[i] : "-");
        return s;
    }
    if (deltas != want_deltas) return "deltas differ";
    if (parser.n_repairs() != 0) return "a well-formed stream needed " + std::to_string(parser.n_repairs()) + " repairs";
    return "";
}

TEST(harmony_differential, replay_openai_harmony_cases) {
    std::ifstream in(cases_path());
    if (!in) GTEST_SKIP() << "no differential cases at " << cases_path();
    size_t n_render = 0, n_parse = 0, n_bad = 0, line_no = 0;
    for (std::string line; std::getline(in, line);) {
        ++line_no;
        if (line.empty()) continue;
        const json::Value c = json::parse(line);
        std::string problem;
        try {
            if (c.at("kind").as_string() == "render") {
                ++n_render;
                problem = check_render(c);
            } else {
                ++n_parse;
                problem = check_parse(c);
            }
        } catch (const osprey::Error& e) {
            problem = std::string("error: ") + e.what();
        }
        if (!problem.empty() && ++n_bad <= 5) ADD_FAILURE() << cases_path() << ":" << line_no << ": " << problem;
    }
    std::printf("differential: %zu render cases, %zu parse cases, %zu mismatches\n", n_render, n_parse, n_bad);
    EXPECT_EQ(n_bad, 0u);
    EXPECT_GT(n_render + n_parse, 0u);
}

}  // namespace
}  // namespace osprey::harmony
