// The Harmony front end's output side on scripted token sequences (src/frontend/chat_output.h): what a
// client sees for reasoning, answers, tool calls, stop strings and malformed model output.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core/json.h"
#include "harmony/special_tokens.h"
#include "frontend/chat_output.h"
#include "frontend/harmony_prompt.h"
#include "frontend/json_prefix.h"
#include "frontend/stop_strings.h"
#include "tokenizer/tokenizer_fixture.h"

namespace osprey::frontend {
namespace {

const tok::Tokenizer& harmony_tokenizer() { return tok::test::o200k(); }

// Runs `text` (Harmony, special tokens allowed) through a ChatOutput token by token, as the engine
// would: a trailing <|return|> / <|call|> is the stop token given to finish(), not a token.
struct OutputRun {
    ChatDelta all;
    std::vector<ToolCall> streamed;  // the call pieces accumulated as an OpenAI client does, by index
    std::vector<int> n_pieces;       // argument pieces per streamed call
    std::vector<ChatDelta> deltas;
    std::string finish_reason;
    int n_reasoning_tokens = 0;
    bool stopped = false;
};

void accumulate(OutputRun& r, const ToolCallDelta& piece) {
    if (!piece.id.empty()) {  // a new call: the next index, arguments ""
        EXPECT_EQ(piece.index, int(r.streamed.size()));
        EXPECT_EQ(piece.arguments, "");
        r.streamed.push_back({piece.id, piece.name, ""});
        r.n_pieces.push_back(0);
        return;
    }
    ASSERT_GE(piece.index, 0);
    ASSERT_LT(piece.index, int(r.streamed.size()));
    EXPECT_FALSE(piece.arguments.empty());
    r.streamed[size_t(piece.index)].arguments += piece.arguments;
    ++r.n_pieces[size_t(piece.index)];
}

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
        for (const ToolCallDelta& piece : d.call_deltas) accumulate(r, piece);
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
    // Every complete call was streamed under its id with the same arguments; every streamed call's
    // arguments are a viable JSON prefix at least.
    for (const ToolCall& call : r.all.tool_calls) {
        const auto it = std::find_if(r.streamed.begin(), r.streamed.end(), [&](const ToolCall& s) { return s.id == call.id; });
        EXPECT_TRUE(it != r.streamed.end()) << call.id;
        if (it != r.streamed.end()) {
            EXPECT_EQ(it->name, call.name);
            EXPECT_EQ(it->arguments, call.arguments);
        }
    }
    for (const ToolCall& s : r.streamed) {
        JsonPrefix p;
        EXPECT_EQ(p.push(s.arguments), s.arguments.size()) << s.arguments;
    }
    return r;
}

// tool_choice forcing: the prompt ends with the call's header; ChatOutput is primed with those tokens
// and then sees only the model's continuation.
TEST(ChatOutput, ForcedCallHeaderPrimesTheParser) {
    const auto& tk = harmony_tokenizer();
    const std::vector<int32_t> named = forced_call_tokens(tk, {true, "get_weather"});
    EXPECT_EQ(tk.decode_bytes(named), "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>");
    const std::vector<int32_t> any = forced_call_tokens(tk, {true, ""});
    EXPECT_EQ(tk.decode_bytes(any), "<|channel|>commentary to=functions.");

    ChatOutputOptions o;
    o.tool_names = {"get_weather", "get_time"};
    for (const bool by_name : {true, false}) {
        ChatOutput out(tk, o);
        out.prime(by_name ? named : any);
        const std::string rest = by_name ? "{\"city\": \"Paris\"}" : "get_time <|constrain|>json<|message|>{}";
        const std::vector<int32_t> ids = tk.encode(rest, tok::Specials::allowed);
        ChatDelta d = out.push(ids[0]);
        if (by_name) {  // the primed header was complete: its call's first piece comes with the first token
            ASSERT_GE(d.call_deltas.size(), 1u);
            EXPECT_EQ(d.call_deltas[0].name, "get_weather");
            EXPECT_FALSE(d.call_deltas[0].id.empty());
        } else {
            EXPECT_TRUE(d.call_deltas.empty());
        }
        for (size_t i = 1; i < ids.size(); ++i) d.append(out.push(ids[i]));
        d.append(out.finish(harmony::kCall));
        ASSERT_EQ(out.tool_calls().size(), 1u) << (by_name ? "named" : "required");
        EXPECT_EQ(out.tool_calls()[0].name, by_name ? "get_weather" : "get_time");
        EXPECT_EQ(out.tool_calls()[0].arguments, by_name ? "{\"city\": \"Paris\"}" : "{}");
        EXPECT_EQ(out.content(), "");
        EXPECT_EQ(out.finish_reason(engine::FinishReason::stop), "tool_calls");
        EXPECT_EQ(out.n_reasoning_tokens(), 0);
    }
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
    ChatOutputOptions o;
    o.tool_names = {"now"};
    const OutputRun r = run("<|channel|>commentary to=functions.now <|constrain|>json<|message|><|call|>", o);
    ASSERT_EQ(r.all.tool_calls.size(), 1u);
    EXPECT_EQ(r.all.tool_calls[0].arguments, "{}");
}

// A call to a function the request did not declare (or with no tools at all) is no tool call: no
// client could run it. Its arguments text is the content, the finish reason "stop".
TEST(ChatOutput, CallToAnUndeclaredFunctionIsContent) {
    ChatOutputOptions o;
    o.tool_names = {"get_weather"};
    const std::string call = "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\": 1}<|call|>";
    for (const ChatOutputOptions& options : {o, ChatOutputOptions{}}) {
        const OutputRun r = run(call, options);
        EXPECT_TRUE(r.all.tool_calls.empty());
        EXPECT_TRUE(r.streamed.empty());
        EXPECT_EQ(r.all.content, "{\"tz\": 1}");
        EXPECT_EQ(r.finish_reason, "stop");
    }
}

TEST(ChatOutput, ArgumentsThatAreNotJsonAreReportedAsContent) {
    const OutputRun r = run("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"city\": Par<|call|>");
    EXPECT_TRUE(r.all.tool_calls.empty());
    EXPECT_EQ(r.all.content, "{\"city\": Par");
    EXPECT_EQ(r.finish_reason, "stop");
}

TEST(ChatOutput, CallArgumentsAreStreamedInPiecesThatAddUpToTheCall) {
    ChatOutputOptions o;
    o.tool_names = {"get_weather"};
    const OutputRun r = run(
        "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.get_weather<|channel|>"
        "commentary <|constrain|>json<|message|>{\"city\": \"Paris\", \"unit\": \"celsius\", \"days\": [1, 2, 3]}  "
        "<|call|>",
        o);
    ASSERT_EQ(r.all.tool_calls.size(), 1u);
    ASSERT_EQ(r.streamed.size(), 1u);
    EXPECT_EQ(r.streamed[0].id, r.all.tool_calls[0].id);
    EXPECT_EQ(r.streamed[0].name, "get_weather");
    EXPECT_EQ(r.streamed[0].arguments, "{\"city\": \"Paris\", \"unit\": \"celsius\", \"days\": [1, 2, 3]}");
    EXPECT_EQ(r.streamed[0].arguments, r.all.tool_calls[0].arguments);
    EXPECT_GE(r.n_pieces[0], 5);  // token by token, not in one piece at the end
    EXPECT_NO_THROW(json::parse(r.streamed[0].arguments));
    EXPECT_EQ(r.all.content, "Checking.");
    EXPECT_EQ(r.finish_reason, "tool_calls");
    // The call's first piece comes before the call message ends.
    size_t first = 0;
    while (first < r.deltas.size() && r.deltas[first].call_deltas.empty()) ++first;
    ASSERT_LT(first, r.deltas.size());
    EXPECT_TRUE(r.deltas[first].tool_calls.empty());
}

TEST(ChatOutput, CallThatTurnsInvalidStopsStreamingAndBecomesContent) {
    ChatOutputOptions o;
    o.tool_names = {"f"};
    const OutputRun r = run(
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"city\": Paris, \"x\": 1}<|call|>", o);
    EXPECT_TRUE(r.all.tool_calls.empty());
    ASSERT_EQ(r.streamed.size(), 1u);
    EXPECT_EQ(r.streamed[0].arguments, "{\"city\":");  // the viable prefix; nothing after 'P'
    EXPECT_EQ(r.all.content, "{\"city\": Paris, \"x\": 1}");  // as the non-streaming answer
    EXPECT_EQ(r.finish_reason, "stop");
}

TEST(ChatOutput, CallCutByLengthIsIncompleteWithFinishReasonLength) {
    ChatOutputOptions o;
    o.tool_names = {"f"};
    const OutputRun r = run("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"q\": \"long ans",
                            o, engine::FinishReason::length);
    EXPECT_TRUE(r.all.tool_calls.empty());
    ASSERT_EQ(r.streamed.size(), 1u);
    EXPECT_EQ(r.streamed[0].arguments, "{\"q\": \"long ans");
    EXPECT_EQ(r.all.content, "{\"q\": \"long ans");
    EXPECT_EQ(r.finish_reason, "length");
}

TEST(ChatOutput, TwoCallsInOneAnswerGetIndexesZeroAndOne) {
    ChatOutputOptions o;
    o.tool_names = {"get_weather", "get_time"};
    const OutputRun r = run(
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\": "
        "\"CET\"}<|call|>",
        o);
    ASSERT_EQ(r.all.tool_calls.size(), 2u);
    ASSERT_EQ(r.streamed.size(), 2u);  // accumulate() checked the indexes are 0 then 1
    EXPECT_EQ(r.streamed[0].name, "get_weather");
    EXPECT_EQ(r.streamed[0].arguments, "{\"city\": \"Paris\"}");
    EXPECT_EQ(r.streamed[1].name, "get_time");
    EXPECT_EQ(r.streamed[1].arguments, "{\"tz\": \"CET\"}");
    EXPECT_NE(r.streamed[0].id, r.streamed[1].id);
    EXPECT_EQ(r.finish_reason, "tool_calls");
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
        std::vector<std::string> streamed;
        for (int i = 0; i < 60; ++i) {
            const int32_t id = rng() % 3 == 0 ? specials[rng() % 7] : int32_t(rng() % uint32_t(vocab + 10));
            ChatDelta d;
            ASSERT_NO_THROW(d = out.push(id));
            all += d.content + d.reasoning;
            for (const auto& c : d.tool_calls) ASSERT_NO_THROW(json::parse(c.arguments));
            for (const auto& piece : d.call_deltas) {
                if (!piece.id.empty()) streamed.emplace_back();
                ASSERT_FALSE(streamed.empty());
                ASSERT_EQ(piece.index, int(streamed.size()) - 1);  // pieces of the call being generated
                streamed.back() += piece.arguments;
                JsonPrefix p;
                EXPECT_EQ(p.push(streamed.back()), streamed.back().size());
            }
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

// vLLM's include_stop_str_in_output: the matched stop string (the earliest, the longest at a tie)
// stays in the output.
TEST(StopStrings, IncludeStopKeepsTheMatchedString) {
    StopStrings s({"ab", "abc"}, /*include_stop=*/true);
    EXPECT_EQ(s.push("xxab"), "xxab");
    EXPECT_TRUE(s.matched());
    StopStrings t({"end"}, true);
    EXPECT_EQ(t.push("the e"), "the ");
    EXPECT_EQ(t.push("nd and more"), "end");
}

}  // namespace
}  // namespace osprey::frontend
