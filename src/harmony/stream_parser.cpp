// Harmony streaming parser: a three-state machine over token ids (shared/spec/harmony.md §9).
#include "harmony/stream_parser.h"

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace osprey::harmony {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Where the first UTF-8 problem in `s` is: bytes [0, valid) are valid; then either an invalid
// sequence of `error_len` bytes (the maximal subpart, as Rust's Utf8Error) or, with error_len == 0,
// an unfinished character at the end (or nothing when valid == s.size()).
struct Utf8Scan {
    size_t valid = 0;
    size_t error_len = 0;
};

Utf8Scan scan_utf8(std::string_view s) {
    size_t i = 0;
    const size_t n = s.size();
    auto byte = [&](size_t k) { return uint8_t(s[k]); };
    while (i < n) {
        const uint8_t b = byte(i);
        if (b < 0x80) {
            ++i;
            continue;
        }
        size_t need = 0;
        uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
        if (b >= 0xC2 && b <= 0xDF) {
            need = 1;
        } else if (b >= 0xE0 && b <= 0xEF) {
            need = 2;
            if (b == 0xE0) lo = 0xA0;
            if (b == 0xED) hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 3;
            if (b == 0xF0) lo = 0x90;
            if (b == 0xF4) hi = 0x8F;
        } else {
            return {i, 1};
        }
        for (size_t k = 1; k <= need; ++k) {
            if (i + k >= n) return {i, 0};  // unfinished: wait for more bytes
            const uint8_t c = byte(i + k);
            const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
            if (!ok) return {i, k};
        }
        i += need + 1;
    }
    return {n, 0};
}

// Decodes as much of `pending` as is complete, replacing invalid sequences by U+FFFD; an unfinished
// character stays in `pending` unless `flush`.
std::string drain_utf8(std::string& pending, bool flush) {
    std::string out;
    std::string_view rest(pending);
    for (;;) {
        const Utf8Scan scan = scan_utf8(rest);
        out.append(rest.substr(0, scan.valid));
        rest.remove_prefix(scan.valid);
        if (rest.empty()) break;
        if (scan.error_len > 0) {
            out += kReplacement;
            rest.remove_prefix(scan.error_len);
            continue;
        }
        if (flush) {  // an unfinished character at the end is one maximal subpart
            out += kReplacement;
            rest = {};
        }
        break;
    }
    pending = std::string(rest);
    return out;
}

std::string lossy_utf8(std::string bytes) { return drain_utf8(bytes, true); }

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'; }

// Length of the Unicode White_Space character at s[i], 0 if none (Rust's char::is_whitespace).
size_t whitespace_length(std::string_view s, size_t i) {
    const auto b = uint8_t(s[i]);
    if (b == ' ' || (b >= 0x09 && b <= 0x0D)) return 1;
    if (b < 0x80) return 0;
    const std::string_view t = s.substr(i);
    for (std::string_view ws : {"\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\xA8", "\xE2\x80\xA9", "\xE2\x80\xAF",
                                "\xE2\x81\x9F", "\xE3\x80\x80"})
        if (t.starts_with(ws)) return ws.size();
    if (t.size() >= 3 && uint8_t(t[0]) == 0xE2 && uint8_t(t[1]) == 0x80 && uint8_t(t[2]) >= 0x80 &&
        uint8_t(t[2]) <= 0x8A)
        return 3;  // U+2000..U+200A
    return 0;
}

// Rust's str::trim (Unicode White_Space on both ends).
std::string_view trim(std::string_view s) {
    for (;;) {
        if (s.empty()) return s;
        const size_t n = whitespace_length(s, 0);
        if (n == 0) break;
        s.remove_prefix(n);
    }
    for (;;) {
        bool trimmed = false;
        for (size_t len = 1; len <= 3 && len <= s.size(); ++len) {
            if (whitespace_length(s, s.size() - len) == len) {
                s.remove_suffix(len);
                trimmed = true;
                break;
            }
        }
        if (!trimmed) return s;
    }
}

std::vector<std::string> split_ascii_whitespace(std::string_view s) {
    std::vector<std::string> parts;
    size_t i = 0;
    while (i < s.size()) {
        while (i < s.size() && is_ascii_space(s[i])) ++i;
        const size_t start = i;
        while (i < s.size() && !is_ascii_space(s[i])) ++i;
        if (i > start) parts.emplace_back(s.substr(start, i - start));
    }
    return parts;
}

// Cuts every "<|channel|>value" out of `text`; the first non-empty value is the channel (value ends
// at whitespace or '<'). Returns false when a marker had no value or there was more than one.
bool extract_channel(std::string& text, std::optional<std::string>& channel) {
    bool clean = true;
    size_t at;
    while ((at = text.find(kChannelText)) != std::string::npos) {
        size_t end = at + kChannelText.size();
        while (end < text.size() && text[end] != '<' && whitespace_length(text, end) == 0) ++end;
        const std::string value = text.substr(at + kChannelText.size(), end - at - kChannelText.size());
        if (value.empty() || channel) clean = false;
        if (!value.empty() && !channel) channel = value;
        text.erase(at, end - at);
    }
    return clean;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

bool is_word_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

}  // namespace

const char* end_reason_name(EndReason r) {
    switch (r) {
        case EndReason::end_token: return "end";
        case EndReason::return_token: return "return";
        case EndReason::call_token: return "call";
        case EndReason::next_start: return "next_start";
        case EndReason::end_of_stream: return "end_of_stream";
        case EndReason::header_only: return "header_only";
    }
    return "?";
}

StreamParser::StreamParser(const tok::Tokenizer& tokenizer, StreamParserOptions options)
    : tokenizer_(&tokenizer), options_(std::move(options)), pending_role_(options_.first_role) {
    if (pending_role_) start_header(false);
}

void StreamParser::start_header(bool implicit) {
    state_ = State::header;
    header_tokens_.clear();
    if (implicit) ++n_repairs_;
}

std::string StreamParser::header_text() const {
    std::string bytes;
    for (TokenId t : header_tokens_) bytes += tokenizer_->token_bytes(t);
    return lossy_utf8(std::move(bytes));
}

std::vector<Event> StreamParser::push(TokenId id) {
    std::vector<Event> events;
    push(id, events);
    return events;
}

std::vector<Event> StreamParser::push(std::span<const TokenId> ids) {
    std::vector<Event> events;
    for (TokenId id : ids) push(id, events);
    return events;
}

void StreamParser::push(TokenId id, std::vector<Event>& events) {
    if (id < 0 || id >= tokenizer_->vocab_size()) {
        ++n_repairs_;  // not a token of this vocabulary: U+FFFD in content (as harmony), else skipped
        if (state_ == State::content) append_content(kReplacement, events);
        return;
    }
    switch (state_) {
        case State::expect_start:
            if (id == kStart) {
                start_header(false);
            } else if (is_message_end(id)) {
                ++n_repairs_;  // a stray end token between messages
            } else {
                start_header(true);  // missing <|start|>: this token begins a header
                push(id, events);
            }
            return;
        case State::header:
            if (id == kMessage) {
                open_message(parse_header(header_text()), events);
            } else if (id == kStart) {
                if (header_tokens_.empty()) {
                    ++n_repairs_;  // doubled <|start|>
                } else {
                    recover_header(EndReason::header_only, events);
                    start_header(false);
                }
            } else if (is_message_end(id)) {
                if (header_tokens_.empty()) ++n_repairs_;  // "<|start|><|end|>": nothing to keep
                else recover_header(EndReason::header_only, events);
                pending_role_.reset();
                state_ = State::expect_start;
            } else {
                header_tokens_.push_back(id);
                if (header_tokens_.size() > kMaxHeaderTokens) {
                    // No header is this long: the model is writing content without one.
                    ++n_repairs_;
                    std::string text = header_text();
                    Message m;
                    m.author.role = pending_role_.value_or(Role::assistant);
                    extract_channel(text, m.channel);
                    pending_role_.reset();
                    header_tokens_.clear();
                    open_message(std::move(m), events);
                    append_content(text, events);
                }
            }
            return;
        case State::content:
            if (id == kEnd) close_message(EndReason::end_token, events);
            else if (id == kReturn) close_message(EndReason::return_token, events);
            else if (id == kCall) close_message(EndReason::call_token, events);
            else if (id == kStart) {
                ++n_repairs_;
                close_message(EndReason::next_start, events);
                start_header(false);
            } else {
                append_content(tokenizer_->token_bytes(id), events);
            }
            return;
    }
}

std::vector<Event> StreamParser::finish() {
    std::vector<Event> events;
    if (state_ == State::content) {
        close_message(EndReason::end_of_stream, events);
    } else if (state_ == State::header) {
        if (!header_tokens_.empty()) recover_header(EndReason::end_of_stream, events);
        state_ = State::expect_start;
    }
    return events;
}

void StreamParser::open_message(Message header, std::vector<Event>& events) {
    pending_role_.reset();
    current_ = std::move(header);
    pending_bytes_.clear();
    state_ = State::content;
    Event e;
    e.kind = EventKind::message_start;
    e.index = messages_.size();
    e.message = *current_;
    events.push_back(std::move(e));
}

void StreamParser::append_content(std::string_view bytes, std::vector<Event>& events) {
    pending_bytes_ += bytes;
    std::string text = drain_utf8(pending_bytes_, false);
    if (text.empty()) return;
    auto& parts = current_->content;
    if (parts.empty()) parts.emplace_back(TextContent{});
    std::get<TextContent>(parts.front()).text += text;
    Event e;
    e.kind = EventKind::content_delta;
    e.index = messages_.size();
    e.text = std::move(text);
    events.push_back(std::move(e));
}

void StreamParser::close_message(EndReason reason, std::vector<Event>& events) {
    if (!pending_bytes_.empty()) {
        std::string tail = drain_utf8(pending_bytes_, true);
        auto& parts = current_->content;
        if (parts.empty()) parts.emplace_back(TextContent{});
        std::get<TextContent>(parts.front()).text += tail;
        Event d;
        d.kind = EventKind::content_delta;
        d.index = messages_.size();
        d.text = std::move(tail);
        events.push_back(std::move(d));
    }
    if (current_->content.empty()) current_->content.emplace_back(TextContent{});
    const size_t index = messages_.size();
    messages_.push_back(std::move(*current_));
    current_.reset();
    state_ = State::expect_start;
    const Message& m = messages_.back();
    Event e;
    e.kind = EventKind::message_end;
    e.index = index;
    e.message = m;
    e.end = reason;
    events.push_back(e);
    if (m.author.role == Role::assistant && m.recipient && *m.recipient != "all") {
        e.kind = EventKind::tool_call;
        events.push_back(std::move(e));
    }
}

// A header that never reached <|message|>: the message is its channel plus its remaining text as
// content (harmony's non-strict recovery; the text keeps its spacing).
void StreamParser::recover_header(EndReason reason, std::vector<Event>& events) {
    ++n_repairs_;
    std::string text = header_text();
    Message m;
    extract_channel(text, m.channel);
    std::string_view rest = trim(text);
    std::optional<Role> role = pending_role_;
    const size_t word_end = std::min(rest.find_first_of(" \t\n\r\f"), rest.size());
    const std::optional<Role> first_word_role = parse_role(rest.substr(0, word_end));
    if (first_word_role && (!role || *role == *first_word_role)) {
        role = first_word_role;
        rest = trim(rest.substr(word_end));
    }
    m.author.role = role.value_or(Role::assistant);
    header_tokens_.clear();
    open_message(std::move(m), events);
    append_content(rest, events);
    close_message(reason, events);
}

Message StreamParser::parse_header(const std::string& raw) {
    Message m;
    std::string text = raw;
    if (!extract_channel(text, m.channel)) ++n_repairs_;
    // "to=x<|constrain|>json": the marker starts a new word.
    std::string spaced;
    std::string_view rest = trim(text);
    for (size_t at; (at = rest.find(kConstrainText)) != std::string_view::npos;) {
        spaced.append(rest.substr(0, at)).append(" ").append(kConstrainText);
        rest.remove_prefix(at + kConstrainText.size());
    }
    spaced.append(rest);
    std::vector<std::string> parts = split_ascii_whitespace(spaced);

    // Role.
    std::optional<std::string> recipient;
    if (pending_role_) {
        m.author.role = *pending_role_;
        if (!parts.empty() && parts.front() == role_name(m.author.role)) parts.erase(parts.begin());
    } else if (parts.empty()) {
        m.author.role = Role::assistant;  // "<|start|><|message|>" or a bare <|message|>
        ++n_repairs_;
    } else if (const std::optional<Role> r = parse_role(parts.front())) {
        m.author.role = *r;
        parts.erase(parts.begin());
    } else {
        const std::string first = parts.front();
        parts.erase(parts.begin());
        const bool other_to = std::any_of(parts.begin(), parts.end(), [](const std::string& p) {
            return starts_with(p, "to=");
        });
        if (starts_with(first, "to=")) {
            m.author.role = Role::assistant;  // the role was left out
            recipient = first.substr(3);
            ++n_repairs_;
        } else if (options_.first_role && !other_to) {
            m.author.role = Role::assistant;  // a recipient in the role position
            recipient = first;
            ++n_repairs_;
        } else {
            m.author = Author{Role::tool, first};  // a tool's output: "functions.f to=assistant"
        }
    }

    // Recipient and content type (harmony's rules for one or two words; repairs beyond that).
    std::vector<std::string> to_parts, other;
    for (std::string& p : parts) (starts_with(p, "to=") ? to_parts : other).push_back(std::move(p));
    if (!recipient && !to_parts.empty()) recipient = to_parts.front().substr(3);
    size_t used = std::min<size_t>(to_parts.size(), recipient ? 1 : 0);
    if (!other.empty()) {
        if (!recipient && other.size() >= 2) {
            recipient = other.front();
            m.content_type = other.back();
            used += 2;
        } else if (!recipient && !starts_with(other.front(), kConstrainText)) {
            recipient = other.front();
            used += 1;
        } else {
            m.content_type = other.back();
            used += 1;
        }
    }
    if (used < to_parts.size() + other.size()) ++n_repairs_;

    // "json" glued to the tool name.
    if (recipient && !m.content_type && recipient->size() > 4 && recipient->ends_with("json")) {
        const std::string stem = recipient->substr(0, recipient->size() - 4);
        const auto& known = options_.known_recipients;
        const bool split = known.empty()
                               ? is_word_char(stem.back()) && stem.find('.') != std::string::npos
                               : std::find(known.begin(), known.end(), *recipient) == known.end() &&
                                     std::find(known.begin(), known.end(), stem) != known.end();
        if (split) {
            recipient = stem;
            m.content_type = "json";
            ++n_repairs_;
        }
    }
    m.recipient = std::move(recipient);
    return m;
}

std::vector<Message> parse_messages(const tok::Tokenizer& tokenizer, std::span<const TokenId> ids,
                                    StreamParserOptions options) {
    StreamParser parser(tokenizer, std::move(options));
    parser.push(ids);
    parser.finish();
    return parser.messages();
}

}  // namespace osprey::harmony
