// POST /v1/chat/completions request body -> a Harmony conversation plus generation parameters.
// Messages map onto Harmony as gpt-oss expects (shared/spec/harmony.md): client system and developer
// messages become the developer message's instructions; assistant reasoning ("reasoning_content" or
// "reasoning") becomes an analysis message, content a final message (commentary when it precedes
// tool calls), tool_calls commentary messages to functions.<name>; tool messages are rendered as
// the named function's output. Tests: tests/server/test_chat_request.cpp.
#pragma once

#include <string>
#include <vector>

#include "core/json.h"
#include "frontend/constraint.h"
#include "frontend/generation_params.h"
#include "frontend/harmony_prompt.h"
#include "harmony/message.h"
#include "server/generation_fields.h"

namespace osprey::server {

struct ChatRequest {
    std::string model;
    harmony::Conversation conversation;
    frontend::GenerationParams params;
    std::vector<std::string> tool_names;  // function tools the output may call ("get_weather")
    bool tools_enabled = true;            // false for tool_choice "none": calls are not reported
    frontend::ForcedCall forced;          // tool_choice "required" or a named function
    frontend::OutputFormat format;        // response_format or a vLLM guided_* extra
    std::vector<harmony::ToolDescription> tools;  // as rendered (after tool_choice), for strict schemas
};

// Throws ApiError (400) naming the first bad field; unknown members are rejected.
ChatRequest parse_chat_request(const json::Value& body, const GenerationLimits& limits);

}  // namespace osprey::server
