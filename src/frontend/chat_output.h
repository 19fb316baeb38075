// The Harmony front end's output side: one sample's generated tokens -> the chat API's deltas,
// through harmony::StreamParser (which never throws, whatever the model emits). The analysis channel
// becomes reasoning, final (and commentary without a recipient: preambles) becomes content, and an
// assistant message to functions.<name> becomes a tool call. A call is reported twice over: as
// streaming pieces (ChatDelta::call_deltas: the first names the call, the next ones carry the
// arguments while the text so far is still a viable JSON prefix, see json_prefix.h, trailing
// whitespace held back) and, when the call message ends with arguments that parse as JSON, as one
// complete ToolCall (ChatDelta::tool_calls) whose arguments equal the concatenated pieces. A call
// whose arguments end up not JSON (malformed, or cut by the length limit) is never completed: its
// pieces stop at the last viable prefix, and its whole text is reported as content, as in the
// non-streaming answer. Stop strings apply to the content.
// Tests: tests/frontend/test_chat_output.cpp (scripted token sequences).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/request.h"
#include "harmony/stream_parser.h"
#include "frontend/json_prefix.h"
#include "frontend/stop_strings.h"

namespace osprey::tok {
class Tokenizer;
}

namespace osprey::frontend {

struct ToolCall {
    std::string id;         // "call_<random>"
    std::string name;       // function name, without "functions."
    std::string arguments;  // JSON text
};

// One streaming piece of a tool call (OpenAI's delta.tool_calls[i]).
struct ToolCallDelta {
    int index = 0;          // the call's position among this sample's calls
    std::string id;         // the call's first piece only (with name; arguments "")
    std::string name;
    std::string arguments;  // the next piece of the arguments
};

struct ChatDelta {
    std::string reasoning;
    std::string content;
    std::vector<ToolCall> tool_calls;         // complete calls (arguments are JSON)
    std::vector<ToolCallDelta> call_deltas;   // the same calls, streamed in pieces
    bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty() && call_deltas.empty(); }
    void append(ChatDelta&& later);  // `later`'s text and calls after this delta's
};

struct ChatOutputOptions {
    std::vector<std::string> tool_names;  // the request's function tools (help the parser split "json")
    bool tools_enabled = true;            // false: calls are reported as content
    std::vector<std::string> stop;        // stop strings
    bool include_stop = false;            // a matched stop string stays in the content
};

class ChatOutput {
public:
    ChatOutput(const tok::Tokenizer& tokenizer, ChatOutputOptions options);

    // A generated token (ignored once stopped()).
    ChatDelta push(int32_t token);
    // Tokens the prompt supplied as the start of the assistant's turn (a forced call's header): parsed
    // like generated ones; what they produce (a call's first piece) comes out with the next push() or
    // finish(), before that token's own delta.
    void prime(std::span<const int32_t> tokens);
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
    void stream_arguments(ChatDelta& d);
    void end_call(const harmony::Message& m, ChatDelta& d);

    ChatOutputOptions options_;
    harmony::StreamParser parser_;
    StopStrings stops_;
    ChatDelta primed_;                // prime()'s delta, not yet returned
    Kind kind_ = Kind::none;          // of the message being generated
    std::string streamed_;            // content streamed for the current message
    std::string reasoning_, content_;
    std::vector<ToolCall> tool_calls_;
    // The tool call being streamed (Kind::tool_call message).
    struct OpenCall {
        bool open = false;
        int index = 0;
        std::string id;
        JsonPrefix prefix;
        bool viable = true;  // streamed_ is still a viable JSON prefix
        size_t sent = 0;     // bytes of streamed_ sent as argument pieces
    };
    OpenCall call_;
    int n_calls_started_ = 0;
    bool call_cut_ = false;  // a call ended without valid arguments
    int n_reasoning_tokens_ = 0;
    bool finished_ = false;
};

std::string new_call_id();  // "call_" + 24 random alphanumerics

}  // namespace osprey::frontend
