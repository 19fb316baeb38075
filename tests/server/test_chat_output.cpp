// The Harmony front end's output side on scripted token sequences (src/server/chat_output.h): what a
// client sees for reasoning, answers, tool calls, stop strings and malformed model output.
#include <gtest/gtest.h>

#include <random>

#include "core/json.h"
#include "harmony/special_tokens.h"
#include "server/chat_output.h"
#include "server/stop_strings.h"
#include "server_test_util.h"

namespace osprey::server {
namespace {

using test::harmony_tokenizer;

// Runs `text` (Harmony, special tokens allowed) through a ChatOutput token by token, as the engine
// would: a trailing <|return|> / <|call|> is the stop token given to finish(), not a token.
struct OutputRun {
    ChatDelta all;
    std::vector<ChatDelta> deltas;
    std::string finish_reason;
    int n_reasoning_tokens = 0;
    bool stopped = false;
};

OutputRun run(const std::string& text, ChatOutputOptions options = {}, engine::FinishReason reason = engine::FinishReason::stop) {
    std::vector<int32_t> ids = harmony_tokenizer().encode(text, tok::Specials::allowed);
    int32_t stop = -1;
    if (!ids.empty() && (ids.back() == harmony::kReturn || ids.back() == harmony::kCall)) {
        stop = ids.back();
        ids.pop_back();
    }
    ChatOutput out(harmony_tokenizer(), options);
    OutputRun r;
    auto add = [&](ChatDelta d) {
        r.all.reasoning += d.reasoning;
        r.all.content += d.content;
        for (auto& c : d.tool_calls) r.all.tool_calls.push_back(c);
        if (!d.empty()) r.deltas.push_back(std::move(d));
    };
    for (int32_t id : ids) {
        add(out.push(id));
        if (out.stopped()) break;
    }
    add(out.finish(stop));
    r.finish_reason = out.finish_reason(reason);
    r.n_reasoning_tokens = out.n_reasoning_tokens();
    r.stopped = out.stopped();
    EXPECT_EQ(r.all.reasoning, out.reasoning());
    EXPECT_EQ(r.all.content, out.content());
    return r;
}

TEST(ChatOutput, AnalysisThenFinal) {
    const OutputRun r = run(
        "<|channel|>analysis<|message|>User asks 2+2. Simple.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = "
        "4.<|return|>");
    EXPECT_EQ(r.all.reasoning, "User asks 2+2. Simple.");
    EXPECT_EQ(r.all.content, "2 + 2 = 4.");
    EXPECT_TRUE(r.all.tool_calls.empty());
    EXPECT_EQ(r.finish_reason, "stop");
    EXPECT_GE(r.deltas.size(), 4u);  // streamed in pieces, not at the end
    EXPECT_GT(r.n_reasoning_tokens, 5);
    EXPECT_LT(r.n_reasoning_tokens, 20);
}

TEST(ChatOutput, ToolCallWithReasoningAndPreamble) {
    ChatOutputOptions o;
    o.tool_names = {"get_weather"};
    const OutputRun r = run(
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary<|message|>Let me "
        "check.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>"
        "{\"city\": \"Paris\"}<|call|>",
        o);
    EXPECT_EQ(r.all.reasoning, "Need the weather.");
    EXPECT_EQ(r.all.content, "Let me check.");
    ASSERT_EQ(r.all.tool_calls.size(), 1u);
    EXPECT_EQ(r.all.tool_calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(r.all.tool_calls[0].arguments), json::parse("{\"city\": \"Paris\"}"));
    EXPECT_EQ(r.all.tool_calls[0].id.rfind("call_", 0), 0u);
    EXPECT_EQ(r.finish_reason, "tool_calls");
}

TEST(ChatOutput, ToolCallWithRecipientAfterTheChannelAndGluedJson) {
    ChatOutputOptions o;
    o.tool_names = {"lookup"};
    const OutputRun r = run("<|channel|>commentary to=functions.lookupjson<|message|>{\"q\": [1, 2]}<|call|>", o);
    ASSERT_EQ(r.all.tool_calls.size(), 1u);
    EXPECT_EQ(r.all.tool_calls[0].name, "lookup");
    EXPECT_EQ(r.all.tool_calls[0].arguments, "{\"q\": [1, 2]}");
}

TEST(ChatOutput, EmptyArgumentsBecomeAnEmptyObject) {
    const OutputRun r = run("<|channel|>commentary to=functions.now <|constrain|>json<|message|><|call|>");
    ASSERT_EQ(r.all.tool_calls.size(), 1u);
    EXPECT_EQ(r.all.tool_calls[0].arguments, "{}");
}

TEST(ChatOutput, ArgumentsThatAreNotJsonAreReportedAsContent) {
    const OutputRun r = run("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"city\": Par<|call|>");
    EXPECT_TRUE(r.all.tool_calls.empty());
    EXPECT_EQ(r.all.content, "{\"city\": Par");
    EXPECT_EQ(r.finish_reason, "stop");
}

TEST(ChatOutput, ToolChoiceNoneReportsCallsAsContent) {
    ChatOutputOptions o;
    o.tools_enabled = false;
    const OutputRun r = run("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>", o);
    EXPECT_TRUE(r.all.tool_calls.empty());
    EXPECT_EQ(r.all.content, "{}");
}

TEST(ChatOutput, LengthFinishKeepsWhatWasGenerated) {
    const OutputRun r = run("<|channel|>final<|message|>Partial answ", {}, engine::FinishReason::length);
    EXPECT_EQ(r.all.content, "Partial answ");
    EXPECT_EQ(r.finish_reason, "length");
}

TEST(ChatOutput, StopStringCutsTheContentAndStops) {
    ChatOutputOptions o;
    o.stop = {"STOP"};
    const OutputRun r = run("<|channel|>final<|message|>one two STOP three four<|return|>", o);
    EXPECT_EQ(r.all.content, "one two ");
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.finish_reason, "stop");
}

TEST(ChatOutput, HeaderOnlyMessageIsRecovered) {
    const OutputRun r = run("I must refuse<|end|>");
    EXPECT_EQ(r.all.content, "I must refuse");
}

TEST(ChatOutput, RandomTokensNeverThrowAndStayValidUtf8) {
    std::mt19937 rng(7);
    const int vocab = harmony_tokenizer().vocab_size();
    const int32_t specials[] = {harmony::kStart, harmony::kEnd, harmony::kMessage, harmony::kChannel,
                                harmony::kConstrain, harmony::kReturn, harmony::kCall};
    for (int trial = 0; trial < 200; ++trial) {
        ChatOutputOptions o;
        o.stop = {"ab"};
        ChatOutput out(harmony_tokenizer(), o);
        std::string all;
        for (int i = 0; i < 60; ++i) {
            const int32_t id = rng() % 3 == 0 ? specials[rng() % 7] : int32_t(rng() % uint32_t(vocab + 10));
            ChatDelta d;
            ASSERT_NO_THROW(d = out.push(id));
            all += d.content + d.reasoning;
            for (const auto& c : d.tool_calls) ASSERT_NO_THROW(json::parse(c.arguments));
        }
        ChatDelta d;
        ASSERT_NO_THROW(d = out.finish(harmony::kCall));
        all += d.content + d.reasoning;
        EXPECT_EQ(json::parse(json::quote(all)).as_string(), all);  // valid UTF-8 round trip
    }
}

TEST(StopStrings, HoldsBackPossibleStartsOnly) {
    StopStrings s({"</end>", "xyz"});
    EXPECT_EQ(s.push("hello <"), "hello ");
    EXPECT_EQ(s.push("/en"), "");
    EXPECT_EQ(s.push("x"), "</en");  // "x" may start "xyz"
    EXPECT_EQ(s.push("y"), "");
    EXPECT_EQ(s.push("z tail"), "");
    EXPECT_TRUE(s.matched());
    EXPECT_EQ(s.flush(), "");
    StopStrings none;
    EXPECT_EQ(none.push("abc"), "abc");
    StopStrings t({"zz"});
    EXPECT_EQ(t.push("az"), "a");
    EXPECT_EQ(t.flush(), "z");
}

}  // namespace
}  // namespace osprey::server
