// JSON Schema -> grammar: what validates is accepted (compact JSON), what does not is refused, and
// unsupported keywords are errors naming the keyword and where it is.
#include <gtest/gtest.h>

#include "core/check.h"
#include "grammar/json_schema.h"
#include "grammar_test_util.h"

namespace osprey::grammar {
namespace {

using test::Runner;

Runner schema(const char* text) {
    return Runner(json_schema_grammar(json::parse(text)));
}

std::string error_of(const char* text) {
    try {
        json_schema_grammar(json::parse(text));
    } catch (const Error& e) {
        return e.what();
    }
    return "no error";
}

TEST(json_schema, object_with_required_and_optional_properties) {
    Runner r = schema(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
                          "c":{"type":"boolean"}},"required":["b"]})");
    EXPECT_TRUE(r.full(R"({"b":"x"})"));
    EXPECT_TRUE(r.full(R"({"a":-12,"b":"x","c":true})"));
    EXPECT_TRUE(r.full(R"({"b":"","c":false})"));
    EXPECT_FALSE(r.full(R"({"a":1})"));         // b missing
    EXPECT_FALSE(r.full(R"({"b":"x","d":1})"));  // no additional properties
    EXPECT_FALSE(r.full(R"({"a":01,"b":"x"})"));
    EXPECT_FALSE(r.prefix(R"({"c")"));           // properties in schema order: c cannot come before b
    EXPECT_FALSE(r.prefix(R"({ )"));             // no free whitespace
    EXPECT_TRUE(r.full(R"({"a": 1, "b": "x"})"));  // one space after ':' and ',' (json.dumps' default)
    EXPECT_FALSE(r.prefix(R"({"a":  )"));
}

TEST(json_schema, strings_numbers_and_escapes) {
    Runner r = schema(R"({"type":"array","items":{"type":["string","number","null"]}})");
    EXPECT_TRUE(r.full(R"(["a\"b\\c\u00e9\n",1.5e-3,-0,null,"日本"])"));
    EXPECT_TRUE(r.full("[]"));
    EXPECT_FALSE(r.full("[\"a\nb\"]"));  // raw control character
    EXPECT_FALSE(r.full(R"(["\q"])"));
    EXPECT_FALSE(r.full("[1.]"));
    EXPECT_FALSE(r.full("[true]"));
}

TEST(json_schema, enum_const_anyof) {
    Runner r = schema(R"({"type":"object","properties":{
        "unit":{"enum":["celsius","fahrenheit",null,3]},
        "kind":{"const":{"x":[1,"y"]}},
        "v":{"anyOf":[{"type":"integer"},{"type":"object","properties":{"n":{"type":"null"}},"required":["n"]}]}},
        "required":["unit","kind","v"]})");
    EXPECT_TRUE(r.full(R"({"unit":"celsius","kind":{"x":[1,"y"]},"v":5})"));
    EXPECT_TRUE(r.full(R"({"unit":null,"kind":{"x":[1,"y"]},"v":{"n":null}})"));
    EXPECT_TRUE(r.full(R"({"unit":3,"kind":{"x":[1,"y"]},"v":0})"));
    EXPECT_FALSE(r.full(R"({"unit":"kelvin","kind":{"x":[1,"y"]},"v":5})"));
    EXPECT_FALSE(r.full(R"({"unit":"celsius","kind":{"x":[2,"y"]},"v":5})"));
}

TEST(json_schema, arrays_with_bounds_and_prefix_items) {
    Runner r = schema(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})");
    EXPECT_FALSE(r.full("[1]"));
    EXPECT_TRUE(r.full("[1,2]"));
    EXPECT_TRUE(r.full("[1,2,3]"));
    EXPECT_FALSE(r.prefix("[1,2,3,"));
    Runner t = schema(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"boolean"}],"items":false})");
    EXPECT_TRUE(t.full(R"(["a",true])"));
    EXPECT_FALSE(t.full(R"(["a",true,1])"));
    EXPECT_FALSE(t.full(R"(["a"])"));
}

TEST(json_schema, refs_and_recursion) {
    Runner r = schema(R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{
        "name":{"type":"string"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}},
        "required":["name","children"]}}})");
    EXPECT_TRUE(r.full(R"({"name":"a","children":[{"name":"b","children":[]},{"name":"c","children":[{"name":"d","children":[]}]}]})"));
    EXPECT_FALSE(r.full(R"({"name":"a","children":[{"name":"b"}]})"));
    Runner root = schema(R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["next"]})");
    EXPECT_TRUE(root.full(R"({"next":{"next":{"next":null}}})"));
}

TEST(json_schema, string_length_pattern_format) {
    Runner len = schema(R"({"type":"string","minLength":2,"maxLength":3})");
    EXPECT_FALSE(len.full(R"("a")"));
    EXPECT_TRUE(len.full(R"("ab")"));
    EXPECT_TRUE(len.full(R"("a\"b")"));  // an escape is one character
    EXPECT_FALSE(len.full(R"("abcd")"));
    Runner pat = schema(R"({"type":"string","pattern":"^[a-z]+-[0-9]{2}$"})");
    EXPECT_TRUE(pat.full(R"("abc-12")"));
    EXPECT_FALSE(pat.full(R"("abc-1")"));
    Runner quote = schema(R"({"type":"string","pattern":".*"})");
    EXPECT_FALSE(quote.prefix(R"("a"b)"));  // the pattern cannot close the string early
    Runner date = schema(R"({"type":"string","format":"date-time"})");
    EXPECT_TRUE(date.full(R"("2024-02-29T13:45:00Z")"));
    EXPECT_FALSE(date.full(R"("2024-13-01T00:00:00Z")"));
    Runner uuid = schema(R"({"type":"string","format":"uuid"})");
    EXPECT_TRUE(uuid.full(R"("123e4567-e89b-12d3-a456-426614174000")"));
}

TEST(json_schema, additional_properties_and_any) {
    Runner extra = schema(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"string"}})");
    EXPECT_TRUE(extra.full(R"({"a":1,"x":"y","z":""})"));
    EXPECT_TRUE(extra.full(R"({"x":"y"})"));
    EXPECT_TRUE(extra.full("{}"));
    EXPECT_FALSE(extra.full(R"({"x":1})"));
    Runner any = Runner(json_object_grammar());
    EXPECT_TRUE(any.full(R"({"a":[1,{"b":null}],"c":"d","e":-1.5E+3})"));
    EXPECT_FALSE(any.full("[1]"));
    EXPECT_TRUE(schema("{}").full("[true,\"x\"]"));
}

TEST(json_schema, unsupported_keywords_are_named) {
    EXPECT_NE(error_of(R"({"type":"integer","minimum":0})").find("unsupported JSON Schema keyword 'minimum' at #"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type":"object","properties":{"a":{"type":"array","uniqueItems":true}}})")
                  .find("'uniqueItems' at #/properties/a"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type":"string","format":"ipv6"})").find("unsupported string format 'ipv6'"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"$ref":"#/$defs/missing"})").find("points to nothing"), std::string::npos);
    EXPECT_NE(error_of(R"({"type":"object","properties":{},"required":["x"]})").find("'x'"), std::string::npos);
    EXPECT_NE(error_of(R"({"type":"strin"})").find("unknown type 'strin'"), std::string::npos);
    EXPECT_NE(error_of(R"({"type":"string","pattern":"(a"})").find("'pattern' at #"), std::string::npos);
}

}  // namespace
}  // namespace osprey::grammar
