// The Harmony front end's output side: one sample's generated tokens -> the chat API's deltas,
// through harmony::StreamParser (which never throws, whatever the model emits). The analysis channel
// becomes reasoning, final (and commentary without a recipient: preambles) becomes content, and an
// assistant message to functions.<name> becomes a tool call, reported when the call message ends
// with its arguments checked to be JSON (a call whose arguments are not JSON is reported as content,
// so clients never get malformed arguments). Stop strings apply to the content.
// Tests: tests/server/test_chat_output.cpp (scripted token sequences).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/request.h"
#include "harmony/stream_parser.h"
#include "server/stop_strings.h"

namespace osprey::tok {
class Tokenizer;
}

namespace osprey::server {

struct ToolCall {
    std::string id;         // "call_<random>"
    std::string name;       // function name, without "functions."
    std::string arguments;  // JSON text
};

struct ChatDelta {
    std::string reasoning;
    std::string content;
    std::vector<ToolCall> tool_calls;  // complete calls
    bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

struct ChatOutputOptions {
    std::vector<std::string> tool_names;  // the request's function tools (help the parser split "json")
    bool tools_enabled = true;            // false: calls are reported as content
    std::vector<std::string> stop;        // stop strings
};

class ChatOutput {
public:
    ChatOutput(const tok::Tokenizer& tokenizer, ChatOutputOptions options);

    // A generated token (ignored once stopped()).
    ChatDelta push(int32_t token);
    // The sample ended; `stop_token` is the engine's stop token (or -1): it is fed to the parser so a
    // call ended by <|call|> is complete.
    ChatDelta finish(int32_t stop_token);

    bool stopped() const { return stops_.matched(); }  // a stop string matched: end the sample
    // "tool_calls" when a call was reported, "stop" for a stop string or token, "length", ...
    std::string finish_reason(engine::FinishReason reason) const;
    int n_reasoning_tokens() const { return n_reasoning_tokens_; }

    // Everything reported so far.
    const std::string& reasoning() const { return reasoning_; }
    const std::string& content() const { return content_; }
    const std::vector<ToolCall>& tool_calls() const { return tool_calls_; }
    // The parsed assistant messages (for storing a conversation).
    const std::vector<harmony::Message>& messages() const { return parser_.messages(); }

private:
    enum class Kind { none, reasoning, content, tool_call };
    Kind classify(const harmony::Message& header) const;
    void handle(const harmony::Event& e, ChatDelta& d);

    ChatOutputOptions options_;
    harmony::StreamParser parser_;
    StopStrings stops_;
    Kind kind_ = Kind::none;          // of the message being generated
    std::string streamed_;            // content streamed for the current message
    std::string reasoning_, content_;
    std::vector<ToolCall> tool_calls_;
    int n_reasoning_tokens_ = 0;
    bool finished_ = false;
};

std::string new_call_id();  // "call_" + 24 random alphanumerics

}  // namespace osprey::server
