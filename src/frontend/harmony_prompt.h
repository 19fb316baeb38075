// The Harmony front end's input side, shared by /v1/chat/completions and /v1/responses: builds the
// Harmony conversation of a request (system message with the reasoning effort and date, developer
// message with the client's system/developer instructions and function tools, then the turns), the
// forced tool call's header and the messages of earlier tool calls. The routes read these values from
// the request's JSON. Spec: shared/spec/harmony.md §3-§6.
// Tests: tests/server/test_chat_request.cpp, tests/frontend/test_chat_output.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harmony/message.h"

namespace osprey::tok {
class Tokenizer;
}

namespace osprey::frontend {

struct PromptSpec {
    std::vector<std::string> instructions;  // client system + developer texts, in order
    std::vector<harmony::ToolDescription> tools;  // function tools to render (after tool_choice)
    harmony::ReasoningEffort effort = harmony::ReasoningEffort::medium;
    std::vector<harmony::Message> turns;  // user / assistant / tool messages
};

// System message (default identity, effort, today's date, the three channels), a developer
// message when there are instructions or tools, then the turns.
harmony::Conversation build_conversation(const PromptSpec& spec);

// tool_choice "required" or a named function: the assistant's turn is made to start with a function
// call by ending the prompt with the call's header (`<|channel|>commentary to=functions.NAME
// <|constrain|>json<|message|>`, or up to `to=functions.` for "required", where the model writes the
// name). The arguments are still the model's: a call that is not JSON is reported as content, as ever.
struct ForcedCall {
    bool on = false;
    std::string name;  // empty: any of the request's functions
};

// The forced call's header tokens, appended to a prompt rendered for completion (which ends
// <|start|>assistant) and given to ChatOutput::prime.
std::vector<int32_t> forced_call_tokens(const tok::Tokenizer& tokenizer, const ForcedCall& f);

// A tool call as Harmony history: assistant, commentary, to=functions.name, <|constrain|>json.
harmony::Message tool_call_message(const std::string& name, const std::string& arguments);
// A tool's result: author functions.name, to=assistant, commentary.
harmony::Message tool_result_message(const std::string& name, const std::string& output);

}  // namespace osprey::frontend
