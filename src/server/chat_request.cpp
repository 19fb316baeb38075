// Chat completions request parsing (see chat_request.h).
#include "server/chat_request.h"

#include <map>

#include "server/api_error.h"
#include "server/format_fields.h"
#include "server/harmony_fields.h"
#include "server/json_fields.h"

namespace osprey::server {

using namespace harmony;
using frontend::Api;
using frontend::PromptSpec;
using frontend::tool_call_message;
using frontend::tool_result_message;

namespace {

// One assistant message: reasoning, content, tool calls (ids remembered for later tool messages).
void add_assistant(Fields& m, PromptSpec& spec, std::map<std::string, std::string>& call_names) {
    std::optional<std::string> reasoning;
    for (const char* key : {"reasoning_content", "reasoning", "thinking"}) {
        if (auto r = m.string(key); r && !r->empty() && !reasoning) reasoning = *r;
    }
    std::string content;
    if (const json::Value* c = m.get("content")) content = content_text(*c, m.path("content"), {"text", "output_text"});
    const json::Value* calls = m.array("tool_calls");
    m.ignore({"name", "refusal", "annotations", "audio", "function_call"});

    if (reasoning) spec.turns.push_back(Message::assistant(*reasoning, "analysis"));
    const bool has_calls = calls && calls->size() > 0;
    if (!content.empty()) spec.turns.push_back(Message::assistant(content, has_calls ? "commentary" : "final"));
    if (!calls) return;
    for (size_t i = 0; i < calls->size(); ++i) {
        Fields call(calls->as_array()[i], str(m.path("tool_calls"), "[", i, "]"));
        auto type = call.string("type");
        if (type && *type != "function") bad_param(call.path("type"), "must be 'function'");
        const json::Value* fn = call.object("function");
        if (!fn) bad_param(call.path("function"), "required", "missing_required_parameter");
        Fields f(*fn, call.path("function"));
        auto name = f.string("name");
        if (!name || name->empty()) bad_param(f.path("name"), "required", "missing_required_parameter");
        std::string arguments = "{}";
        if (auto a = f.string("arguments")) arguments = *a;
        f.finish();
        if (auto id = call.string("id")) call_names[*id] = *name;
        call.finish();
        spec.turns.push_back(tool_call_message(*name, arguments));
    }
}

}  // namespace

ChatRequest parse_chat_request(const json::Value& body, const GenerationLimits& limits) {
    Fields f(body, "");
    ChatRequest r;
    auto model = f.string("model");
    if (!model) bad_param("model", "required", "missing_required_parameter");
    r.model = *model;

    PromptSpec spec;
    // vLLM's chat_template_kwargs: gpt-oss's template reads reasoning_effort (and model_identity,
    // builtin_tools, which Harmony here does not take from the client: accepted, no effect).
    if (const json::Value* kwargs = f.object("chat_template_kwargs")) {
        Fields k(*kwargs, "chat_template_kwargs");
        if (auto e = k.get("reasoning_effort")) spec.effort = parse_effort(*e, "chat_template_kwargs.reasoning_effort");
        for (const auto& [key, value] : kwargs->as_object()) k.ignore({key});
    }
    if (auto e = f.get("reasoning_effort")) spec.effort = parse_effort(*e, "reasoning_effort");
    if (const json::Value* reasoning = f.object("reasoning")) {
        Fields rf(*reasoning, "reasoning");
        if (auto e = rf.get("effort")) spec.effort = parse_effort(*e, "reasoning.effort");
        rf.ignore({"summary", "generate_summary"});
        rf.finish();
    }

    // Tools and tool_choice.
    std::vector<ToolDescription> tools;
    if (const json::Value* ts = f.array("tools")) {
        for (size_t i = 0; i < ts->size(); ++i) {
            const std::string path = str("tools[", i, "]");
            Fields t(ts->as_array()[i], path);
            auto type = t.string("type");
            if (!type || *type != "function") bad_param(t.path("type"), "must be 'function'");
            const json::Value* fn = t.object("function");
            if (!fn) bad_param(t.path("function"), "required", "missing_required_parameter");
            tools.push_back(parse_function(*fn, t.path("function")));
            t.finish();
            for (size_t j = 0; j + 1 < tools.size(); ++j)
                if (tools[j].name == tools.back().name) bad_param(path, "duplicate function name '" + tools[j].name + "'");
        }
    }
    if (const json::Value* choice = f.get("tool_choice"))
        r.forced = apply_tool_choice(*choice, /*nested_name=*/true, tools, r.tools_enabled);
    for (const auto& t : tools) r.tool_names.push_back(t.name);
    r.tools = tools;
    spec.tools = std::move(tools);
    r.format = parse_output_format(f);

    const json::Value* messages = f.array("messages");
    if (!messages) bad_param("messages", "required", "missing_required_parameter");
    if (messages->size() == 0) bad_param("messages", "must contain at least one message");
    std::map<std::string, std::string> call_names;  // tool_call id -> function name
    for (size_t i = 0; i < messages->size(); ++i) {
        Fields m(messages->as_array()[i], str("messages[", i, "]"));
        auto role = m.string("role");
        if (!role) bad_param(m.path("role"), "required", "missing_required_parameter");
        if (*role == "system" || *role == "developer") {
            const json::Value* c = m.get("content");
            if (!c) bad_param(m.path("content"), "required", "missing_required_parameter");
            spec.instructions.push_back(content_text(*c, m.path("content")));
            m.ignore({"name"});
        } else if (*role == "user") {
            const json::Value* c = m.get("content");
            if (!c) bad_param(m.path("content"), "required", "missing_required_parameter");
            spec.turns.push_back(Message::user(content_text(*c, m.path("content"))));
            m.ignore({"name"});
        } else if (*role == "assistant") {
            add_assistant(m, spec, call_names);
        } else if (*role == "tool") {
            const json::Value* c = m.get("content");
            if (!c) bad_param(m.path("content"), "required", "missing_required_parameter");
            const std::string output = content_text(*c, m.path("content"));
            auto id = m.string("tool_call_id");
            auto name = m.string("name");
            std::string fn;
            if (id && call_names.count(*id)) {
                fn = call_names[*id];
            } else if (name && !name->empty()) {
                fn = *name;
            } else if (!id) {
                bad_param(m.path("tool_call_id"), "required", "missing_required_parameter");
            } else {
                bad_param(m.path("tool_call_id"), "'" + id->substr(0, 64) + "' matches no earlier assistant tool call");
            }
            spec.turns.push_back(tool_result_message(fn, output));
        } else {
            bad_param(m.path("role"), "must be 'system', 'developer', 'user', 'assistant' or 'tool', got '" +
                                          role->substr(0, 40) + "'");
        }
        m.finish();
    }

    r.params = parse_generation_params(f, Api::chat, limits);
    // Accepted for compatibility; they change nothing here.
    f.ignore({"user", "metadata", "store", "service_tier", "parallel_tool_calls", "modalities", "prompt_cache_key",
              "safety_identifier", "verbosity"});
    f.finish();
    r.conversation = frontend::build_conversation(spec);
    return r;
}

}  // namespace osprey::server
