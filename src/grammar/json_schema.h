// JSON Schema -> grammar of the JSON texts that validate against it: the subset OpenAI's structured
// outputs accept plus what vLLM's guided decoding users send (docs/structured_output.md lists it).
// Output is JSON without free whitespace: at most one space after "," and ":" (compact JSON and
// Python's default separators both fit), none elsewhere, properties in schema order; this bounds what
// a model can emit between values. A keyword that would constrain values in a way
// the grammar cannot express is refused with an error naming the keyword and where it is ("unsupported
// JSON Schema keyword 'minimum' at #/properties/age"), never ignored.
// Tests: tests/grammar/test_json_schema.cpp, tests/server/test_structured_output.py (jsonschema oracle).
#pragma once

#include "core/json.h"
#include "grammar/grammar.h"

namespace osprey::grammar {

// Throws osprey::Error for an unsupported or malformed schema.
Grammar json_schema_grammar(const json::Value& schema);

// Any JSON object (response_format json_object).
Grammar json_object_grammar();

}  // namespace osprey::grammar
