// The conversation JSON format (openai-harmony's Conversation JSON): defaults, nulls, round trip, and
// an error naming the field for every kind of malformed input.
#include <gtest/gtest.h>

#include "core/check.h"
#include "harmony/conversation_json.h"
#include "harmony/render.h"

namespace osprey::harmony {
namespace {

TEST(harmony_conversation_json, absent_system_fields_take_defaults_null_removes_them) {
    const Conversation c = conversation_from_json_text(R"({"messages": [
        {"role": "system", "name": null, "content": [{"type": "system_content", "knowledge_cutoff": null,
                                                      "reasoning_effort": "high"}]}]})");
    ASSERT_EQ(c.messages.size(), 1u);
    const auto& sys = std::get<SystemContent>(c.messages[0].content[0]);
    EXPECT_EQ(sys.model_identity, std::string(kDefaultModelIdentity));
    EXPECT_FALSE(sys.knowledge_cutoff.has_value());
    EXPECT_EQ(sys.reasoning_effort, ReasoningEffort::high);
    ASSERT_TRUE(sys.channel_config.has_value());
    EXPECT_EQ(sys.channel_config->valid_channels.size(), 3u);
    EXPECT_EQ(render_conversation(c).text(),
              "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n\n"
              "Reasoning: high\n\n# Valid channels: analysis, commentary, final. Channel must be included for "
              "every message.<|end|>");
}

TEST(harmony_conversation_json, round_trip) {
    const char* text = R"({"messages": [
        {"role": "system", "content": [{"type": "system_content", "conversation_start_date": "2025-01-02",
          "tools": {"browser": {"name": "browser", "description": "B", "tools": [{"name": "search",
            "description": "s", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]}}}]},
        {"role": "developer", "content": [{"type": "developer_content", "instructions": "Be terse.",
          "tools": {"functions": {"name": "functions", "tools": [{"name": "f", "description": "g"}]}}}]},
        {"role": "user", "name": "bob", "content": "hi \u00e9"},
        {"role": "assistant", "channel": "commentary", "recipient": "functions.f", "content_type": "<|constrain|>json",
         "content": [{"type": "text", "text": "{}"}]},
        {"role": "tool", "name": "functions.f", "recipient": "assistant", "channel": "commentary", "content": "42"}]})";
    const Conversation c = conversation_from_json_text(text);
    const Conversation back = conversation_from_json(to_json(c));
    EXPECT_EQ(render_for_completion(c).text(), render_for_completion(back).text());
    EXPECT_EQ(to_json(c).dump(), to_json(back).dump());
    EXPECT_NE(render_for_completion(c).text().find("Calls to these tools must go to the commentary channel"),
              std::string::npos);
}

void expect_error(const char* text, const std::string& needle) {
    try {
        conversation_from_json_text(text);
        ADD_FAILURE() << "expected an error for " << text;
    } catch (const osprey::Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

TEST(harmony_conversation_json, malformed_input_names_the_field) {
    expect_error(R"({"messages": [{"role": "bot", "content": "x"}]})", "messages[0].role: unknown role 'bot'");
    expect_error(R"({"messages": [{"role": "user"}]})", "messages[0]: missing field 'content'");
    expect_error(R"({"messages": [{"role": "user", "content": 3}]})", "messages[0].content: expected a string");
    expect_error(R"({"messages": [{"role": "user", "content": "x", "chanel": "final"}]})",
                 "messages[0]: unknown field 'chanel'");
    expect_error(R"({"messages": [{"role": "user", "content": [{"type": "image"}]}]})",
                 "messages[0].content[0].type: unknown content type 'image'");
    expect_error(R"({"messages": [{"role": "system", "content": [{"type": "system_content", "reasoning_effort": "max"}]}]})",
                 "messages[0].content[0].reasoning_effort: unknown reasoning effort 'max'");
    expect_error(R"({"messages": [{"role": "developer", "content": [{"type": "developer_content", "tools":
                    {"functions": {"name": "functions", "tools": [{"name": "f", "description": "d",
                    "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}}]}}}]}]})",
                 "messages[0].content[0].tools.functions.tools[0].parameters.properties.a.type: unknown JSON-Schema type");
    expect_error(R"({"messages": [{"role": "user", "content": "x"}], "extra": 1})", "conversation: unknown field 'extra'");
    expect_error(R"({"messages": {}})", "messages: expected a JSON array");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}", "invalid JSON");
    expect_error(R"({"messages": [)", "invalid JSON");
}

}  // namespace
}  // namespace osprey::harmony
