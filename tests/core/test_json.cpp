#include <gtest/gtest.h>

#include "core/check.h"
#include "core/json.h"

using osprey::json::parse;
using osprey::json::Value;

TEST(json, round_trips_nested_values_keeping_key_order) {
    const std::string text = R"({"b":1,"a":[true,false,null,-2.5,"x\n\u00e9"],"c":{"z":{},"y":[]}})";
    const Value v = parse(text);
    EXPECT_EQ(v.dump(), text.substr(0, text.find("\\u00e9")) + "\xc3\xa9" + R"("],"c":{"z":{},"y":[]}})");
    EXPECT_EQ(v.as_object()[0].first, "b");
    EXPECT_EQ(v.at("a").as_array()[3].as_double(), -2.5);
}

TEST(json, integers_stay_exact) {
    const Value v = parse("[9007199254740993, -0, 1e2, 123456789012]");
    EXPECT_EQ(v.as_array()[0].as_int(), 9007199254740993LL);
    EXPECT_EQ(v.as_array()[3].as_int(), 123456789012LL);
    EXPECT_EQ(v.as_array()[2].as_double(), 100.0);
}

TEST(json, surrogate_pairs_decode_to_utf8) {
    EXPECT_EQ(parse(R"("\ud83d\ude00")").as_string(), "\xf0\x9f\x98\x80");
    EXPECT_THROW(parse(R"("\ud83d")"), osprey::Error);
    EXPECT_THROW(parse(R"("\ude00")"), osprey::Error);
}

TEST(json, errors_name_line_and_column) {
    try {
        parse("{\n  \"a\": tru\n}");
        FAIL() << "expected an error";
    } catch (const osprey::Error& e) {
        EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    }
}

TEST(json, rejects_malformed_documents) {
    for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "01", "1.", "-", "\"\x01\"", "nul", "[1] x",
                            "\"\xff\"", "\"\xc0\x80\"", "{\"a\":1,}", "\"\\x\"", "1e", "+1"}) {
        EXPECT_THROW(parse(bad), osprey::Error) << bad;
    }
}

TEST(json, depth_limit_stops_deep_nesting) {
    const std::string deep(100000, '[');
    EXPECT_THROW(parse(deep), osprey::Error);
}

TEST(json, typed_access_names_the_actual_type) {
    const Value v = parse(R"({"n": "x"})");
    try {
        v.at("n").as_int();
        FAIL();
    } catch (const osprey::Error& e) {
        EXPECT_NE(std::string(e.what()).find("got string"), std::string::npos) << e.what();
    }
    EXPECT_THROW(v.at("missing"), osprey::Error);
}

TEST(json, quoting_escapes_controls_and_replaces_invalid_utf8) {
    EXPECT_EQ(osprey::json::quote("a\"b\\\x01"), "\"a\\\"b\\\\\\u0001\"");
    EXPECT_EQ(osprey::json::quote("\xff"), "\"\xef\xbf\xbd\"");
    EXPECT_EQ(osprey::json::quote("\xf0\x9f\x98\x80", true), "\"\\ud83d\\ude00\"");
}

TEST(json, build_and_indent) {
    Value v;
    v.set("name", "osprey");
    v.set("n", 3);
    v.at("n");
    Value arr;
    arr.push_back(1.5);
    v.set("list", arr);
    EXPECT_EQ(v.dump(), R"({"name":"osprey","n":3,"list":[1.5]})");
    EXPECT_EQ(v.dump(2), "{\n  \"name\": \"osprey\",\n  \"n\": 3,\n  \"list\": [\n    1.5\n  ]\n}");
}
