// The Harmony formatting tokens of o200k_harmony (ids and literal strings). Spec: shared/spec/harmony.md §1.4, §7.
#pragma once

#include <cstdint>
#include <string_view>

namespace osprey::harmony {

using TokenId = int32_t;

inline constexpr TokenId kReturn = 200002;     // <|return|>: ends the final answer; stop token
inline constexpr TokenId kConstrain = 200003;  // <|constrain|>: starts a constrained content type
inline constexpr TokenId kChannel = 200005;    // <|channel|>
inline constexpr TokenId kStart = 200006;      // <|start|>
inline constexpr TokenId kEnd = 200007;        // <|end|>
inline constexpr TokenId kMessage = 200008;    // <|message|>: header/content separator
inline constexpr TokenId kCall = 200012;       // <|call|>: ends a tool call; stop token

inline constexpr std::string_view kReturnText = "<|return|>";
inline constexpr std::string_view kConstrainText = "<|constrain|>";
inline constexpr std::string_view kChannelText = "<|channel|>";
inline constexpr std::string_view kStartText = "<|start|>";
inline constexpr std::string_view kEndText = "<|end|>";
inline constexpr std::string_view kMessageText = "<|message|>";
inline constexpr std::string_view kCallText = "<|call|>";

// The literal string of one of the formatting tokens above (empty for any other id).
constexpr std::string_view formatting_token_text(TokenId id) {
    switch (id) {
        case kReturn: return kReturnText;
        case kConstrain: return kConstrainText;
        case kChannel: return kChannelText;
        case kStart: return kStartText;
        case kEnd: return kEndText;
        case kMessage: return kMessageText;
        case kCall: return kCallText;
        default: return {};
    }
}

// Stop sampling an assistant turn on these (harmony's stop_tokens_for_assistant_actions()).
inline constexpr TokenId kAssistantActionStopTokens[] = {kReturn, kCall};
// Tokens that end a message (harmony's stop_tokens()).
constexpr bool is_message_end(TokenId id) { return id == kReturn || id == kCall || id == kEnd; }

}  // namespace osprey::harmony
