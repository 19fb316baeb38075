// Generated Harmony tokens -> chat deltas (see chat_output.h).
#include "server/chat_output.h"

#include <random>

#include "core/json.h"
#include "harmony/special_tokens.h"

namespace osprey::server {

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
    : options_(std::move(options)), parser_(tokenizer, parser_options(options_)), stops_(options_.stop) {}

ChatOutput::Kind ChatOutput::classify(const harmony::Message& m) const {
    const std::string recipient = m.recipient.value_or("");
    if (!recipient.empty() && recipient != "all" && recipient != "user") {
        if (recipient.rfind("functions.", 0) == 0 && recipient.size() > 10)
            return options_.tools_enabled ? Kind::tool_call : Kind::content;
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
            break;
        case EventKind::content_delta:
            streamed_ += e.text;
            if (kind_ == Kind::reasoning) {
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
            streamed_.clear();
            if (kind == Kind::tool_call) {
                std::string args = full;
                while (!args.empty() && std::isspace(static_cast<unsigned char>(args.back()))) args.pop_back();
                if (args.find_first_not_of(" \t\r\n") == std::string::npos) args = "{}";
                if (is_json(args)) {
                    ToolCall call{new_call_id(), e.message.recipient->substr(10), args};
                    d.tool_calls.push_back(call);
                    tool_calls_.push_back(std::move(call));
                } else {
                    const std::string shown = stops_.push(full);
                    d.content += shown;
                    content_ += shown;
                }
            } else if (!rest.empty() && kind == Kind::reasoning) {
                d.reasoning += rest;
                reasoning_ += rest;
            } else if (!rest.empty() && kind == Kind::content) {
                const std::string shown = stops_.push(rest);
                d.content += shown;
                content_ += shown;
            }
            break;
        }
        case EventKind::tool_call:
            break;  // handled at message_end (arguments checked there)
    }
}

ChatDelta ChatOutput::push(int32_t token) {
    ChatDelta d;
    if (finished_ || stopped()) return d;
    for (const harmony::Event& e : parser_.push(token)) handle(e, d);
    if (kind_ == Kind::reasoning) ++n_reasoning_tokens_;
    return d;
}

ChatDelta ChatOutput::finish(int32_t stop_token) {
    ChatDelta d;
    if (finished_) return d;
    finished_ = true;
    if (!stopped()) {
        if (stop_token >= 0)
            for (const harmony::Event& e : parser_.push(stop_token)) handle(e, d);
        for (const harmony::Event& e : parser_.finish()) handle(e, d);
        const std::string tail = stops_.flush();
        d.content += tail;
        content_ += tail;
    }
    return d;
}

std::string ChatOutput::finish_reason(engine::FinishReason reason) const {
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

}  // namespace osprey::server
