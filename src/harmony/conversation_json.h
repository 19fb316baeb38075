// The conversation JSON format of `osprey render`, `osprey parse` and tools/harmony/: the JSON that
// openai-harmony's Python `Conversation.to_json()` / `Conversation.from_json()` use, so one file can be
// fed to both sides. The format:
//
//   {"messages": [
//     {"role": "system", "content": [{"type": "system_content", "reasoning_effort": "High",
//                                     "conversation_start_date": "2025-06-28",
//                                     "tools": {"browser": {"name": "browser", "description": "...", "tools": [...]}}}]},
//     {"role": "developer", "content": [{"type": "developer_content", "instructions": "Be brief.",
//                                        "tools": {"functions": {"name": "functions", "tools": [
//                                          {"name": "get_weather", "description": "...", "parameters": {...}}]}}}]},
//     {"role": "user", "content": "What is the weather in SF?"},
//     {"role": "assistant", "channel": "analysis", "content": [{"type": "text", "text": "Need the tool."}]},
//     {"role": "assistant", "channel": "commentary", "recipient": "functions.get_weather",
//      "content_type": "<|constrain|>json", "content": "{\"city\": \"SF\"}"},
//     {"role": "tool", "name": "functions.get_weather", "recipient": "assistant", "channel": "commentary",
//      "content": "{\"temp\": 20}"}]}
//
// Rules: "content" is a string (one text part) or a list of parts with "type" text / system_content /
// developer_content. Fields of system_content that are absent take harmony's defaults (identity,
// cutoff 2024-06, effort Medium, the three required channels); an explicit null removes that line.
// reasoning_effort is "Low"/"Medium"/"High" (lowercase accepted). Optional fields may be null.
// Unknown keys, unknown roles, wrong types and invalid UTF-8 are errors naming the field
// ("messages[2].role: unknown role 'bot'"). A bare array of messages is accepted too.
#pragma once

#include <string_view>

#include "core/json.h"
#include "harmony/message.h"

namespace osprey::harmony {

Conversation conversation_from_json(const json::Value& value);
Conversation conversation_from_json_text(std::string_view text);  // parses, then conversation_from_json
Message message_from_json(const json::Value& value, const std::string& path = "message");

// The same format back (content always as a list of parts; absent optional fields omitted, except
// system_content fields that are absent in C++, which are written as null so they stay absent).
json::Value to_json(const Message& message);
json::Value to_json(const Conversation& conversation);

}  // namespace osprey::harmony
