// Conversation -> Harmony prompt. Rendering first produces a sequence of pieces (ordinary text or a
// formatting token), so the exact text can be checked without a tokenizer; tokens() then encodes each
// text piece on its own with special-token strings treated as plain text, exactly as openai/harmony
// v0.0.8 does (shared/spec/harmony.md §2, §6).
// Tests: tests/harmony/test_render.cpp (conformance files), tools/harmony/differential.py (openai-harmony).
//
//   Conversation c{{Message::system(SystemContent{}), Message::user("What is 2 + 2?")}};
//   std::vector<TokenId> prompt = render_for_completion(c).tokens(tokenizer);  // ends <|start|>assistant
#pragma once

#include <string>
#include <vector>

#include "harmony/message.h"
#include "harmony/special_tokens.h"

namespace osprey::tok {
class Tokenizer;
}

namespace osprey::harmony {

// One fragment of a rendered prompt: a formatting token (special >= 0) or ordinary text.
struct Piece {
    TokenId special = -1;
    std::string text;
};

class Rendered {
public:
    std::vector<Piece> pieces;

    // The prompt as text, formatting tokens written as their literal strings ("<|start|>...").
    std::string text() const;
    // The prompt as token ids: each text piece encoded separately as ordinary text.
    std::vector<TokenId> tokens(const tok::Tokenizer& tokenizer) const;

    void add_special(TokenId id) { pieces.push_back({id, {}}); }
    void add_text(std::string s) { pieces.push_back({-1, std::move(s)}); }
};

// Which earlier chain of thought to drop. `first_final` is harmony's implemented rule (§6.3): when the
// last assistant message is on the final channel, drop every analysis message before the first
// final message. `none` keeps everything.
enum class AnalysisPolicy { first_final, none };

struct RenderOptions {
    // harmony's Python API default (auto_drop_analysis=True); the Rust API defaults to none.
    AnalysisPolicy drop_analysis = AnalysisPolicy::first_final;
};

// Every kept message, no next role. Throws osprey::Error naming the message and field when the
// conversation cannot be rendered (see validate()).
Rendered render_conversation(const Conversation& conversation, const RenderOptions& options = {});

// The prompt to sample from: the conversation then "<|start|>{next_role}".
Rendered render_for_completion(const Conversation& conversation, Role next_role = Role::assistant,
                               const RenderOptions& options = {});

// For training data: like render_conversation, but a last assistant message on the final channel
// ends with <|return|> instead of <|end|>.
Rendered render_for_training(const Conversation& conversation, const RenderOptions& options = {});

// One message, as harmony's render(message). `has_function_tools` adds the system message's
// "Calls to these tools must go to the commentary channel: 'functions'." line.
Rendered render_message(const Message& message, bool has_function_tools = false);

// Checks what the renderer and the model need (throws osprey::Error naming "messages[i].field"):
// valid UTF-8 everywhere; a tool message has a name; system/developer contents only in their own
// roles; channel, recipient, content type and tool names non-empty without whitespace; tool
// parameters are JSON-Schema objects (validate_schema).
void validate(const Conversation& conversation);

}  // namespace osprey::harmony
