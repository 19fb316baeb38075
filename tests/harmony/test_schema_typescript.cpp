// JSON Schema -> TypeScript rendering rules (shared/spec/harmony.md §5.2). Expected strings were produced
// by openai-harmony 0.0.8 (tools/harmony/differential.py covers thousands more at random).
#include <gtest/gtest.h>

#include "core/check.h"
#include "harmony/schema_typescript.h"

namespace osprey::harmony {
namespace {

std::string ts(const char* schema) { return schema_to_typescript(json::parse(schema)); }

TEST(harmony_schema, defaults_are_printed_like_serde_json) {
    EXPECT_EQ(ts(R"({"type": "object", "properties": {"a": {"type": "number", "default": 1.0},
        "b": {"type": "number", "default": 0.5}, "c": {"type": "number", "default": 1e20},
        "d": {"type": "number", "default": 1e-07}, "e": {"type": "number", "default": 1.2345678901234568e+17},
        "f": {"type": "integer", "default": -3}, "g": {"default": [1, "x\n\"y", null, true, {"k": 2.50}]},
        "h": {"type": "array"}, "i": {"type": ["integer", "null"]},
        "j": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "boolean"}}}}}})"),
              "{\na?: number, // default: 1.0\nb?: number, // default: 0.5\nc?: number, // default: 1e20\n"
              "d?: number, // default: 1e-7\ne?: number, // default: 1.2345678901234568e17\n"
              "f?: number, // default: -3\ng?: any, // default: [1,\"x\\n\\\"y\",null,true,{\"k\":2.5}]\n"
              "h?: Array<any>,\ni?: number | null,\nj?: {\n    x?: boolean,\n    }[],\n}");
}

// Issue 19: integers in [2^63, 2^64 - 1] are serde_json u64s, written as integers; beyond either end
// they are floats (expected strings from openai-harmony 0.0.8).
TEST(harmony_schema, integer_defaults_up_to_u64_max_stay_integers) {
    EXPECT_EQ(ts(R"({"type": "object", "properties": {"a": {"type": "integer", "default": 9223372036854775808},
        "b": {"type": "integer", "default": 18446744073709551615}, "c": {"type": "number", "default": 18446744073709551616},
        "d": {"type": "integer", "default": -9223372036854775809}}})"),
              "{\na?: number, // default: 9223372036854775808\nb?: number, // default: 18446744073709551615\n"
              "c?: number, // default: 1.8446744073709552e19\nd?: number, // default: -9.223372036854776e18\n}");
}

TEST(harmony_schema, top_level_one_of) {
    EXPECT_EQ(ts(R"({"oneOf": [{"type": "string", "enum": ["a"], "default": "a", "description": "first"},
        {"type": "object", "nullable": true, "properties": {"q": {"type": "string"}}}]})"),
              "\n | \"a\" // first default: \"a\"\n | {\n   q?: string,\n   } | null");
}

TEST(harmony_schema, property_one_of_deduplicates_descriptions) {
    EXPECT_EQ(ts(R"({"type": "object", "properties": {"p": {"description": "same", "oneOf": [
        {"type": "string", "description": "same"}, {"type": "integer", "description": "same", "nullable": true},
        {"type": "string", "enum": ["x", "y"], "default": "x"}], "default": "zz"}}, "required": ["p"]})"),
              "{\n// default: \"zz\"\np:\n | string\n | number | null\n | \"x\" | \"y\" // default: x\n,\n}");
}

TEST(harmony_schema, scalars) {
    EXPECT_EQ(ts(R"({"type": "string"})"), "string");
    EXPECT_EQ(ts(R"({"type": "string", "enum": [1, "b"]})"), "\"b\"");
    EXPECT_EQ(ts(R"({"type": "integer"})"), "number");
    EXPECT_EQ(ts(R"({"type": "null"})"), "any");
    EXPECT_EQ(ts(R"({})"), "any");
    EXPECT_EQ(ts(R"({"type": "array", "items": {"type": "array", "items": {"type": "number"}}})"), "number[][]");
}

TEST(harmony_schema, serde_json_float_forms) {
    EXPECT_EQ(to_serde_json(json::parse("[0.0, -0.0, 100.0, 1e15, 1e16, 0.0001, 0.00001, 1e-6, 1.5e300, 12]")),
              "[0.0,-0.0,100.0,1000000000000000.0,1e16,0.0001,0.00001,1e-6,1.5e300,12]");
    EXPECT_EQ(to_serde_json(json::parse(R"({"a\u0001": "\u007f\t"})")), "{\"a\\u0001\":\"\x7f\\t\"}");
}

void expect_invalid(const char* schema, const std::string& needle) {
    try {
        validate_schema(json::parse(schema), "parameters");
        ADD_FAILURE() << "expected an error for " << schema;
    } catch (const osprey::Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

TEST(harmony_schema, validation_names_the_bad_keyword) {
    validate_schema(json::parse(R"({"type": "object", "properties": {"a": {"type": ["string", "null"]}}})"), "p");
    expect_invalid(R"("object")", "parameters: expected a JSON object, got string");
    expect_invalid(R"({"type": 3})", "parameters.type: expected a string or an array of strings");
    expect_invalid(R"({"type": "object", "properties": []})", "parameters.properties: expected a JSON object");
    expect_invalid(R"({"type": "object", "properties": {"x": {"type": "str"}}})",
                   "parameters.properties.x.type: unknown JSON-Schema type 'str'");
    expect_invalid(R"({"required": "x"})", "parameters.required: expected a JSON array");
    expect_invalid(R"({"required": [1]})", "parameters.required[0]: expected a JSON string");
    expect_invalid(R"({"oneOf": [{"type": "string"}, 5]})", "parameters.oneOf[1]: expected a JSON object");
    expect_invalid(R"({"type": "array", "items": {"description": 1}})", "parameters.items.description");
    expect_invalid(R"({"nullable": "yes"})", "parameters.nullable: expected a JSON boolean");
}

}  // namespace
}  // namespace osprey::harmony
