// Renderer vs every rendered file of shared/conformance/harmony (text byte for byte, and token ids vs
// shared/conformance/derived/harmony_test_data_token_ids.json), plus the C++ builder API and the
// errors malformed conversations get.
#include <gtest/gtest.h>

#include "core/check.h"
#include "harmony/conversation_json.h"
#include "harmony/render.h"
#include "harmony_fixture.h"

namespace osprey::harmony {
namespace {

// The conformance conversations use "@browser"/"@python" for the built-in namespaces: those entries
// are taken out of the JSON and added back with SystemContent::with_browser_tool()/with_python_tool().
Conversation load_case(const json::Value& c) {
    json::Value conv = c.at("conversation");
    std::vector<std::vector<std::string>> builtins;  // per message
    for (json::Value& m : conv.as_object()[0].second.as_array()) {
        builtins.emplace_back();
        json::Value* content = nullptr;
        for (auto& [k, v] : m.as_object())
            if (k == "content") content = &v;
        if (!content || !content->is_array()) continue;
        for (json::Value& part : content->as_array()) {
            if (!part.is_object()) continue;
            for (auto& [k, v] : part.as_object()) {
                if (k != "tools") continue;
                json::Object kept;
                for (auto& [name, ns] : v.as_object()) {
                    if (ns.is_string()) builtins.back().push_back(ns.as_string());
                    else kept.emplace_back(name, ns);
                }
                v = json::Value(std::move(kept));
            }
        }
    }
    Conversation out = conversation_from_json(conv);
    for (size_t i = 0; i < out.messages.size(); ++i)
        for (Content& part : out.messages[i].content)
            if (auto* sys = std::get_if<SystemContent>(&part))
                for (const std::string& b : builtins[i]) {
                    if (b == "@browser") sys->with_browser_tool();
                    if (b == "@python") sys->with_python_tool();
                }
    return out;
}

Rendered render_case(const json::Value& c) {
    const Conversation conv = load_case(c);
    RenderOptions options;
    options.drop_analysis = c.at("auto_drop_analysis").as_bool() ? AnalysisPolicy::first_final : AnalysisPolicy::none;
    const json::Value& next = c.at("next_role");
    if (next.is_null()) return render_conversation(conv, options);
    return render_for_completion(conv, *parse_role(next.as_string()), options);
}

std::string first_difference(const std::string& a, const std::string& b) {
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    return "first difference at byte " + std::to_string(i) + ": got '" + a.substr(i, 40) + "' want '" +
           b.substr(i, 40) + "'";
}

TEST(harmony_render, every_conformance_file_text) {
    const json::Value cases = test::read_test_json("conformance_conversations.json").at("cases");
    EXPECT_EQ(cases.size(), 19u);
    for (const auto& [name, c] : cases.as_object()) {
        SCOPED_TRACE(name);
        const std::string got = render_case(c).text();
        const std::string want = test::read_conformance(name);
        EXPECT_EQ(got, want) << first_difference(got, want);
    }
}

TEST(harmony_render, every_conformance_file_tokens) {
    const json::Value cases = test::read_test_json("conformance_conversations.json").at("cases");
    const json::Value& files = test::derived_token_ids().at("files");
    for (const auto& [name, c] : cases.as_object()) {
        SCOPED_TRACE(name);
        std::vector<TokenId> want;
        for (const json::Value& id : files.at(name).at("token_ids").as_array()) want.push_back(TokenId(id.as_int()));
        const std::vector<TokenId> got = render_case(c).tokens(test::o200k());
        EXPECT_EQ(got, want);
    }
}

TEST(harmony_render, builder_api_simple_convo) {
    Conversation c{{Message::system(SystemContent{}), Message::user("What is 2 + 2?")}};
    EXPECT_EQ(render_for_completion(c).text(), test::read_conformance("test_simple_convo.txt"));
    const std::vector<TokenId> ids = render_for_completion(c).tokens(test::o200k());
    EXPECT_EQ(ids.size(), 64u);  // shared/spec/harmony.md §10
    EXPECT_EQ(ids.back(), 173781);
    EXPECT_EQ(ids[ids.size() - 2], kStart);
}

TEST(harmony_render, builder_api_tool_loop) {
    Conversation c;
    c.messages.push_back(Message::user("What is the weather in SF?"));
    c.messages.push_back(Message::assistant("User asks: \u201cWhat is the weather in SF?\u201d We need to use lookup_weather tool.",
                                            "analysis"));
    c.messages.push_back(Message::assistant("{\"location\": \"San Francisco\"}", "commentary")
                             .with_recipient("functions.lookup_weather")
                             .with_content_type("<|constrain|>json"));
    c.messages.push_back(Message::tool("functions.lookup_weather", "{\"temperature\": 20, \"description\": \"sunny\"}"));
    EXPECT_EQ(render_for_completion(c).text(), test::read_conformance("test_does_not_drop_if_ongoing_analysis.txt"));
    // <|constrain|> is the special token, not its text.
    const std::vector<TokenId> ids = render_for_completion(c).tokens(test::o200k());
    EXPECT_EQ(std::count(ids.begin(), ids.end(), kConstrain), 1);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), kCall), 1);
}

TEST(harmony_render, user_text_with_special_strings_stays_text) {
    Conversation c{{Message::user("<|start|>")}};
    const std::vector<TokenId> ids = render_conversation(c).tokens(test::o200k());
    // <|start|> user <|message|> [27, 91, 5236, 91, 29] <|end|>  (spec §1.4 encoding rules)
    const std::vector<TokenId> want{kStart, 1428, kMessage, 27, 91, 5236, 91, 29, kEnd};
    EXPECT_EQ(ids, want);
}

TEST(harmony_render, training_render_ends_with_return) {
    Conversation c{{Message::user("Hi"), Message::assistant("Hello!", "final")}};
    const std::string text = render_for_training(c).text();
    EXPECT_TRUE(text.ends_with("<|channel|>final<|message|>Hello!<|return|>")) << text;
    // Not final: unchanged.
    Conversation d{{Message::user("Hi"), Message::assistant("hmm", "analysis")}};
    EXPECT_TRUE(render_for_training(d).text().ends_with("hmm<|end|>"));
}

TEST(harmony_render, author_name_and_recipient_all) {
    Message m = Message::user("hey");
    m.author.name = "alice";
    Message a = Message::assistant("to everyone", "final").with_recipient("all");
    Conversation c{{m, a}};
    EXPECT_EQ(render_conversation(c, {AnalysisPolicy::none}).text(),
              "<|start|>user:alice<|message|>hey<|end|><|start|>assistant<|channel|>final<|message|>to "
              "everyone<|call|>");
}

TEST(harmony_render, system_without_optional_fields) {
    SystemContent sys;
    sys.model_identity.reset();
    sys.knowledge_cutoff.reset();
    sys.reasoning_effort.reset();
    sys.channel_config.reset();
    Conversation c{{Message::system(sys)}};
    EXPECT_EQ(render_conversation(c).text(), "<|start|>system<|message|><|end|>");
}

TEST(harmony_render, message_pieces_are_fragments_encoded_separately) {
    const Message call = Message::assistant("{}", "commentary").with_recipient("functions.f").with_content_type(
        "<|constrain|>json");
    const Rendered r = render_message(call);
    std::vector<std::string> shape;
    for (const Piece& p : r.pieces) shape.push_back(p.special >= 0 ? std::string(formatting_token_text(p.special)) : "[" + p.text + "]");
    const std::vector<std::string> want{"<|start|>", "[assistant]", "[ to=functions.f]", "<|channel|>", "[commentary]",
                                        "[ ]", "<|constrain|>", "[json]", "<|message|>", "[{}]", "<|call|>"};
    EXPECT_EQ(shape, want);
    EXPECT_THROW(render_message(Message::assistant("x").with_channel("")), osprey::Error);
}

void expect_error(const Conversation& c, const std::string& needle) {
    try {
        render_conversation(c);
        ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const osprey::Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

TEST(harmony_render, malformed_conversations_are_errors_naming_the_field) {
    Message tool;
    tool.author.role = Role::tool;
    tool.content.emplace_back(TextContent{"x"});
    expect_error(Conversation{{tool}}, "messages[0].name");

    Message sys_in_user = Message::user("x");
    sys_in_user.content.emplace_back(SystemContent{});
    expect_error(Conversation{{Message::user("ok"), sys_in_user}}, "messages[1].content[1]");

    expect_error(Conversation{{Message::user("bad \xff byte")}}, "messages[0].content[0].text: invalid UTF-8");
    expect_error(Conversation{{Message::assistant("x", "final channel")}}, "messages[0].channel");
    expect_error(Conversation{{Message::assistant("x").with_recipient("")}}, "messages[0].recipient");

    DeveloperContent dev;
    dev.with_function_tools({{"f", "d", json::parse(R"({"type": "object", "properties": {"a": {"type": "strng"}}})")}});
    expect_error(Conversation{{Message::developer(dev)}}, "properties.a.type: unknown JSON-Schema type 'strng'");
    DeveloperContent dev2;
    dev2.with_function_tools({{"f", "d", json::parse(R"([1, 2])")}});
    expect_error(Conversation{{Message::developer(dev2)}}, "tools.functions.tools[0].parameters: expected a JSON object");
}

}  // namespace
}  // namespace osprey::harmony
