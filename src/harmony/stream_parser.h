// Harmony completion tokens -> messages and streaming events. A state machine (expect-start, header,
// content) compatible with openai/harmony's StreamableParser on well-formed streams, that never throws
// on any token sequence and repairs the malformed headers the model is known to emit.
// Spec: shared/spec/harmony.md §9. Tests: tests/harmony/test_stream_parser.cpp (conformance, repairs,
// fuzz), tools/harmony/differential.py (openai-harmony's StreamableParser).
//
//   StreamParser parser(tokenizer);                  // the prompt ended with <|start|>assistant
//   for (TokenId t : sampled) for (const Event& e : parser.push(t)) handle(e);
//   for (const Event& e : parser.finish()) handle(e);  // end of stream
//   parser.messages();                                 // every completed message
//
// Behaviour beyond harmony (all counted in n_repairs()):
//   - a header that reaches <|end|>/<|return|>/<|call|> or end of stream without <|message|> becomes a
//     message whose content is the header's text (harmony's non-strict recovery, for every message);
//   - tokens after a message end without <|start|> (missing <|start|>, text after <|end|>) open a
//     header as if <|start|> had been there; role defaults to assistant;
//   - a header longer than kMaxHeaderTokens is taken as content (the model forgot the header);
//   - <|start|> inside content ends the message (missing <|end|>); a doubled <|start|> is ignored;
//   - in completion mode, a name in the role position ("functions.f<|channel|>commentary json") is
//     the recipient of an assistant message; "to=x" there, too;
//   - "json" glued to a tool name ("to=functions.fjson") is split off (see StreamParserOptions);
//   - a <|constrain|> part is always the content type, extra header words are dropped, an empty
//     channel is ignored, undecodable bytes become U+FFFD, ids outside the vocabulary are skipped.
// Other special tokens inside content are kept as their literal text, as harmony does.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "harmony/message.h"
#include "harmony/special_tokens.h"

namespace osprey::tok {
class Tokenizer;
}

namespace osprey::harmony {

struct StreamParserOptions {
    // Role of the first message when the prompt already ended with "<|start|>{role}" (completion
    // mode); nullopt when the stream itself starts with <|start|> (history mode).
    std::optional<Role> first_role = Role::assistant;
    // Tool names ("functions.get_weather") used to split a glued "json" content type exactly. Empty:
    // split "json" off a recipient when the letter or digit before it cannot end a word boundary
    // ("functions.get_weatherjson" -> "functions.get_weather" + "json"; "functions.to_json" stays).
    std::vector<std::string> known_recipients;
};

enum class EndReason {
    end_token,     // <|end|>
    return_token,  // <|return|>: the turn is over
    call_token,    // <|call|>: a tool call, run the tool
    next_start,    // <|start|> arrived inside content (missing <|end|>)
    end_of_stream, // finish() with the message still open (e.g. max tokens)
    header_only,   // the header never reached <|message|> (recovered; content = header text)
};

const char* end_reason_name(EndReason r);

enum class EventKind {
    message_start,  // header parsed: `message` has author, channel, recipient, content type, no content
    content_delta,  // `text` is new content, never part of a UTF-8 character
    message_end,    // `message` is complete; `end` says how it ended
    tool_call,      // after message_end of an assistant message with a recipient: `message` is the call
};

struct Event {
    EventKind kind = EventKind::content_delta;
    size_t index = 0;  // index of the message in messages()
    std::string text;  // content_delta only
    Message message;   // all kinds but content_delta
    EndReason end = EndReason::end_token;  // message_end and tool_call
};

class StreamParser {
public:
    static constexpr size_t kMaxHeaderTokens = 128;

    // `tokenizer` must outlive the parser (only token_bytes() and vocab_size() are used).
    explicit StreamParser(const tok::Tokenizer& tokenizer, StreamParserOptions options = {});

    // Feeds tokens; returns the events they caused. Never throws on any id sequence.
    std::vector<Event> push(TokenId id);
    std::vector<Event> push(std::span<const TokenId> ids);
    void push(TokenId id, std::vector<Event>& events);
    // End of stream: closes an open message (or recovers an unfinished header).
    std::vector<Event> finish();

    const std::vector<Message>& messages() const { return messages_; }

    enum class State { expect_start, header, content };
    State state() const { return state_; }
    // The message being streamed (header known, content so far); nullopt outside content.
    const std::optional<Message>& current() const { return current_; }
    // How many malformed constructs were repaired so far (0 for a well-formed stream).
    size_t n_repairs() const { return n_repairs_; }

private:
    void start_header(bool implicit);
    void open_message(Message header, std::vector<Event>& events);
    void close_message(EndReason reason, std::vector<Event>& events);
    void recover_header(EndReason reason, std::vector<Event>& events);
    void append_content(std::string_view bytes, std::vector<Event>& events);
    Message parse_header(const std::string& text);
    std::string header_text() const;

    const tok::Tokenizer* tokenizer_;
    StreamParserOptions options_;
    std::optional<Role> pending_role_;  // first_role until the first header is parsed
    State state_ = State::expect_start;
    std::vector<TokenId> header_tokens_;  // [n_header_tokens]
    std::optional<Message> current_;
    std::string pending_bytes_;  // bytes of an unfinished UTF-8 character
    std::vector<Message> messages_;
    size_t n_repairs_ = 0;
};

// Convenience: parse a whole completion (or history with first_role = nullopt) into messages.
std::vector<Message> parse_messages(const tok::Tokenizer& tokenizer, std::span<const TokenId> ids,
                                    StreamParserOptions options = {});

}  // namespace osprey::harmony
