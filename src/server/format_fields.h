// Structured-output members of a request -> frontend::OutputFormat: chat's and completions'
// response_format ({"type": "text" | "json_object" | "json_schema", "json_schema": {...}}), the
// responses API's text.format ({"type": "json_schema", "name", "schema", "strict"}), and vLLM's
// extras guided_json / guided_regex / guided_choice / guided_grammar and structured_outputs
// ({"json" | "regex" | "choice" | "grammar"}). At most one may constrain a request. Wrong shapes
// throw ApiError naming the field; schema features are checked when compiled (frontend/constraint.h).
// Tests: tests/server/test_chat_request.cpp, tests/server/test_structured_output.py.
#pragma once

#include "frontend/constraint.h"
#include "server/json_fields.h"

namespace osprey::server {

// response_format and the vLLM extras of a chat or completions request (marking them used).
frontend::OutputFormat parse_output_format(Fields& f);

// The responses API's text.format object at `path`.
frontend::OutputFormat parse_text_format(const json::Value& format, const std::string& path);

}  // namespace osprey::server
