// Chat and responses request members -> Harmony values (see harmony_fields.h).
#include "server/harmony_fields.h"

#include <cctype>

#include "server/api_error.h"
#include "server/json_fields.h"

namespace osprey::server {

using namespace harmony;

namespace {

bool valid_function_name(const std::string& name) {
    if (name.empty() || name.size() > 64) return false;
    for (char c : name)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
    return true;
}

}  // namespace

ReasoningEffort parse_effort(const json::Value& value, const std::string& param) {
    if (!value.is_string()) wrong_type(param, "a string", value);
    const std::string& s = value.as_string();
    if (s == "low" || s == "minimal") return ReasoningEffort::low;
    if (s == "medium") return ReasoningEffort::medium;
    if (s == "high") return ReasoningEffort::high;
    bad_param(param, "must be one of 'low', 'medium', 'high', got '" + s.substr(0, 40) + "'");
}

ToolDescription parse_function(const json::Value& value, const std::string& param,
                               std::initializer_list<std::string_view> extra_keys) {
    Fields f(value, param);
    f.ignore(extra_keys);
    ToolDescription t;
    auto name = f.string("name");
    if (!name) bad_param(f.path("name"), "required", "missing_required_parameter");
    if (!valid_function_name(*name))
        bad_param(f.path("name"), "must be 1-64 characters of a-z, A-Z, 0-9, '_', '-' or '.'");
    t.name = *name;
    if (auto d = f.string("description")) t.description = *d;
    if (const json::Value* p = f.get("parameters")) {
        if (!p->is_object()) wrong_type(f.path("parameters"), "a JSON schema object", *p);
        t.parameters = *p;
    }
    if (const json::Value* s = f.get("strict"); s && !s->is_null()) {
        if (!s->is_bool()) wrong_type(f.path("strict"), "a boolean", *s);
        t.strict = s->as_bool();
    }
    f.finish();
    return t;
}

std::string content_text(const json::Value& value, const std::string& param,
                         std::initializer_list<std::string_view> text_types) {
    if (value.is_string()) return value.as_string();
    if (!value.is_array()) wrong_type(param, "a string or an array of content parts", value);
    std::string text;
    for (size_t i = 0; i < value.size(); ++i) {
        const std::string path = str(param, "[", i, "]");
        Fields part(value.as_array()[i], path);
        auto type = part.string("type");
        if (!type) bad_param(part.path("type"), "required", "missing_required_parameter");
        bool ok = false;
        for (std::string_view t : text_types) ok = ok || *type == t;
        if (!ok)
            bad_param(part.path("type"), "content part type '" + type->substr(0, 40) +
                                             "' is not supported (this model reads text only)");
        auto t = part.string("text");
        if (!t) bad_param(part.path("text"), "required", "missing_required_parameter");
        part.ignore({"annotations", "logprobs"});
        part.finish();
        text += *t;
    }
    return text;
}

frontend::ForcedCall apply_tool_choice(const json::Value& choice, bool nested_name,
                                       std::vector<harmony::ToolDescription>& tools, bool& tools_enabled) {
    frontend::ForcedCall forced;
    if (choice.is_string()) {
        const std::string& c = choice.as_string();
        if (c == "none") {
            tools_enabled = false;
            tools.clear();
        } else if (c == "required") {
            forced.on = true;
        } else if (c != "auto") {
            bad_param("tool_choice", std::string("must be 'none', 'auto', 'required' or {\"type\": \"function\", ") +
                                         (nested_name ? "...}" : "\"name\": ...}"));
        }
    } else if (choice.is_object()) {
        Fields cf(choice, "tool_choice");
        auto type = cf.string("type");
        if (!type || *type != "function") bad_param("tool_choice.type", "must be 'function'");
        const std::string name_path = nested_name ? "tool_choice.function.name" : "tool_choice.name";
        std::optional<std::string> name;
        if (nested_name) {
            const json::Value* fn = cf.object("function");
            if (!fn) bad_param("tool_choice.function", "required", "missing_required_parameter");
            Fields ff(*fn, "tool_choice.function");
            name = ff.string("name");
            if (!name) bad_param(name_path, "required", "missing_required_parameter");
            ff.finish();
        } else {
            name = cf.string("name");
            if (!name) bad_param(name_path, "required", "missing_required_parameter");
        }
        cf.finish();
        std::vector<harmony::ToolDescription> chosen;
        for (auto& t : tools)
            if (t.name == *name) chosen.push_back(t);
        if (chosen.empty()) bad_param(name_path, "no tool named '" + *name + "' in tools");
        tools = std::move(chosen);
        forced = {true, *name};
    } else {
        wrong_type("tool_choice", "a string or an object", choice);
    }
    if (forced.on && tools.empty()) bad_param("tool_choice", "'required' needs at least one function in tools");
    return forced;
}

}  // namespace osprey::server
