// Structured output for the routes: what a request asks for (OutputFormat: response_format,
// text.format, vLLM's guided_* / structured_outputs, strict tools, a forced tool call), compiled to
// grammars (src/grammar) and wrapped in an engine::TokenConstraint that knows Harmony:
//  - chat and responses: the analysis channel and every header are free text; the constraint starts
//    at the <|message|> of a final message (response_format) or of a call to a function whose
//    arguments are constrained (strict: true, or forced by tool_choice), and allows the message's
//    end (<|return|> / <|call|>) only once the grammar accepts what was written;
//  - tool_choice "required": the prompt ends with `to=functions.` and the constraint restricts the
//    name to the declared functions, then the header's end, then the arguments;
//  - /v1/completions: raw text, constrained from the first token, ended by the request's end tokens.
// Compiled grammars and their per-state masks are cached across requests (keyed by the constraint's
// canonical text), so a schema used again costs no compilation and few cold masks.
// Tests: tests/frontend/test_constraint.cpp, tests/server/test_structured_output.py.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/json.h"
#include "engine/token_constraint.h"
#include "frontend/harmony_prompt.h"
#include "grammar/token_mask.h"
#include "harmony/message.h"

namespace osprey::tok {
class Tokenizer;
}

namespace osprey::frontend {

// One constrained output, as a request states it.
struct OutputFormat {
    enum class Kind { none, json_object, json_schema, regex, grammar, choice };
    Kind kind = Kind::none;
    json::Value schema;                // json_schema
    std::string text;                  // regex, grammar (GBNF)
    std::vector<std::string> choices;  // choice: one of these strings, exactly
    std::string param;                 // the request field it came from, for errors
    bool on() const { return kind != Kind::none; }
};

// A compiled grammar with its automaton and mask cache, shareable between requests and samples
// (every use takes its lock).
struct SharedMasker;

// Compiles a format (cached). Throws ApiError(400) naming format.param and the problem ("unsupported
// JSON Schema keyword 'minimum' at #/properties/age").
std::shared_ptr<SharedMasker> compile_format(const tok::Tokenizer& tokenizer, const OutputFormat& format);

// Everything that constrains one Harmony turn.
struct HarmonyConstraintSpec {
    OutputFormat final_format;                     // the final channel's content
    std::vector<harmony::ToolDescription> tools;   // the request's function tools (after tool_choice)
    ForcedCall forced;                             // the prompt ends with the forced call's header
    std::string tools_param = "tools";             // names the tools in errors
};

// Null when nothing is constrained (the request then pays nothing). Throws ApiError(400) for an
// unsupported schema (a strict tool's parameters, the response format).
std::shared_ptr<const engine::TokenConstraint> make_harmony_constraint(const tok::Tokenizer& tokenizer,
                                                                       const HarmonyConstraintSpec& spec);

// /v1/completions: `format` from the first generated token; `end_tokens` (non-empty) end the text and
// are allowed only once the grammar accepts. Null when the format is none.
std::shared_ptr<const engine::TokenConstraint> make_raw_constraint(const tok::Tokenizer& tokenizer,
                                                                   const OutputFormat& format,
                                                                   std::vector<int32_t> end_tokens);

// The tokenizer's vocabulary as a trie (special tokens left out), built once per tokenizer.
std::shared_ptr<const grammar::VocabTrie> vocab_trie(const tok::Tokenizer& tokenizer);

}  // namespace osprey::frontend
