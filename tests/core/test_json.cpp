// core/json: the parser every untrusted request body goes through (RFC 8259 grammar, strict UTF-8,
// depth limit, exact integers), the serializer, and the ordered Value type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "core/json.h"
#include "core/utf8.h"

namespace osprey::json {
namespace {

// The parser's error message for `text`, or "" when it parses.
std::string parse_error(std::string_view text, const ParseOptions& options = {}) {
    try {
        parse(text, options);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

bool parses(std::string_view text, const ParseOptions& options = {}) {
    return parse_error(text, options).empty();
}

std::string nested(int levels, std::string_view open, std::string_view inner, std::string_view close) {
    std::string s;
    for (int i = 0; i < levels; ++i) s += open;
    s += inner;
    for (int i = 0; i < levels; ++i) s += close;
    return s;
}

// ---- the grammar, production by production ----

TEST(json, literals) {
    EXPECT_TRUE(parse("null").is_null());
    EXPECT_EQ(parse("true").as_bool(), true);
    EXPECT_EQ(parse("false").as_bool(), false);
    for (const char* bad : {"nul", "tru", "fals", "True", "FALSE", "Null", "nulll", "t", "nan", "NaN", "Infinity",
                            "-Infinity", "undefined", "None"}) {
        EXPECT_FALSE(parses(bad)) << bad;
    }
}

TEST(json, arrays) {
    EXPECT_EQ(parse("[]").size(), 0u);
    EXPECT_TRUE(parse("[]").is_array());
    const Value v = parse("[1,\"a\",null,true,[],{}]");
    ASSERT_EQ(v.size(), 6u);
    EXPECT_EQ(v.as_array()[0].as_int(), 1);
    EXPECT_EQ(v.as_array()[1].as_string(), "a");
    EXPECT_TRUE(v.as_array()[2].is_null());
    EXPECT_TRUE(v.as_array()[3].as_bool());
    EXPECT_TRUE(v.as_array()[4].is_array());
    EXPECT_TRUE(v.as_array()[5].is_object());
    EXPECT_EQ(parse("[[[1]],[2]]").as_array()[0].as_array()[0].as_array()[0].as_int(), 1);
    for (const char* bad : {"[", "]", "[1", "[1,", "[1,]", "[,1]", "[,]", "[1 2]", "[1;2]", "[1,,2]", "[}", "[1}"}) {
        EXPECT_FALSE(parses(bad)) << bad;
    }
}

TEST(json, objects) {
    EXPECT_TRUE(parse("{}").is_object());
    EXPECT_EQ(parse("{}").size(), 0u);
    const Value v = parse(R"({"a":1,"b":{"c":[true]},"":"empty key"})");
    ASSERT_EQ(v.size(), 3u);
    EXPECT_EQ(v.at("a").as_int(), 1);
    EXPECT_TRUE(v.at("b").at("c").as_array()[0].as_bool());
    EXPECT_EQ(v.at("").as_string(), "empty key");
    for (const char* bad :
         {"{", "}", "{\"a\"", "{\"a\":", "{\"a\":1", "{\"a\":1,", "{\"a\":1,}", "{,}", "{\"a\" 1}", "{\"a\"=1}",
          "{a:1}", "{'a':1}", "{1:1}", "{null:1}", "{\"a\":1 \"b\":2}", "{\"a\":1]", "{\"a\"::1}", "{:1}"}) {
        EXPECT_FALSE(parses(bad)) << bad;
    }
}

TEST(json, every_value_kind_at_the_top_level) {
    EXPECT_EQ(parse("\"s\"").as_string(), "s");
    EXPECT_EQ(parse("42").as_int(), 42);
    EXPECT_EQ(parse("-1.5").as_double(), -1.5);
    EXPECT_TRUE(parse("null").is_null());
    EXPECT_TRUE(parse("[]").is_array());
    EXPECT_TRUE(parse("{}").is_object());
}

// ---- strings and escapes ----

TEST(json, simple_escapes) {
    EXPECT_EQ(parse(R"("\"\\\/\b\f\n\r\t")").as_string(), "\"\\/\b\f\n\r\t");
    EXPECT_EQ(parse(R"("a/b")").as_string(), "a/b");  // '/' needs no escape
    for (const char* bad : {R"("\x41")", R"("\'")", R"("\a")", R"("\0")", R"("\U0041")", R"("\v")", R"("\e")",
                            "\"\\\n\"", R"("\)", R"("\")", R"("abc)", "\""}) {
        EXPECT_FALSE(parses(bad)) << bad;
    }
}

TEST(json, unicode_escapes) {
    EXPECT_EQ(parse(R"("\u0041\u00e9\u00E9\u20AC\uffff")").as_string(), "A\xc3\xa9\xc3\xa9\xe2\x82\xac\xef\xbf\xbf");
    EXPECT_EQ(parse(R"("\u0000")").as_string(), std::string(1, '\0'));
    EXPECT_EQ(parse(R"("\u001f\u007f")").as_string(), "\x1f\x7f");
    EXPECT_EQ(parse(R"("\ud7ff\ue000")").as_string(), "\xed\x9f\xbf\xee\x80\x80");  // around the surrogates
    for (const char* bad : {R"("\u")", R"("\u1")", R"("\u12")", R"("\u123")", R"("\u12G4")", R"("\u-123")",
                            R"("\u 123")", R"("\u+123")", R"("\x{41}")"}) {
        EXPECT_FALSE(parses(bad)) << bad;
    }
}

TEST(json, surrogate_pairs_decode_to_utf8_and_lone_surrogates_are_rejected) {
    EXPECT_EQ(parse(R"("\ud83d\ude00")").as_string(), "\xf0\x9f\x98\x80");
    EXPECT_EQ(parse(R"("\uD834\uDD1E")").as_string(), "\xf0\x9d\x84\x9e");
    EXPECT_EQ(parse(R"("\ud800\udc00")").as_string(), "\xf0\x90\x80\x80");  // U+10000
    EXPECT_EQ(parse(R"("\udbff\udfff")").as_string(), "\xf4\x8f\xbf\xbf");  // U+10FFFF
    for (const char* bad : {
             R"("\ud83d")",        // high surrogate at the end of the string
             R"("\ud83dx")",       // followed by a character
             R"("\ud83d\n")",      // followed by another escape
             R"("\ud83d\u0041")",  // followed by a non-surrogate \u
             R"("\ud83d\ud83d")",  // two high surrogates
             R"("\ud83d\ude0")",   // truncated low half
             R"("\ude00")",        // lone low surrogate
             R"("\udfff\ud800")",  // reversed pair
             R"("\ud83d)",         // end of input
         }) {
        const std::string e = parse_error(bad);
        EXPECT_FALSE(e.empty()) << bad;
    }
    EXPECT_NE(parse_error(R"("\ude00")").find("unpaired surrogate"), std::string::npos);
    // Surrogates written directly as (invalid) UTF-8 are rejected too.
    EXPECT_FALSE(parses("\"\xed\xa0\xbd\xed\xb8\x80\""));
}

TEST(json, control_characters_must_be_escaped) {
    for (int c = 0; c < 0x20; ++c) {
        const std::string text = std::string("\"a") + char(c) + "b\"";
        EXPECT_NE(parse_error(text).find("control character"), std::string::npos) << c;
    }
    EXPECT_EQ(parse("\"\x7f\"").as_string(), "\x7f");  // DEL is not a control character in JSON
}

TEST(json, valid_utf8_passes_through_unchanged) {
    for (const char* s :
         {"\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80", "\xed\x9f\xbf", "\xee\x80\x80", "\xef\xbf\xbf", "\xf0\x90\x80\x80",
          "\xf4\x8f\xbf\xbf", "h\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93 \xf0\x9f\x90\xa6"}) {
        EXPECT_EQ(parse(std::string("\"") + s + "\"").as_string(), s);
        EXPECT_EQ(parse(std::string("{\"") + s + "\":1}").as_object()[0].first, s);  // keys too
    }
}

TEST(json, invalid_utf8_is_rejected_in_strings_and_keys) {
    for (const char* s : {
             "\x80",              // continuation byte without a lead
             "\xbf",              //
             "\xc0\xaf",          // overlong '/'
             "\xc1\xbf",          // overlong
             "\xe0\x80\xaf",      // overlong 3-byte
             "\xe0\x9f\xbf",      // overlong 3-byte (U+07FF)
             "\xf0\x80\x80\xaf",  // overlong 4-byte
             "\xf0\x8f\xbf\xbf",  // overlong 4-byte (U+FFFF)
             "\xed\xa0\x80",      // U+D800 (surrogate)
             "\xed\xbf\xbf",      // U+DFFF (surrogate)
             "\xf4\x90\x80\x80",  // U+110000
             "\xf5\x80\x80\x80",  // lead byte above F4
             "\xf8\x88\x80\x80\x80",
             "\xfe",
             "\xff",
             "\xc3",          // truncated 2-byte sequence
             "\xe2\x82",      // truncated 3-byte sequence
             "\xf0\x9f\x98",  // truncated 4-byte sequence
             "\xc3\x28",      // lead followed by ASCII
             "\xe2\x28\xa1",  //
         }) {
        const std::string text = std::string("\"a") + s + "b\"";
        EXPECT_NE(parse_error(text).find("invalid UTF-8"), std::string::npos) << text;
        EXPECT_FALSE(parses(std::string("{\"") + s + "\":1}")) << text;
    }
    EXPECT_FALSE(parses("\"\xe2\x82"));  // truncated at the end of the input
}

TEST(json, bytes_outside_strings_are_named_in_the_error) {
    EXPECT_NE(parse_error("\x01").find("unexpected character '\\x01'"), std::string::npos) << parse_error("\x01");
    EXPECT_NE(parse_error("\xff").find("unexpected character '\\xff'"), std::string::npos);
    EXPECT_NE(parse_error("[1, x]").find("unexpected character 'x'"), std::string::npos);
}

// ---- numbers ----

TEST(json, integers_stay_exact) {
    const Value v = parse("[0, 1, -1, 42, 9007199254740993, 123456789012, 9223372036854775807, -9223372036854775808]");
    const Array& a = v.as_array();
    EXPECT_EQ(a[0].as_int(), 0);
    EXPECT_EQ(a[1].as_int(), 1);
    EXPECT_EQ(a[2].as_int(), -1);
    EXPECT_EQ(a[3].as_int(), 42);
    EXPECT_EQ(a[4].as_int(), 9007199254740993LL);  // not representable as a double
    EXPECT_EQ(a[5].as_int(), 123456789012LL);
    EXPECT_EQ(a[6].as_int(), INT64_MAX);
    EXPECT_EQ(a[7].as_int(), INT64_MIN);
    for (const Value& x : a) {
        EXPECT_TRUE(x.is_integer());
        EXPECT_FALSE(x.is_float());
    }
    EXPECT_EQ(v.dump(), "[0,1,-1,42,9007199254740993,123456789012,9223372036854775807,-9223372036854775808]");
}

TEST(json, integers_beyond_int64_become_doubles) {
    for (const char* text :
         {"9223372036854775808", "-9223372036854775809", "18446744073709551616", "123456789012345678901234567890"}) {
        const Value v = parse(text);
        EXPECT_TRUE(v.is_number()) << text;
        EXPECT_FALSE(v.is_integer()) << text;
        EXPECT_THROW(v.as_int(), Error) << text;
        EXPECT_EQ(v.as_double(), std::strtod(text, nullptr)) << text;
        EXPECT_EQ(parse(v.dump()), v) << text;  // the double reads back identically
    }
}

TEST(json, fractions_and_exponents) {
    EXPECT_EQ(parse("0.5").as_double(), 0.5);
    EXPECT_EQ(parse("-0.5").as_double(), -0.5);
    EXPECT_EQ(parse("0.1").as_double(), 0.1);
    EXPECT_EQ(parse("3.14159").as_double(), 3.14159);
    EXPECT_EQ(parse("1e2").as_double(), 100.0);
    EXPECT_EQ(parse("1E2").as_double(), 100.0);
    EXPECT_EQ(parse("1e+2").as_double(), 100.0);
    EXPECT_EQ(parse("1e-2").as_double(), 0.01);
    EXPECT_EQ(parse("1e002").as_double(), 100.0);  // leading zeros are allowed in the exponent
    EXPECT_EQ(parse("-2.5E-3").as_double(), -0.0025);
    EXPECT_EQ(parse("0e0").as_double(), 0.0);
    EXPECT_EQ(parse("0e99999999").as_double(), 0.0);
    EXPECT_EQ(parse("1.7976931348623157e308").as_double(), std::numeric_limits<double>::max());
    EXPECT_EQ(parse("2.2250738585072014e-308").as_double(), std::numeric_limits<double>::min());
    EXPECT_EQ(parse("4.9406564584124654e-324").as_double(), std::numeric_limits<double>::denorm_min());

    // An integral value written with a fraction or exponent is an integer that remembers it was a float.
    const Value f = parse("1.5e3");
    EXPECT_TRUE(f.is_integer());
    EXPECT_TRUE(f.is_float());
    EXPECT_EQ(f.as_int(), 1500);
    EXPECT_TRUE(parse("2.0").is_float());
    EXPECT_FALSE(parse("2").is_float());
    EXPECT_FALSE(parse("2.5").is_integer());
    try {
        parse("2.5").as_int();
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("expected an integer, got 2.5"), std::string::npos) << e.what();
    }
}

TEST(json, negative_zero) {
    const Value i = parse("-0");
    EXPECT_TRUE(i.is_integer());
    EXPECT_EQ(i.as_int(), 0);
    EXPECT_EQ(i.dump(), "0");
    const Value d = parse("-0.0");
    EXPECT_EQ(d.as_double(), 0.0);
    EXPECT_TRUE(std::signbit(d.as_double()));  // the double keeps its sign ...
    EXPECT_EQ(d.as_int(), 0);                  // ... and it is still the integer 0
    EXPECT_EQ(parse("-0e5"), parse("0"));
}

TEST(json, numbers_out_of_double_range_are_rejected_on_both_sides) {
    // Overflow would be infinity, which JSON cannot write back; underflow (a nonzero literal that would
    // read as 0) is refused the same way, and JsonPrefix mirrors both. Subnormals are in range.
    const std::string tiny = "0." + std::string(400, '0') + "1";
    for (const std::string& bad :
         {std::string("1e309"), std::string("-1e309"), std::string("1.7976931348623159e308"),
          std::string("1e99999999999999999999"), std::string("1e-400"), std::string("-1e-400"), tiny}) {
        EXPECT_NE(parse_error(bad).find("number out of range"), std::string::npos) << bad;
    }
    EXPECT_EQ(parse(std::string("1") + std::string(300, '0')).as_double(), 1e300);
    EXPECT_FALSE(parses(std::string("1") + std::string(309, '0')));
}

TEST(json, malformed_numbers_are_rejected) {
    for (const char* bad :
         {"01",  "-01",   "00",    "00.5",  "-00",   "012e3", "+1",   "+0",          ".5",  "-.5", "1.",
          "-1.", "1.e5",  "1e",    "1e+",   "1e-",   "1E",    "-",    "--1",         "- 1", "1-",  "0x10",
          "0X1", "1_000", "1.5.5", "1e5e5", "1e5.5", "0b1",   "1ee5", "\xef\xbc\x91" /* fullwidth digit one */}) {
        EXPECT_FALSE(parses(bad)) << bad;
        EXPECT_FALSE(parses(std::string("[") + bad + "]")) << bad;
        EXPECT_FALSE(parses(std::string("{\"n\":") + bad + "}")) << bad;
    }
}

// ---- whitespace, empty input, trailing text ----

TEST(json, the_four_whitespace_characters_are_allowed_between_all_tokens) {
    const Value v = parse(" \t\r\n{ \t\r\n\"a\" \t\r\n: \t\r\n[ \t\r\n1 \t\r\n, \t\r\nnull \t\r\n] \t\r\n} \t\r\n");
    EXPECT_EQ(v.dump(), "{\"a\":[1,null]}");
    EXPECT_EQ(parse(" [ ] ").size(), 0u);
    EXPECT_EQ(parse(" { } ").size(), 0u);
}

TEST(json, other_whitespace_is_rejected) {
    for (const char* ws : {"\f", "\v", "\xc2\xa0" /* NBSP */, "\xe2\x80\xa8" /* U+2028 */, "\xe3\x80\x80",
                           "\xef\xbb\xbf" /* byte order mark */}) {
        EXPECT_FALSE(parses(std::string(ws) + "1")) << ws;
        EXPECT_FALSE(parses(std::string("[1,") + ws + "2]")) << ws;
        EXPECT_FALSE(parses(std::string("1") + ws)) << ws;
    }
}

TEST(json, empty_input_is_an_error) {
    for (const char* empty : {"", " ", "\n", " \t\r\n "}) {
        EXPECT_NE(parse_error(empty).find("unexpected end of input"), std::string::npos) << "'" << empty << "'";
    }
}

TEST(json, trailing_text_is_rejected_unless_allowed) {
    for (const char* text : {"1 2", "[] []", "{}x", "{} {}", "nullnull", "null x", "truex", "1x", "\"a\"\"b\"", "[]]",
                             "{}}", "0 0", "\"a\" ,"}) {
        EXPECT_NE(parse_error(text).find("unexpected text after the JSON value"), std::string::npos) << text;
    }
    EXPECT_NE(parse_error(std::string_view("1\0", 2)).find("unexpected text after"), std::string::npos);
    const ParseOptions lenient{.allow_trailing = true};
    EXPECT_EQ(parse("1 2", lenient).as_int(), 1);
    EXPECT_EQ(parse("{\"a\":1} trailing", lenient).at("a").as_int(), 1);
    EXPECT_EQ(parse("[1]]", lenient).size(), 1u);
    EXPECT_FALSE(parses("[1", lenient));  // the value itself must still be complete
}

// ---- depth limit ----

TEST(json, depth_limit_counts_the_depth_of_values) {
    // The top-level value is at depth 0, the elements of a container one deeper than it; a document
    // whose values are all at depth <= max_depth (default 128) parses.
    EXPECT_TRUE(parses(nested(128, "[", "1", "]")));
    EXPECT_FALSE(parses(nested(129, "[", "1", "]")));
    EXPECT_TRUE(parses(nested(128, "{\"a\":", "1", "}")));
    EXPECT_FALSE(parses(nested(129, "{\"a\":", "1", "}")));
    EXPECT_TRUE(parses(nested(129, "[", "", "]")));  // the innermost (empty) array is a value at depth 128
    EXPECT_FALSE(parses(nested(130, "[", "", "]")));
    EXPECT_NE(parse_error(nested(200, "[", "", "]")).find("nesting deeper than the limit of 128"), std::string::npos);

    const ParseOptions shallow{.max_depth = 2};
    EXPECT_TRUE(parses(R"({"a":{"b":1}})", shallow));
    EXPECT_FALSE(parses(R"({"a":{"b":[1]}})", shallow));
    EXPECT_TRUE(parses("[[1],[2]]", shallow));
    EXPECT_FALSE(parses("[[[1]]]", shallow));
    EXPECT_TRUE(parses("1", ParseOptions{.max_depth = 0}));
    EXPECT_FALSE(parses("[1]", ParseOptions{.max_depth = 0}));
}

TEST(json, hostile_nesting_is_rejected_without_recursing) {
    EXPECT_FALSE(parses(std::string(1000000, '[')));
    EXPECT_FALSE(parses(nested(500000, "[", "", "]")));
    std::string objects;
    for (int i = 0; i < 200000; ++i) objects += "{\"a\":";
    EXPECT_FALSE(parses(objects));
}

// ---- duplicate keys and member order ----

TEST(json, duplicate_keys_keep_the_first_position_and_the_last_value) {
    const Value v = parse(R"({"a":1,"b":2,"a":3})");
    ASSERT_EQ(v.size(), 2u);
    EXPECT_EQ(v.as_object()[0].first, "a");
    EXPECT_EQ(v.at("a").as_int(), 3);
    EXPECT_EQ(v.dump(), R"({"a":3,"b":2})");
    EXPECT_EQ(parse(R"({"a":{"x":1},"a":[2]})").at("a").dump(), "[2]");  // the value's type may change
}

TEST(json, duplicate_keys_in_large_objects) {
    // Objects of 32 or more members look keys up in an index; the outcome must not change.
    std::string text = "{";
    for (int i = 0; i < 100; ++i) text += str("\"k", i, "\":", i, ",");
    text += "\"k0\":-1,\"k31\":-32,\"k32\":-33,\"k99\":-100,\"new\":7,\"k5\":-6}";
    const Value v = parse(text);
    ASSERT_EQ(v.size(), 101u);
    for (int i = 0; i < 100; ++i) {
        EXPECT_EQ(v.as_object()[size_t(i)].first, str("k", i));
        const bool replaced = i == 0 || i == 5 || i == 31 || i == 32 || i == 99;
        EXPECT_EQ(v.as_object()[size_t(i)].second.as_int(), replaced ? -i - 1 : i) << i;
    }
    EXPECT_EQ(v.as_object()[100].first, "new");

    // A duplicate among the first 32 members, then the object grows past the index threshold.
    std::string grow = "{\"d\":1,\"d\":2";
    for (int i = 0; i < 40; ++i) grow += str(",\"g", i, "\":0");
    grow += ",\"d\":3}";
    const Value g = parse(grow);
    EXPECT_EQ(g.size(), 41u);
    EXPECT_EQ(g.as_object()[0].first, "d");
    EXPECT_EQ(g.at("d").as_int(), 3);
}

TEST(json, objects_keep_member_order) {
    const Value v = parse(R"({"z":1,"a":2,"m":3})");
    EXPECT_EQ(v.as_object()[0].first, "z");
    EXPECT_EQ(v.as_object()[1].first, "a");
    EXPECT_EQ(v.as_object()[2].first, "m");
    EXPECT_EQ(v.dump(), R"({"z":1,"a":2,"m":3})");
    // Equality compares members in order.
    EXPECT_EQ(parse(R"({"a":1,"b":2})"), parse(R"({ "a" : 1 , "b" : 2 })"));
    EXPECT_NE(parse(R"({"a":1,"b":2})"), parse(R"({"b":2,"a":1})"));

    Value built;
    built.set("z", 1);
    built.set("a", 2);
    built.set("z", 3);  // replaced in place
    EXPECT_EQ(built.dump(), R"({"z":3,"a":2})");
}

// ---- errors ----

TEST(json, errors_name_line_and_column) {
    EXPECT_NE(parse_error("{\n  \"a\": tru\n}").find("line 2"), std::string::npos);
    EXPECT_NE(parse_error("[1,]").find("invalid JSON at line 1, column 4: unexpected character ']'"), std::string::npos)
        << parse_error("[1,]");
    EXPECT_NE(parse_error("[\n1,\n\n  x]").find("line 4, column 3"), std::string::npos) << parse_error("[\n1,\n\n  x]");
    EXPECT_NE(parse_error("{\"a\" 1}").find("expected ':' after object key"), std::string::npos);
    EXPECT_NE(parse_error("{\"a\":1 \"b\":2}").find("expected ',' or '}' in object"), std::string::npos);
    EXPECT_NE(parse_error("[1 2]").find("expected ',' or ']' in array"), std::string::npos);
    EXPECT_NE(parse_error("{1:2}").find("expected a string key in object"), std::string::npos);
    EXPECT_NE(parse_error("\"abc").find("unterminated string"), std::string::npos);
    EXPECT_NE(parse_error("[1,2").find("unexpected end of input in array"), std::string::npos);
}

TEST(json, every_proper_prefix_of_a_container_is_rejected) {
    const std::string doc =
        R"({"model":"m","messages":[{"role":"user","content":"h\u00e9\ud83d\ude00 \"q\""}],"n":-1.5e-3,"ok":true,"x":null})";
    ASSERT_TRUE(parses(doc));
    for (size_t n = 0; n < doc.size(); ++n) EXPECT_FALSE(parses(doc.substr(0, n))) << doc.substr(0, n);
}

// ---- serializer and round trips ----

TEST(json, quoting_escapes_controls_and_replaces_invalid_utf8) {
    EXPECT_EQ(quote("a\"b\\\x01"), "\"a\\\"b\\\\\\u0001\"");
    EXPECT_EQ(quote("\b\f\n\r\t\x1f/"), "\"\\b\\f\\n\\r\\t\\u001f/\"");
    EXPECT_EQ(quote(std::string_view("\0", 1)), "\"\\u0000\"");
    EXPECT_EQ(quote("\xff"), "\"\xef\xbf\xbd\"");
    EXPECT_EQ(quote("a\xc3(b"), "\"a\xef\xbf\xbd(b\"");
    EXPECT_EQ(quote("\xed\xa0\x80"), "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"");  // each bad byte replaced
    EXPECT_EQ(quote("\xf0\x9f\x98\x80", true), "\"\\ud83d\\ude00\"");
    EXPECT_EQ(quote("\xc3\xa9\x7f", true), "\"\\u00e9\x7f\"");
    EXPECT_EQ(quote("\xff", true), "\"\\ufffd\"");
}

TEST(json, quoted_strings_read_back_exactly) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<uint32_t> any_cp(0, 0x10ffff);
    for (int round = 0; round < 2000; ++round) {
        std::string s;
        const int n = int(rng() % 12);
        for (int i = 0; i < n; ++i) {
            uint32_t cp = rng() % 4 == 0 ? rng() % 0x80 : any_cp(rng);
            if (cp >= 0xd800 && cp < 0xe000) cp = 0xfffd;
            utf8::append(s, cp);
        }
        EXPECT_EQ(parse(quote(s)).as_string(), s);
        EXPECT_EQ(parse(quote(s, true)).as_string(), s);
        for (char c : quote(s, true)) EXPECT_LT(uint8_t(c), 0x80);
    }
}

TEST(json, format_number) {
    EXPECT_EQ(format_number(0.0), "0");
    EXPECT_EQ(format_number(-0.0), "0");
    EXPECT_EQ(format_number(3.0), "3");
    EXPECT_EQ(format_number(-42.0), "-42");
    EXPECT_EQ(format_number(0.1), "0.1");
    EXPECT_EQ(format_number(1.5), "1.5");
    EXPECT_EQ(format_number(9007199254740991.0), "9007199254740991");
    EXPECT_EQ(format_number(1e300), "1e+300");
    EXPECT_EQ(format_number(5e-324), "5e-324");
    EXPECT_EQ(format_number(std::nan("")), "null");
    EXPECT_EQ(format_number(INFINITY), "null");
    EXPECT_EQ(format_number(-INFINITY), "null");
    for (double d : {0.1, 1.0 / 3.0, 2.0 / 3.0, 1e-7, 123456.789, 1e21, 1.7976931348623157e308, 5e-324}) {
        EXPECT_EQ(parse(format_number(d)).as_double(), d) << d;
    }
}

TEST(json, built_values_dump_and_indent) {
    Value v;
    v.set("name", "osprey");
    v.set("n", 3);
    Value arr;
    arr.push_back(1.5);
    v.set("list", arr);
    v.set("empty_list", Array{});
    v.set("empty_object", Object{});
    v.set("none", nullptr);
    v.set("big", uint64_t(UINT64_MAX));
    v.set("nan", std::nan(""));
    EXPECT_EQ(v.dump(), R"({"name":"osprey","n":3,"list":[1.5],"empty_list":[],"empty_object":{},"none":null,)"
                        R"("big":18446744073709551615,"nan":null})");
    Value small;
    small.set("a", Array{1, Value(Object{{"b", true}})});
    small.set("c", Object{});
    EXPECT_EQ(small.dump(2), "{\n  \"a\": [\n    1,\n    {\n      \"b\": true\n    }\n  ],\n  \"c\": {}\n}");
    EXPECT_EQ(Value(Array{}).dump(4), "[]");
    EXPECT_EQ(Value("x").dump(4), "\"x\"");
}

// A random document of bounded depth with every kind of value, awkward strings and numbers.
Value random_value(std::mt19937& rng, int depth) {
    const int kind = int(rng() % (depth > 0 ? 9 : 7));
    switch (kind) {
        case 0:
            return Value();
        case 1:
            return Value(rng() % 2 == 0);
        case 2:
            return Value(int64_t((uint64_t(rng()) << 32) | rng()));
        case 3: {
            const double d = std::ldexp(double(int64_t(rng()) - int64_t(rng())), int(rng() % 200) - 100);
            return Value(d);
        }
        case 4:
            return Value(int(rng() % 5) - 2);
        case 5:
        case 6: {
            static const char* pieces[] = {"a",
                                           "\"",
                                           "\\",
                                           "/",
                                           "\n",
                                           "\t",
                                           "\x01",
                                           "\x1f",
                                           "\x7f",
                                           "\xc3\xa9",
                                           "\xe2\x82\xac",
                                           "\xf0\x9f\x98\x80",
                                           " ",
                                           "{",
                                           "]",
                                           "\\u0041",
                                           ""};
            std::string s;
            for (int i = int(rng() % 6); i > 0; --i) s += pieces[rng() % (sizeof pieces / sizeof *pieces)];
            return Value(s);
        }
        case 7: {
            Array a;
            for (int i = int(rng() % 5); i > 0; --i) a.push_back(random_value(rng, depth - 1));
            return Value(std::move(a));
        }
        default: {
            Value o = Value(Object{});
            for (int i = int(rng() % 5); i > 0; --i)
                o.set("k" + std::to_string(rng() % 8), random_value(rng, depth - 1));
            return o;
        }
    }
}

TEST(json, dump_then_parse_round_trips) {
    std::mt19937 rng(11);
    for (int round = 0; round < 3000; ++round) {
        const Value v = random_value(rng, 4);
        const std::string compact = v.dump();
        const Value back = parse(compact);
        EXPECT_EQ(back, v) << compact;
        EXPECT_EQ(back.dump(), compact);  // dumping is a fixed point after one round
        EXPECT_EQ(parse(v.dump(2)), v) << v.dump(2);
        EXPECT_EQ(compact.find('\n'), std::string::npos) << "compact output has no line breaks (SSE data lines)";
    }
}

TEST(json, parse_then_dump_is_canonical) {
    EXPECT_EQ(parse(" { \"a\" : [ 1 , 2.50 , -0.0 , 1E3 , \"\\u0041\\/\" ] } ").dump(), R"({"a":[1,2.5,0,1000,"A/"]})");
    EXPECT_EQ(parse(R"("\ud83d\ude00")").dump(), "\"\xf0\x9f\x98\x80\"");
    EXPECT_EQ(parse(R"("\u0001")").dump(), R"("\u0001")");
}

// Mutated and truncated documents either parse (and then round-trip) or throw osprey::Error.
TEST(json, random_mutations_never_crash) {
    std::mt19937 rng(3);
    const std::string alphabet = "{}[]:,\"\\ \n0123456789-+.eEtrufalsn\x01\x7f\xc3\xa9\xff\xed\xa0";
    for (int round = 0; round < 20000; ++round) {
        std::string text = random_value(rng, 3).dump();
        for (int m = int(rng() % 4); m >= 0 && !text.empty(); --m) {
            const size_t at = rng() % text.size();
            switch (rng() % 4) {
                case 0:
                    text[at] = alphabet[rng() % alphabet.size()];
                    break;
                case 1:
                    text.insert(at, 1, alphabet[rng() % alphabet.size()]);
                    break;
                case 2:
                    text.erase(at, 1);
                    break;
                default:
                    text.resize(at);
                    break;
            }
        }
        try {
            const Value v = parse(text);
            EXPECT_EQ(parse(v.dump()), v) << text;
        } catch (const Error&) {
        }
    }
}

// ---- the Value type ----

TEST(json, typed_access_names_the_actual_type) {
    const Value v = parse(R"({"n": "x"})");
    try {
        v.at("n").as_int();
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("expected a JSON number, got string"), std::string::npos) << e.what();
    }
    try {
        v.at("missing");
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("missing field 'missing'"), std::string::npos) << e.what();
    }
    EXPECT_THROW(v.as_array(), Error);
    EXPECT_THROW(v.at("n").as_bool(), Error);
    EXPECT_THROW(v.at("n").as_double(), Error);
    EXPECT_THROW(Value(1).as_string(), Error);
    EXPECT_THROW(Value().as_object(), Error);
    EXPECT_STREQ(type_name(Type::null), "null");
    EXPECT_STREQ(type_name(Type::boolean), "boolean");
    EXPECT_STREQ(type_name(Type::object), "object");
}

TEST(json, find_size_set_and_push_back) {
    const Value num = 5;
    EXPECT_EQ(num.find("a"), nullptr);  // not an object
    EXPECT_FALSE(num.contains("a"));
    EXPECT_EQ(num.size(), 0u);
    EXPECT_EQ(Value("abc").size(), 0u);
    Value o;  // null turns into an object on set
    o.set("a", 1);
    EXPECT_TRUE(o.is_object());
    EXPECT_TRUE(o.contains("a"));
    Value a;  // and into an array on push_back
    a.push_back("x");
    a.push_back(1);
    EXPECT_EQ(a.dump(), R"(["x",1])");
    Value b;
    b.push_back(Value()).push_back(2);  // push_back returns the new element
    EXPECT_EQ(b.dump(), "[[2]]");
    Value s = "str";
    EXPECT_THROW(s.set("k", 1), Error);
    EXPECT_THROW(s.push_back(1), Error);
}

TEST(json, copies_do_not_share_mutations) {
    Value a = parse(R"({"list":[1,2],"obj":{"k":1}})");
    const Value b = a;
    a.set("new", true);
    Value list = a.at("list");
    list.push_back(3);
    a.set("list", list);
    EXPECT_EQ(b.dump(), R"({"list":[1,2],"obj":{"k":1}})");
    EXPECT_EQ(a.dump(), R"({"list":[1,2,3],"obj":{"k":1},"new":true})");
    Value c = b;
    c.as_object()[1].second.set("k", 2);
    EXPECT_EQ(b.at("obj").at("k").as_int(), 1);
    EXPECT_EQ(c.at("obj").at("k").as_int(), 2);
}

TEST(json, number_equality_and_kinds) {
    EXPECT_EQ(Value(1), Value(1.0));
    EXPECT_EQ(Value(int64_t(7)), parse("7.0"));
    EXPECT_NE(Value(int64_t(9007199254740993LL)), Value(9007199254740992.0));  // compared as integers
    EXPECT_NE(Value(1), Value(true));
    EXPECT_NE(Value(0), Value());
    EXPECT_NE(Value("1"), Value(1));
    EXPECT_TRUE(Value(2.0).is_float());
    EXPECT_TRUE(Value(2.0).is_integer());
    EXPECT_FALSE(Value(2.5).is_integer());
    EXPECT_FALSE(Value(std::nan("")).is_integer());
    EXPECT_FALSE(Value(uint64_t(UINT64_MAX)).is_integer());
    EXPECT_TRUE(Value(uint64_t(INT64_MAX)).is_integer());
    EXPECT_EQ(Value(uint64_t(INT64_MAX)).as_int(), INT64_MAX);
}

}  // namespace
}  // namespace osprey::json

namespace osprey::json {
namespace {

// Issue 19: integers up to 2^64 - 1 are exact (serde_json's u64), beyond they are doubles.
TEST(json, unsigned_integers_above_int64_are_exact) {
    const Value v = parse("[9223372036854775807, 9223372036854775808, 18446744073709551615, 18446744073709551616]");
    const Array& a = v.as_array();
    EXPECT_TRUE(a[0].is_integer());
    EXPECT_FALSE(a[1].is_integer());
    EXPECT_TRUE(a[1].is_big_unsigned());
    EXPECT_EQ(a[2].as_big_unsigned(), UINT64_MAX);
    EXPECT_FALSE(a[2].is_float());
    EXPECT_TRUE(a[3].is_float());
    EXPECT_EQ(v.dump(), "[9223372036854775807,9223372036854775808,18446744073709551615,18446744073709551616]");
    EXPECT_EQ(parse(v.dump()), v);
}

}  // namespace
}  // namespace osprey::json
