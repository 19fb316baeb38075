// Generated Harmony tokens -> chat deltas (see chat_output.h).
#include "frontend/chat_output.h"

#include <algorithm>
#include <random>
#include <utility>

#include "core/json.h"
#include "harmony/special_tokens.h"

namespace osprey::frontend {

using harmony::EventKind;

std::string new_call_id() {
    static thread_local std::mt19937_64 rng(std::random_device{}());
    static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof kAlphabet - 1)];
    return id;
}

namespace {

harmony::StreamParserOptions parser_options(const ChatOutputOptions& o) {
    harmony::StreamParserOptions p;
    for (const auto& name : o.tool_names) p.known_recipients.push_back("functions." + name);
    return p;
}

bool is_json(const std::string& text) {
    try {
        json::parse(text);
        return true;
    } catch (const std::exception&) {
        return false;
    }
}

}  // namespace

ChatOutput::ChatOutput(const tok::Tokenizer& tokenizer, ChatOutputOptions options)
    : options_(std::move(options)), parser_(tokenizer, parser_options(options_)), stops_(options_.stop, options_.include_stop) {}

ChatOutput::Kind ChatOutput::classify(const harmony::Message& m) const {
    const std::string recipient = m.recipient.value_or("");
    if (!recipient.empty() && recipient != "all" && recipient != "user") {
        if (recipient.rfind("functions.", 0) == 0 && recipient.size() > 10) {
            // Only a declared function is a tool call: a call to anything else (or with no tools)
            // is reported as content (its arguments text), since no client could run it.
            const std::string name = recipient.substr(10);
            const bool declared = std::find(options_.tool_names.begin(), options_.tool_names.end(), name) !=
                                  options_.tool_names.end();
            return options_.tools_enabled && declared ? Kind::tool_call : Kind::content;
        }
        return Kind::reasoning;  // built-in tools (browser, python): internal to the model
    }
    if (m.channel && *m.channel == "analysis") return Kind::reasoning;
    return Kind::content;  // final, commentary preambles, or no channel
}

void ChatOutput::handle(const harmony::Event& e, ChatDelta& d) {
    switch (e.kind) {
        case EventKind::message_start:
            kind_ = classify(e.message);
            streamed_.clear();
            if (kind_ == Kind::tool_call) {
                call_ = OpenCall();
                call_.open = true;
                call_.index = n_calls_started_++;
                call_.id = new_call_id();
                d.call_deltas.push_back({call_.index, call_.id, e.message.recipient->substr(10), ""});
            }
            break;
        case EventKind::content_delta:
            streamed_ += e.text;
            if (kind_ == Kind::tool_call && call_.open) {
                if (call_.viable) call_.viable = call_.prefix.push(e.text) == e.text.size();
                stream_arguments(d);
            } else if (kind_ == Kind::reasoning) {
                d.reasoning += e.text;
                reasoning_ += e.text;
            } else if (kind_ == Kind::content) {
                const std::string shown = stops_.push(e.text);
                d.content += shown;
                content_ += shown;
            }
            break;
        case EventKind::message_end: {
            const Kind kind = classify(e.message);
            const std::string full = e.message.text();
            // A recovered header-only message arrives without deltas: report its text now.
            std::string rest = full.size() > streamed_.size() && full.compare(0, streamed_.size(), streamed_) == 0
                                   ? full.substr(streamed_.size())
                                   : std::string();
            if (kind == Kind::tool_call) {
                end_call(e.message, d);
            } else if (!rest.empty() && kind == Kind::reasoning) {
                d.reasoning += rest;
                reasoning_ += rest;
            } else if (!rest.empty() && kind == Kind::content) {
                const std::string shown = stops_.push(rest);
                d.content += shown;
                content_ += shown;
            }
            streamed_.clear();
            break;
        }
        case EventKind::tool_call:
            break;  // handled at message_end (arguments checked there)
    }
}

// Sends the arguments received since the last piece, up to the last non-whitespace byte (trailing
// whitespace is trimmed from the final arguments, so it waits for what follows), while they are a
// viable JSON prefix.
void ChatOutput::stream_arguments(ChatDelta& d) {
    if (!call_.viable) return;
    const size_t last = streamed_.find_last_not_of(" \t\r\n");
    const size_t end = last == std::string::npos ? 0 : last + 1;
    if (end <= call_.sent) return;
    d.call_deltas.push_back({call_.index, "", "", streamed_.substr(call_.sent, end - call_.sent)});
    call_.sent = end;
}

// The call message ended: a complete call when its arguments are JSON (the rest of them sent as a
// last piece), else its text becomes content and the streamed call is left incomplete.
void ChatOutput::end_call(const harmony::Message& m, ChatDelta& d) {
    const std::string full = m.text();
    const std::string name = m.recipient->substr(10);
    std::string args = full;
    while (!args.empty() && std::isspace(static_cast<unsigned char>(args.back()))) args.pop_back();
    if (args.find_first_not_of(" \t\r\n") == std::string::npos) args = "{}";
    if (!is_json(args)) {
        call_cut_ = true;
        const std::string shown = stops_.push(full);
        d.content += shown;
        content_ += shown;
        call_ = OpenCall();
        return;
    }
    // The pieces sent so far must be a prefix of the arguments; otherwise (a message recovered by
    // the parser without its deltas) the call is sent whole under a new index.
    if (!call_.open || args.compare(0, call_.sent, streamed_, 0, call_.sent) != 0) {
        call_ = OpenCall();
        call_.index = n_calls_started_++;
        call_.id = new_call_id();
        d.call_deltas.push_back({call_.index, call_.id, name, ""});
    }
    if (args.size() > call_.sent) d.call_deltas.push_back({call_.index, "", "", args.substr(call_.sent)});
    ToolCall call{call_.id, name, args};
    d.tool_calls.push_back(call);
    tool_calls_.push_back(std::move(call));
    call_ = OpenCall();
}

ChatDelta ChatOutput::push(int32_t token) {
    ChatDelta d = std::exchange(primed_, {});
    if (finished_ || stopped()) return d;
    for (const harmony::Event& e : parser_.push(token)) handle(e, d);
    if (kind_ == Kind::reasoning) ++n_reasoning_tokens_;
    return d;
}

void ChatOutput::prime(std::span<const int32_t> tokens) {
    for (int32_t t : tokens) primed_.append(push(t));
}

void ChatDelta::append(ChatDelta&& later) {
    reasoning += later.reasoning;
    content += later.content;
    for (auto& c : later.tool_calls) tool_calls.push_back(std::move(c));
    for (auto& c : later.call_deltas) call_deltas.push_back(std::move(c));
}

ChatDelta ChatOutput::finish(int32_t stop_token) {
    ChatDelta d = std::exchange(primed_, {});
    if (finished_) return d;
    finished_ = true;
    if (!stopped()) {
        // Harmony's own stop tokens end the message; a client's stop_token_ids are not Harmony.
        const bool harmony_stop = std::find(std::begin(harmony::kAssistantActionStopTokens),
                                            std::end(harmony::kAssistantActionStopTokens),
                                            stop_token) != std::end(harmony::kAssistantActionStopTokens);
        if (stop_token >= 0 && harmony_stop)
            for (const harmony::Event& e : parser_.push(stop_token)) handle(e, d);
        for (const harmony::Event& e : parser_.finish()) handle(e, d);
        const std::string tail = stops_.flush();
        d.content += tail;
        content_ += tail;
    }
    return d;
}

std::string ChatOutput::finish_reason(engine::FinishReason reason) const {
    // A call cut by the length limit is not complete: the answer was cut (OpenAI says "length" too).
    if (call_cut_ && reason == engine::FinishReason::length) return "length";
    if (!tool_calls_.empty()) return "tool_calls";
    if (stopped()) return "stop";
    switch (reason) {
        case engine::FinishReason::stop: return "stop";
        case engine::FinishReason::length: return "length";
        case engine::FinishReason::abort: return "abort";
        case engine::FinishReason::error: return "error";
    }
    return "stop";
}

}  // namespace osprey::frontend
