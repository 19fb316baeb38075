// Chat requests -> Harmony (src/server/chat_request.h) and the validation of sampling parameters
// (src/server/generation_fields.h, src/frontend/generation_params.h): the rendered prompt of tool
// history and reasoning, and errors that name the field.
#include <gtest/gtest.h>

#include "harmony/render.h"
#include "server/api_error.h"
#include "server/chat_request.h"

namespace osprey::server {
namespace {

using frontend::Api;
using frontend::GenerationParams;
using frontend::resolve_max_tokens;

ChatRequest parse(const std::string& text) { return parse_chat_request(json::parse(text), GenerationLimits{}); }

std::string rendered(const std::string& text) { return harmony::render_for_completion(parse(text).conversation).text(); }

TEST(ChatRequest, SystemAndDeveloperBecomeInstructionsWithTheEffort) {
    const std::string t = rendered(R"({"model": "m", "reasoning_effort": "high", "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "developer", "content": [{"type": "text", "text": "No emoji."}]},
        {"role": "user", "content": "Hi"}]})");
    EXPECT_NE(t.find("Reasoning: high"), std::string::npos) << t;
    EXPECT_NE(t.find("<|start|>developer<|message|># Instructions\n\nBe brief.\n\nNo emoji.<|end|>"), std::string::npos) << t;
    EXPECT_NE(t.find("Current date: "), std::string::npos);
    const std::string tail = "<|start|>user<|message|>Hi<|end|><|start|>assistant";
    EXPECT_EQ(t.substr(t.size() - tail.size()), tail);
}

TEST(ChatRequest, ReasoningObjectSpellingIsAccepted) {
    const std::string t = rendered(R"({"model": "m", "reasoning": {"effort": "low"}, "messages": [{"role": "user", "content": "Hi"}]})");
    EXPECT_NE(t.find("Reasoning: low"), std::string::npos);
}

TEST(ChatRequest, ToolHistoryRendersAsHarmonyCallsAndResults) {
    const std::string t = rendered(R"({"model": "m", "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": null, "reasoning_content": "Use the tool.",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 20}"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]})");
    EXPECT_NE(t.find("namespace functions {"), std::string::npos) << t;
    EXPECT_NE(t.find("type get_weather = (_: {\ncity?: string,\n}) => any;"), std::string::npos) << t;
    EXPECT_NE(t.find("<|start|>assistant<|channel|>analysis<|message|>Use the tool.<|end|>"), std::string::npos) << t;
    EXPECT_NE(t.find("<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>"
                     "{\"city\":\"Paris\"}<|call|>"),
              std::string::npos)
        << t;
    EXPECT_NE(t.find("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{\"temp\": 20}<|end|>"),
              std::string::npos)
        << t;
}

TEST(ChatRequest, EarlierReasoningBeforeAFinalAnswerIsDropped) {
    const std::string t = rendered(R"({"model": "m", "messages": [
        {"role": "user", "content": "Q1"}, {"role": "assistant", "reasoning_content": "think 1", "content": "A1"},
        {"role": "user", "content": "Q2"}]})");
    EXPECT_EQ(t.find("think 1"), std::string::npos) << t;
    EXPECT_NE(t.find("<|start|>assistant<|channel|>final<|message|>A1<|end|>"), std::string::npos) << t;
}

TEST(ChatRequest, ToolChoice) {
    const std::string tools = R"("tools": [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}}])";
    ChatRequest none = parse(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "none", )" + tools + "}");
    EXPECT_FALSE(none.tools_enabled);
    EXPECT_TRUE(none.tool_names.empty());
    ChatRequest named = parse(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], )" + tools +
                              R"(, "tool_choice": {"type": "function", "function": {"name": "b"}}})");
    EXPECT_EQ(named.tool_names, std::vector<std::string>{"b"});
}

TEST(ChatRequest, SamplingParametersMapOntoTheEngine) {
    ChatRequest r = parse(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0.5,
        "top_p": 0.9, "top_k": 40, "min_p": 0.05, "max_completion_tokens": 17, "stop": ["a", "b"], "seed": 42, "n": 3,
        "logprobs": true, "top_logprobs": 4, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "logit_bias": {"100": 5, "7": -100}, "stream": true, "stream_options": {"include_usage": true}})");
    const GenerationParams& p = r.params;
    EXPECT_FLOAT_EQ(p.sampling.temperature, 0.5f);
    EXPECT_FLOAT_EQ(p.sampling.top_p, 0.9f);
    EXPECT_EQ(p.sampling.top_k, 40);
    EXPECT_FLOAT_EQ(p.sampling.min_p, 0.05f);
    EXPECT_EQ(*p.max_tokens, 17);
    EXPECT_EQ(p.stop, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(p.sampling.seed, 42u);
    EXPECT_EQ(p.n, 3);
    EXPECT_TRUE(p.sampling.logprobs);
    EXPECT_EQ(p.sampling.top_logprobs, 4);
    EXPECT_FLOAT_EQ(p.sampling.presence_penalty, 0.5f);
    EXPECT_FLOAT_EQ(p.sampling.frequency_penalty, -0.5f);
    ASSERT_EQ(p.sampling.logit_bias.size(), 2u);
    EXPECT_EQ(p.sampling.logit_bias[0], (std::pair<int32_t, float>{100, 5.0f}));
    EXPECT_TRUE(p.stream);
    EXPECT_TRUE(p.include_usage);
    EXPECT_EQ(resolve_max_tokens(p, Api::chat, 10, 100, "messages"), 17);
    EXPECT_THROW(resolve_max_tokens(p, Api::chat, 90, 100, "messages"), ApiError);
    GenerationParams unlimited;
    EXPECT_EQ(resolve_max_tokens(unlimited, Api::chat, 10, 100, "messages"), 90);
    EXPECT_EQ(resolve_max_tokens(unlimited, Api::chat, 10, 100, "messages", 50), 50);   // --default-max-tokens
    EXPECT_EQ(resolve_max_tokens(unlimited, Api::chat, 10, 100, "messages", 500), 90);  // capped by the context
    try {
        resolve_max_tokens(unlimited, Api::chat, 100, 100, "messages");
        ADD_FAILURE() << "a prompt that fills the context was accepted";
    } catch (const ApiError& e) {
        EXPECT_EQ(e.param, "messages");
        EXPECT_EQ(e.code, "context_length_exceeded");
    }
}

// vLLM's extras (issue 15): mapped onto the engine request, their bad values named.
TEST(ChatRequest, VllmExtrasMapOntoTheEngine) {
    ChatRequest r = parse(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 20,
        "min_tokens": 5, "stop_token_ids": [7, 200002], "skip_special_tokens": false, "include_stop_str_in_output": true,
        "priority": -3, "request_id": "abc-1", "chat_template_kwargs": {"reasoning_effort": "high", "other": 1}})");
    EXPECT_NE(harmony::render_for_completion(r.conversation).text().find("Reasoning: high"), std::string::npos);
    EXPECT_EQ(r.params.request_id, "abc-1");
    EXPECT_FALSE(r.params.skip_special_tokens);
    EXPECT_TRUE(r.params.include_stop_str_in_output);
    engine::Request request;
    request.max_new_tokens = 20;
    request.stop_token_ids = {200002, 200012};
    frontend::apply_to_request(r.params, request);
    EXPECT_EQ(request.min_tokens, 5);
    EXPECT_EQ(request.priority, 3);  // vLLM: lower first; the engine: higher first
    EXPECT_EQ(request.stop_token_ids, (std::vector<int32_t>{200002, 200012, 7}));
    EXPECT_EQ(request.prompt_logprobs, -1);

    const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
    const std::pair<std::string, std::string> cases[] = {
        {R"({"model": "m", "max_tokens": 4, "min_tokens": 5, )" + user + "}", "min_tokens"},
        {R"({"model": "m", "stop_token_ids": [1, -1], )" + user + "}", "stop_token_ids[1]"},
        {R"({"model": "m", "stop_token_ids": 5, )" + user + "}", "stop_token_ids"},
        {R"({"model": "m", "priority": 1.5, )" + user + "}", "priority"},
        {R"({"model": "m", "request_id": "", )" + user + "}", "request_id"},
        {R"({"model": "m", "chat_template_kwargs": {"reasoning_effort": "max"}, )" + user + "}",
         "chat_template_kwargs.reasoning_effort"},
        {R"({"model": "m", "chat_template_kwargs": [], )" + user + "}", "chat_template_kwargs"},
    };
    for (const auto& [body, param] : cases) {
        try {
            parse(body);
            ADD_FAILURE() << "accepted: " << body;
        } catch (const ApiError& e) {
            EXPECT_EQ(e.status, 400) << body;
            EXPECT_EQ(e.param, param) << body << ": " << e.what();
        }
    }
}

TEST(ChatRequest, ErrorsNameTheField) {
    const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
    const std::pair<std::string, std::string> cases[] = {
        {R"({"messages": [{"role": "user", "content": "x"}]})", "model"},
        {R"({"model": "m"})", "messages"},
        {R"({"model": "m", "messages": []})", "messages"},
        {R"({"model": "m", "messages": [{"content": "x"}]})", "messages[0].role"},
        {R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages[0].content[0].type"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x", "extra": 1}]})", "messages[0].extra"},
        {R"({"model": "m", "temperature": 3, )" + user + "}", "temperature"},
        {R"({"model": "m", "temperature": "1", )" + user + "}", "temperature"},
        {R"({"model": "m", "max_tokens": 0, )" + user + "}", "max_tokens"},
        {R"({"model": "m", "max_tokens": 1.5, )" + user + "}", "max_tokens"},
        {R"({"model": "m", "n": 0, )" + user + "}", "n"},
        {R"({"model": "m", "stop": 5, )" + user + "}", "stop"},
        {R"({"model": "m", "stop": ["ok", ""], )" + user + "}", "stop[1]"},
        {R"({"model": "m", "logit_bias": {"x": 1}, )" + user + "}", "logit_bias.x"},
        {R"({"model": "m", "logit_bias": {"5": 101}, )" + user + "}", "logit_bias.5"},
        {R"({"model": "m", "top_logprobs": 3, )" + user + "}", "top_logprobs"},
        {R"({"model": "m", "stream_options": {"include_usage": true}, )" + user + "}", "stream_options"},
        {R"({"model": "m", "tools": [{"type": "function", "function": {"name": "bad name"}}], )" + user + "}",
         "tools[0].function.name"},
        {R"({"model": "m", "tool_choice": {"type": "function", "function": {"name": "zz"}}, )" + user + "}",
         "tool_choice.function.name"},
        {R"({"model": "m", "response_format": {"type": "json_schema"}, )" + user + "}", "response_format.json_schema"},
        {R"({"model": "m", "response_format": {"type": "yaml"}, )" + user + "}", "response_format.type"},
        {R"({"model": "m", "guided_regex": "a", "guided_choice": ["a"], )" + user + "}", "guided_choice"},
        {R"({"model": "m", "best_of": 2, )" + user + "}", "best_of"},
    };
    for (const auto& [body, param] : cases) {
        try {
            parse(body);
            ADD_FAILURE() << "accepted: " << body;
        } catch (const ApiError& e) {
            EXPECT_EQ(e.status, 400) << body;
            EXPECT_EQ(e.param, param) << body << ": " << e.what();
            EXPECT_NE(std::string(e.what()).find(param), std::string::npos) << e.what();
        }
    }
}

}  // namespace
}  // namespace osprey::server
