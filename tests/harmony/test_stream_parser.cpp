// Streaming parser: the parsing conformance files, harmony's inline parser tests, events, and each
// malformed-header repair the parser promises (shared/spec/harmony.md §9).
#include <gtest/gtest.h>

#include <sstream>

#include "core/utf8.h"
#include "harmony/render.h"
#include "harmony/stream_parser.h"
#include "harmony_fixture.h"

namespace osprey::harmony {
namespace {

std::vector<TokenId> encode(const std::string& text) { return test::o200k().encode(text, tok::Specials::allowed); }

std::vector<TokenId> read_ids(const std::string& name) {
    std::istringstream in(test::read_conformance(name));
    std::vector<TokenId> ids;
    for (TokenId t; in >> t;) ids.push_back(t);
    return ids;
}

std::vector<Message> parse(const std::vector<TokenId>& ids, std::optional<Role> first_role = Role::assistant) {
    StreamParserOptions o;
    o.first_role = first_role;
    return parse_messages(test::o200k(), ids, o);
}

using Strings = std::vector<std::string>;

TEST(harmony_parser, simple_reasoning_response) {
    const std::vector<TokenId> ids = read_ids("test_simple_reasoning_response.txt");
    ASSERT_EQ(ids.size(), 35u);
    EXPECT_EQ(test::describe(parse(ids)),
              (Strings{"assistant #analysis |User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.",
                       "assistant #final |2 + 2 = 4."}));
}

TEST(harmony_parser, simple_tool_call) {
    const std::vector<TokenId> ids = read_ids("test_simple_tool_call.txt");
    ASSERT_EQ(ids.size(), 39u);
    EXPECT_EQ(test::describe(parse(ids)),
              (Strings{"assistant #analysis |User asks: \"What is the weather in Tokyo?\" We need to use lookup_weather tool.",
                       "assistant to=lookup_weather #analysis code |{\"location\": \"Tokyo\"}"}));
}

TEST(harmony_parser, streamable_parser_file_token_by_token) {
    const std::vector<TokenId> ids = encode(test::read_conformance("test_streamable_parser.txt"));
    StreamParser p(test::o200k());
    for (TokenId t : ids) p.push(t);
    p.finish();
    ASSERT_EQ(p.messages().size(), 3u);
    EXPECT_EQ(p.n_repairs(), 0u);
    EXPECT_TRUE(p.messages()[0].text().find("But w\ne need") != std::string::npos);
    EXPECT_EQ(test::describe(p.messages()[1]),
              "assistant to=browser.search #commentary code |{\"query\": \"current US president July 2025\", "
              "\"topn\": 10, \"source\": \"news\"}");
    EXPECT_EQ(test::describe(p.messages()[2]),
              "tool:browser.search to=assistant #commentary |{\"result\": \"https://openai.com/\"}");
}

TEST(harmony_parser, tool_response_without_start_role) {
    const std::string text = test::read_conformance("test_tool_response_parsing.txt");
    const std::vector<TokenId> ids = encode(text);
    EXPECT_EQ(test::o200k().decode(ids), text);
    EXPECT_EQ(test::describe(parse(ids, std::nullopt)),
              (Strings{"tool:browser.search to=assistant #commentary |{\"result\": \"https://openai.com/\"}"}));
}

TEST(harmony_parser, constrain_marker_adjacent_to_recipient) {
    for (const char* text :
         {"<|start|>assistant<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>{\"a\":1}<|call|>",
          "<|start|>assistant to=functions.get_weather<|channel|>commentary<|constrain|>json<|message|>{\"a\":1}<|end|>",
          "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"a\":1}<|call|>"}) {
        EXPECT_EQ(test::describe(parse(encode(text), std::nullopt)),
                  (Strings{"assistant to=functions.get_weather #commentary <|constrain|>json |{\"a\":1}"}))
            << text;
    }
}

TEST(harmony_parser, missing_message_token_recovers_header_text) {
    EXPECT_EQ(test::describe(parse(encode("<|channel|>commentary Hello<|end|>"))), (Strings{"assistant #commentary |Hello"}));
    EXPECT_EQ(test::describe(parse(encode("I must refuse<|end|>"))), (Strings{"assistant |I must refuse"}));
}

TEST(harmony_parser, invalid_utf8_does_not_leak_between_messages) {
    std::vector<TokenId> ids = encode("<|start|>assistant<|message|>");
    ids.push_back(9552);  // bytes 20 F0 9F: an unfinished 4-byte character
    ids.push_back(9552);
    for (TokenId t : encode("<|end|><|start|>assistant<|message|>Hi<|end|>")) ids.push_back(t);
    EXPECT_EQ(test::describe(parse(ids, std::nullopt)), (Strings{"assistant | \xEF\xBF\xBD \xEF\xBF\xBD", "assistant |Hi"}));
}

TEST(harmony_parser, partial_bytes_flushed_at_end_of_stream) {
    std::vector<TokenId> ids = encode("<|start|>assistant<|message|>");
    ids.push_back(9552);
    for (TokenId t : encode("Hi")) ids.push_back(t);
    EXPECT_EQ(test::describe(parse(ids, std::nullopt)), (Strings{"assistant | \xEF\xBF\xBDHi"}));
}

TEST(harmony_parser, multi_token_character_is_one_delta) {
    StreamParser p(test::o200k(), {.first_role = std::nullopt, .known_recipients = {}});
    p.push(encode("<|start|>assistant<|message|>"));
    const std::vector<TokenId> heart = test::o200k().encode("\xF0\x9F\x92\x96");  // U+1F496
    ASSERT_GE(heart.size(), 2u);
    EXPECT_TRUE(p.push(heart[0]).empty());
    std::vector<Event> events = p.push(heart[1]);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].kind, EventKind::content_delta);
    EXPECT_EQ(events[0].text, "\xF0\x9F\x92\x96");
    events = p.push(kEnd);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].kind, EventKind::message_end);
    EXPECT_EQ(events[0].message.text(), "\xF0\x9F\x92\x96");
}

TEST(harmony_parser, invalid_token_id_becomes_replacement_character) {
    std::vector<TokenId> ids = encode("<|start|>assistant<|channel|>analysis<|message|>Practice.");
    ids.push_back(-1);
    ids.push_back(1 << 30);
    EXPECT_EQ(test::describe(parse(ids, std::nullopt)), (Strings{"assistant #analysis |Practice.\xEF\xBF\xBD\xEF\xBF\xBD"}));
}

TEST(harmony_parser, events_of_a_tool_call_turn) {
    StreamParser p(test::o200k());
    std::vector<Event> events = p.push(encode(
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"SF\"}<|call|>"));
    std::vector<EventKind> kinds;
    std::string deltas;
    for (const Event& e : events) {
        kinds.push_back(e.kind);
        if (e.kind == EventKind::content_delta && e.index == 1) deltas += e.text;
    }
    using K = EventKind;
    ASSERT_GE(kinds.size(), 6u);
    EXPECT_EQ(kinds.front(), K::message_start);
    EXPECT_EQ(kinds.back(), K::tool_call);
    EXPECT_EQ(kinds[kinds.size() - 2], K::message_end);
    EXPECT_EQ(deltas, "{\"city\":\"SF\"}");
    const Event& call = events.back();
    EXPECT_EQ(call.end, EndReason::call_token);
    EXPECT_EQ(call.message.recipient, "functions.get_weather");
    EXPECT_EQ(call.message.content_type, "<|constrain|>json");
    EXPECT_EQ(call.message.text(), "{\"city\":\"SF\"}");
    EXPECT_EQ(p.n_repairs(), 0u);
    EXPECT_TRUE(p.finish().empty());
}

TEST(harmony_parser, return_ends_the_message_and_parsing_continues) {
    StreamParser p(test::o200k());
    p.push(encode("<|channel|>final<|message|>4<|return|>"));
    ASSERT_EQ(p.messages().size(), 1u);
    EXPECT_EQ(p.state(), StreamParser::State::expect_start);
    p.push(encode("<|start|>assistant<|channel|>final<|message|>more<|end|>"));
    EXPECT_EQ(p.messages().size(), 2u);
}

// --- repairs of malformed model output ---

TEST(harmony_parser_repairs, recipient_in_role_position) {
    StreamParser p(test::o200k());
    p.push(encode("<|channel|>analysis<|message|>x<|end|><|start|>functions.get_weather<|channel|>commentary "
                  "<|constrain|>json<|message|>{}<|call|>"));
    EXPECT_EQ(test::describe(p.messages()[1]), "assistant to=functions.get_weather #commentary <|constrain|>json |{}");
    EXPECT_GT(p.n_repairs(), 0u);
    EXPECT_EQ(test::describe(parse(encode("<|start|>to=functions.f<|channel|>commentary json<|message|>{}<|call|>"),
                             std::nullopt)),
              (Strings{"assistant to=functions.f #commentary json |{}"}));
}

TEST(harmony_parser_repairs, json_glued_to_tool_name) {
    EXPECT_EQ(test::describe(parse(encode("<|channel|>commentary to=functions.get_weatherjson<|message|>{}<|call|>"))),
              (Strings{"assistant to=functions.get_weather #commentary json |{}"}));
    // A tool whose name really ends in "json" is left alone...
    EXPECT_EQ(test::describe(parse(encode("<|channel|>commentary to=functions.to_json<|message|>{}<|call|>"))),
              (Strings{"assistant to=functions.to_json #commentary |{}"}));
    // ...and with known tool names the split is exact.
    StreamParserOptions o;
    o.known_recipients = {"functions.tojson"};
    EXPECT_EQ(test::describe(parse_messages(test::o200k(), encode("<|channel|>commentary to=functions.tojson<|message|>{}<|call|>"), o)),
              (Strings{"assistant to=functions.tojson #commentary |{}"}));
}

TEST(harmony_parser_repairs, missing_start) {
    EXPECT_EQ(test::describe(parse(encode("<|channel|>analysis<|message|>think<|end|>assistant<|channel|>final<|message|>"
                                    "42<|return|>"))),
              (Strings{"assistant #analysis |think", "assistant #final |42"}));
    EXPECT_EQ(test::describe(parse(encode("<|channel|>analysis<|message|>think<|end|><|channel|>final<|message|>42"))),
              (Strings{"assistant #analysis |think", "assistant #final |42"}));
}

TEST(harmony_parser_repairs, text_after_end) {
    EXPECT_EQ(test::describe(parse(encode("<|channel|>final<|message|>Hi.<|end|> And more text."))),
              (Strings{"assistant #final |Hi.", "assistant |And more text."}));
}

TEST(harmony_parser_repairs, doubled_start_and_missing_end) {
    EXPECT_EQ(test::describe(parse(encode("<|channel|>analysis<|message|>a<|start|><|start|>assistant<|channel|>final<|message|>b"),
                             Role::assistant)),
              (Strings{"assistant #analysis |a", "assistant #final |b"}));
}

TEST(harmony_parser_repairs, empty_channel_and_extra_header_words) {
    EXPECT_EQ(test::describe(parse(encode("<|channel|><|message|>x<|end|>"))), (Strings{"assistant |x"}));
    EXPECT_EQ(test::describe(parse(encode("<|channel|>commentary to=functions.f extra code<|message|>x<|call|>"))),
              (Strings{"assistant to=functions.f #commentary code |x"}));
    EXPECT_EQ(test::describe(parse(encode("<|channel|>final <|constrain|>json<|message|>{}<|end|>"))),
              (Strings{"assistant #final <|constrain|>json |{}"}));
}

TEST(harmony_parser_repairs, header_without_message_is_bounded) {
    std::string text = "<|channel|>final ";
    for (int i = 0; i < 300; ++i) text += "word ";
    StreamParser p(test::o200k());
    const std::vector<Event> events = p.push(encode(text));
    ASSERT_FALSE(events.empty());  // content streams once the header is implausibly long
    EXPECT_EQ(events[0].kind, EventKind::message_start);
    p.finish();
    ASSERT_EQ(p.messages().size(), 1u);
    EXPECT_EQ(p.messages()[0].channel, "final");
    const std::string content = p.messages()[0].text();
    EXPECT_EQ(std::count(text.begin(), text.end(), 'w'), std::count(content.begin(), content.end(), 'w'));
}

TEST(harmony_parser_repairs, stray_tokens_never_throw) {
    StreamParser p(test::o200k(), {.first_role = std::nullopt, .known_recipients = {}});
    for (TokenId t : {kEnd, kReturn, kCall, kMessage, kConstrain, kChannel, kStart, kStart, kMessage, 200014, 199999})
        EXPECT_NO_THROW(p.push(t));
    EXPECT_NO_THROW(p.finish());
}

TEST(harmony_parser, round_trip_of_rendered_conversation) {
    Conversation c;
    c.messages.push_back(Message::user("Weather?"));
    c.messages.push_back(Message::assistant("thinking \xE2\x9C\x93", "analysis"));
    c.messages.push_back(Message::assistant("{\"x\": 1}", "commentary").with_recipient("functions.w").with_content_type("<|constrain|>json"));
    c.messages.push_back(Message::tool("functions.w", "sunny").with_recipient("assistant").with_channel("commentary"));
    c.messages.push_back(Message::assistant("Sunny \xF0\x9F\x98\x80", "final"));
    const std::vector<TokenId> ids = render_conversation(c, {AnalysisPolicy::none}).tokens(test::o200k());
    const std::vector<Message> back = parse(ids, std::nullopt);
    ASSERT_EQ(back.size(), c.messages.size());
    for (size_t i = 0; i < back.size(); ++i) EXPECT_EQ(test::describe(back[i]), test::describe(c.messages[i]));
}

}  // namespace
}  // namespace osprey::harmony

namespace osprey::harmony {
namespace {

// Issue 19: "<|start|>" in content. As text (what a client can send) it is ordinary tokens, both when
// rendered (the same ids as openai-harmony 0.0.8) and when parsed back (content, as harmony keeps it).
// As the special token inside generated content, openai-harmony keeps its text and everything after
// it in the message; we end the message there and parse the next header (docs/architecture.md,
// "Harmony: <|start|> inside content"), so a forgotten <|end|> cannot leak a header into content.
TEST(harmony_parser, literal_start_text_is_content_and_the_start_token_ends_the_message) {
    Conversation c;
    c.messages.push_back(Message::user("a <|start|>assistant b"));
    EXPECT_EQ(render_for_completion(c).tokens(test::o200k()),
              (std::vector<TokenId>{200006, 1428, 200008, 64, 464, 91, 5236, 91, 29, 173781, 287, 200007, 200006, 173781}));

    std::vector<TokenId> ids = encode("<|channel|>final<|message|>");
    const std::vector<TokenId> text = test::o200k().encode("hello <|start|> there", tok::Specials::as_text);
    ids.insert(ids.end(), text.begin(), text.end());
    ids.push_back(200002);  // <|return|>
    EXPECT_EQ(test::describe(parse(ids)), (Strings{"assistant #final |hello <|start|> there"}));

    const std::vector<TokenId> forgot_end = encode(
        "<|channel|>analysis<|message|>think<|start|>assistant<|channel|>final<|message|>answer<|return|>");
    EXPECT_EQ(test::describe(parse(forgot_end)), (Strings{"assistant #analysis |think", "assistant #final |answer"}));
}

}  // namespace
}  // namespace osprey::harmony
