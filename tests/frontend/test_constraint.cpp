// The Harmony-aware constraint driven token by token with real o200k_harmony tokens: the analysis
// channel and headers stay free (no mask), the final channel's content and strict or forced tool
// arguments are constrained, the message's end is allowed only once the grammar accepts, and
// tool_choice "required" restricts the name to the declared functions.
#include <gtest/gtest.h>

#include "frontend/api_error.h"
#include "frontend/constraint.h"
#include "grammar/token_mask.h"
#include "harmony/special_tokens.h"
#include "tokenizer/tokenizer_fixture.h"

namespace osprey::frontend {
namespace {

const tok::Tokenizer& T() { return tok::test::o200k(); }

std::vector<int32_t> ids(std::string_view harmony_text) {
    return T().encode(harmony_text, tok::Specials::allowed);
}

struct Driver {
    std::unique_ptr<engine::TokenConstraint> c;
    std::vector<uint32_t> mask = std::vector<uint32_t>(grammar::mask_words(T().vocab_size()));

    explicit Driver(const std::shared_ptr<const engine::TokenConstraint>& proto) : c(proto->clone()) {}
    // Feeds the tokens of `text`; every one must be allowed by the step's mask (when there is one).
    void feed(std::string_view text) {
        for (int32_t t : ids(text)) {
            ASSERT_TRUE(!masked() || grammar::mask_has(mask, t)) << "token " << t << " of '" << text << "' refused";
            ASSERT_TRUE(c->accept(t)) << "token " << t << " of '" << text << "'";
        }
    }
    bool masked() {
        std::fill(mask.begin(), mask.end(), 0);
        return c->fill_mask(mask);
    }
    bool allows(int32_t t) { return !masked() || grammar::mask_has(mask, t); }
};

OutputFormat schema_format(const char* schema) {
    OutputFormat f;
    f.kind = OutputFormat::Kind::json_schema;
    f.schema = json::parse(schema);
    f.param = "response_format";
    return f;
}

TEST(harmony_constraint, only_the_final_channel_is_constrained) {
    HarmonyConstraintSpec spec;
    spec.final_format = schema_format(R"({"type":"object","properties":{"a":{"enum":[1,2]}},"required":["a"]})");
    auto proto = make_harmony_constraint(T(), spec);
    ASSERT_TRUE(proto);
    Driver d(proto);
    EXPECT_FALSE(d.masked()) << "the header is free";
    d.feed("<|channel|>analysis<|message|>Let me think about {{ this.");
    EXPECT_FALSE(d.masked()) << "the analysis channel is free";
    d.feed("<|end|><|start|>assistant<|channel|>final<|message|>");
    ASSERT_TRUE(d.masked());
    EXPECT_FALSE(d.allows(harmony::kReturn)) << "nothing written yet";
    EXPECT_FALSE(d.allows(ids("Hello")[0]));
    d.feed("{\"a\":");
    EXPECT_FALSE(d.allows(ids("3")[0]));
    EXPECT_TRUE(d.allows(ids("2")[0]));
    d.feed("2}");
    ASSERT_TRUE(d.masked());
    EXPECT_TRUE(d.allows(harmony::kReturn));
    EXPECT_FALSE(d.allows(harmony::kEnd));
    EXPECT_FALSE(d.allows(ids(",")[0]));
    EXPECT_TRUE(d.c->accept(harmony::kReturn));
    EXPECT_FALSE(d.masked());
}

TEST(harmony_constraint, clones_advance_independently) {
    HarmonyConstraintSpec spec;
    spec.final_format = schema_format(R"({"enum":["yes","no"]})");
    auto proto = make_harmony_constraint(T(), spec);
    Driver a(proto), b(proto);
    a.feed("<|channel|>final<|message|>\"ye");
    b.feed("<|channel|>final<|message|>\"n");
    EXPECT_TRUE(a.allows(ids("s")[0]));
    EXPECT_FALSE(b.allows(ids("s")[0]));
    EXPECT_TRUE(b.allows(ids("o")[0]));
}

harmony::ToolDescription tool(const char* name, const char* params, bool strict) {
    harmony::ToolDescription t;
    t.name = name;
    t.parameters = json::parse(params);
    t.strict = strict;
    return t;
}

TEST(harmony_constraint, strict_tool_arguments) {
    HarmonyConstraintSpec spec;
    spec.tools = {tool("get_weather", R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})", true),
                  tool("free", R"({"type":"object"})", false)};
    auto proto = make_harmony_constraint(T(), spec);
    ASSERT_TRUE(proto);
    Driver d(proto);
    d.feed("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>");
    ASSERT_TRUE(d.masked());
    EXPECT_FALSE(d.allows(harmony::kCall));
    d.feed("{\"city\":\"Paris\"}");
    EXPECT_TRUE(d.allows(harmony::kCall));
    EXPECT_FALSE(d.allows(harmony::kReturn));
    // The recipient may also come before the channel; a non-strict function stays free.
    Driver e(proto);
    e.feed("<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.free<|channel|>commentary json<|message|>");
    EXPECT_FALSE(e.masked());
    Driver f(proto);
    f.feed("<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>");
    EXPECT_TRUE(f.masked());
}

TEST(harmony_constraint, required_call_names_a_declared_function) {
    HarmonyConstraintSpec spec;
    spec.tools = {tool("get_weather", R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})", false),
                  tool("get_time", R"({"type":"object","properties":{},"additionalProperties":false})", false)};
    spec.forced = {true, ""};
    auto proto = make_harmony_constraint(T(), spec);
    ASSERT_TRUE(proto);
    Driver d(proto);  // the prompt ends "<|channel|>commentary to=functions."
    ASSERT_TRUE(d.masked());
    EXPECT_FALSE(d.allows(harmony::kMessage));
    EXPECT_FALSE(d.allows(ids("set")[0]));
    d.feed("get_time");
    EXPECT_TRUE(d.allows(harmony::kMessage));
    EXPECT_TRUE(d.allows(harmony::kConstrain));
    d.feed(" <|constrain|>json<|message|>");
    ASSERT_TRUE(d.masked());
    EXPECT_FALSE(d.allows(ids("{\"city")[0])) << "get_time's own schema applies";
    d.feed("{}");
    EXPECT_TRUE(d.allows(harmony::kCall));
}

TEST(harmony_constraint, named_call_and_nothing_to_constrain) {
    HarmonyConstraintSpec spec;
    spec.tools = {tool("f", R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})", false)};
    EXPECT_EQ(make_harmony_constraint(T(), spec), nullptr) << "unconstrained requests pay nothing";
    spec.forced = {true, "f"};
    Driver d(make_harmony_constraint(T(), spec));  // the prompt ends with the whole header
    d.feed("{\"n\":12}");
    EXPECT_TRUE(d.allows(harmony::kCall));
}

TEST(harmony_constraint, errors_name_the_field) {
    HarmonyConstraintSpec spec;
    spec.tools = {tool("f", R"({"type":"object","properties":{"n":{"type":"integer","maximum":3}}})", true)};
    try {
        make_harmony_constraint(T(), spec);
        FAIL() << "no error";
    } catch (const ApiError& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_EQ(e.param, "tools[0].parameters");
        EXPECT_EQ(std::string(e.what()),
                  "tools[0].parameters: unsupported JSON Schema keyword 'maximum' at #/properties/n");
    }
}

TEST(raw_constraint, completions_end_only_when_complete) {
    OutputFormat f;
    f.kind = OutputFormat::Kind::regex;
    f.text = "[0-9]{2}";
    f.param = "guided_regex";
    Driver d(make_raw_constraint(T(), f, {199999}));
    ASSERT_TRUE(d.masked());
    EXPECT_FALSE(d.allows(199999));
    d.feed("4");
    EXPECT_FALSE(d.allows(199999));
    d.feed("2");
    EXPECT_TRUE(d.allows(199999));
    EXPECT_FALSE(d.allows(ids("1")[0]));
}

}  // namespace
}  // namespace osprey::frontend
