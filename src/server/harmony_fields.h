// Request members that /v1/chat/completions and /v1/responses both map onto Harmony values: the
// reasoning effort, function tools, content parts and tool_choice. Wrong types and values throw
// ApiError naming the field. Their Harmony side is the front end's (frontend/harmony_prompt.h).
// Tests: tests/server/test_chat_request.cpp.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"
#include "frontend/harmony_prompt.h"
#include "harmony/message.h"

namespace osprey::server {

// "low" | "medium" | "high" (also "minimal" -> low); ApiError naming `param` otherwise.
harmony::ReasoningEffort parse_effort(const json::Value& value, const std::string& param);

// One function tool: {"name", "description"?, "parameters"?, "strict"?} (the chat API nests this
// under "function"; the responses API puts it at the top level beside "type").
harmony::ToolDescription parse_function(const json::Value& value, const std::string& param,
                                        std::initializer_list<std::string_view> extra_keys = {});

// Text of a message content: a string, or an array of text parts ({"type": text_type, "text"}).
std::string content_text(const json::Value& value, const std::string& param,
                         std::initializer_list<std::string_view> text_types = {"text"});

// tool_choice of either API: "none" drops the tools and sets tools_enabled false, "auto" changes
// nothing, "required" or {"type": "function", <name>} forces a call (a named one keeps only that
// tool). The chat API nests the name ({"function": {"name"}}, nested_name), the responses API puts
// "name" at the top level. A forced call without tools, or an unknown name, is an ApiError.
frontend::ForcedCall apply_tool_choice(const json::Value& choice, bool nested_name,
                                       std::vector<harmony::ToolDescription>& tools, bool& tools_enabled);

}  // namespace osprey::server
