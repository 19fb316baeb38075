// JSON Schema -> the TypeScript-like type text that Harmony puts in tool namespaces, byte-identical
// to openai/harmony v0.0.8 (json_schema_to_typescript). Spec: shared/spec/harmony.md §5.2.
// Tests: tests/harmony/test_schema_typescript.cpp, and the differential run in tools/harmony/.
#pragma once

#include <string>

#include "core/json.h"

namespace osprey::harmony {

// Renders `schema` with `indent` prepended to nested lines (top level: "").
std::string schema_to_typescript(const json::Value& schema, const std::string& indent = "");

// Throws osprey::Error naming `path` (e.g. "tools.functions[0].parameters.properties.city.type") when a
// keyword the renderer reads has the wrong JSON type or `type` names no JSON-Schema type. The
// renderer itself never fails; this is the check that keeps nonsense out of the prompt.
void validate_schema(const json::Value& schema, const std::string& path);

// Compact JSON exactly as serde_json prints it (used for "default: ..." comments): no spaces,
// floats in Rust's shortest form ("1.0", "0.5", "1e20"), only '"', '\\' and control characters escaped.
std::string to_serde_json(const json::Value& value);

}  // namespace osprey::harmony
