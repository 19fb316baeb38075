// Conversation JSON <-> harmony data model (the openai-harmony Python Conversation JSON).
#include "harmony/conversation_json.h"

#include <initializer_list>

#include "core/check.h"
#include "harmony/schema_typescript.h"

namespace osprey::harmony {

namespace {

using json::Value;

void expect(const Value& v, json::Type want, const std::string& path) {
    OSPREY_CHECK(v.type() == want, path, ": expected a JSON ", json::type_name(want), ", got ",
                 json::type_name(v.type()));
}

// Rejects keys outside `known` (typos must not be silently ignored).
void check_keys(const Value& obj, std::initializer_list<std::string_view> known, const std::string& path) {
    for (const auto& [key, v] : obj.as_object()) {
        bool ok = false;
        for (std::string_view k : known) ok = ok || k == key;
        OSPREY_CHECK(ok, path, ": unknown field '", key, "'");
    }
}

std::string get_string(const Value& obj, std::string_view key, const std::string& path) {
    const Value* v = obj.find(key);
    OSPREY_CHECK(v != nullptr, path, ": missing field '", key, "'");
    expect(*v, json::Type::string, path + "." + std::string(key));
    return v->as_string();
}

// Absent or null -> nullopt; otherwise a string.
std::optional<std::string> get_optional_string(const Value& obj, std::string_view key, const std::string& path) {
    const Value* v = obj.find(key);
    if (!v || v->is_null()) return std::nullopt;
    expect(*v, json::Type::string, path + "." + std::string(key));
    return v->as_string();
}

ToolDescription tool_from_json(const Value& v, const std::string& path) {
    expect(v, json::Type::object, path);
    check_keys(v, {"name", "description", "parameters"}, path);
    ToolDescription t;
    t.name = get_string(v, "name", path);
    t.description = get_string(v, "description", path);
    if (const Value* p = v.find("parameters"); p && !p->is_null()) {
        validate_schema(*p, path + ".parameters");
        t.parameters = *p;
    }
    return t;
}

std::optional<ToolNamespaces> namespaces_from_json(const Value& obj, const std::string& path) {
    const Value* v = obj.find("tools");
    if (!v || v->is_null()) return std::nullopt;
    const std::string tp = path + ".tools";
    expect(*v, json::Type::object, tp);
    ToolNamespaces out;
    for (const auto& [key, nsv] : v->as_object()) {
        const std::string p = tp + "." + key;
        expect(nsv, json::Type::object, p);
        check_keys(nsv, {"name", "description", "tools"}, p);
        ToolNamespace ns;
        ns.name = get_string(nsv, "name", p);
        ns.description = get_optional_string(nsv, "description", p);
        const Value* tools = nsv.find("tools");
        OSPREY_CHECK(tools != nullptr, p, ": missing field 'tools' (use [] for a namespace without functions)");
        expect(*tools, json::Type::array, p + ".tools");
        for (size_t i = 0; i < tools->size(); ++i)
            ns.tools.push_back(tool_from_json(tools->as_array()[i], p + ".tools[" + std::to_string(i) + "]"));
        out[key] = std::move(ns);
    }
    return out;
}

ReasoningEffort effort_from_json(const Value& v, const std::string& path) {
    expect(v, json::Type::string, path);
    const std::string& s = v.as_string();
    if (s == "Low" || s == "low") return ReasoningEffort::low;
    if (s == "Medium" || s == "medium") return ReasoningEffort::medium;
    if (s == "High" || s == "high") return ReasoningEffort::high;
    OSPREY_FAIL(path, ": unknown reasoning effort '", s, "' (expected Low, Medium or High)");
}

// A field present in `obj`: null clears it, otherwise it is parsed; absent keeps the default.
template <typename T, typename F>
void override_field(std::optional<T>& field, const Value& obj, std::string_view key, F&& parse) {
    const Value* v = obj.find(key);
    if (!v) return;
    if (v->is_null()) field.reset();
    else field = parse(*v);
}

SystemContent system_from_json(const Value& v, const std::string& path) {
    check_keys(v,
               {"type", "model_identity", "reasoning_effort", "tools", "conversation_start_date", "knowledge_cutoff",
                "channel_config"},
               path);
    SystemContent sys;
    auto str = [&](std::string_view key) {
        return [&, key](const Value& x) {
            expect(x, json::Type::string, path + "." + std::string(key));
            return x.as_string();
        };
    };
    override_field(sys.model_identity, v, "model_identity", str("model_identity"));
    override_field(sys.conversation_start_date, v, "conversation_start_date", str("conversation_start_date"));
    override_field(sys.knowledge_cutoff, v, "knowledge_cutoff", str("knowledge_cutoff"));
    override_field(sys.reasoning_effort, v, "reasoning_effort",
                   [&](const Value& x) { return effort_from_json(x, path + ".reasoning_effort"); });
    override_field(sys.channel_config, v, "channel_config", [&](const Value& x) {
        const std::string p = path + ".channel_config";
        expect(x, json::Type::object, p);
        check_keys(x, {"valid_channels", "channel_required"}, p);
        ChannelConfig cc;
        const Value* chans = x.find("valid_channels");
        OSPREY_CHECK(chans != nullptr, p, ": missing field 'valid_channels'");
        expect(*chans, json::Type::array, p + ".valid_channels");
        for (size_t i = 0; i < chans->size(); ++i) {
            const Value& c = chans->as_array()[i];
            expect(c, json::Type::string, p + ".valid_channels[" + std::to_string(i) + "]");
            cc.valid_channels.push_back(c.as_string());
        }
        const Value* req = x.find("channel_required");
        OSPREY_CHECK(req != nullptr, p, ": missing field 'channel_required'");
        expect(*req, json::Type::boolean, p + ".channel_required");
        cc.channel_required = req->as_bool();
        return cc;
    });
    sys.tools = namespaces_from_json(v, path);
    return sys;
}

DeveloperContent developer_from_json(const Value& v, const std::string& path) {
    check_keys(v, {"type", "instructions", "tools"}, path);
    DeveloperContent dev;
    dev.instructions = get_optional_string(v, "instructions", path);
    dev.tools = namespaces_from_json(v, path);
    return dev;
}

Content content_from_json(const Value& v, const std::string& path) {
    expect(v, json::Type::object, path);
    const std::string type = get_string(v, "type", path);
    if (type == "text") {
        check_keys(v, {"type", "text"}, path);
        return TextContent{get_string(v, "text", path)};
    }
    if (type == "system_content") return system_from_json(v, path);
    if (type == "developer_content") return developer_from_json(v, path);
    OSPREY_FAIL(path, ".type: unknown content type '", type, "' (expected text, system_content or developer_content)");
}

// One-member object (a braced one-pair initializer list trips GCC 12's -Warray-bounds at -O3).
json::Object object_with(std::string key, Value v) {
    json::Object o;
    o.emplace_back(std::move(key), std::move(v));
    return o;
}

Value optional_to_json(const std::optional<std::string>& s) { return s ? Value(*s) : Value(); }

Value namespaces_to_json(const ToolNamespaces& namespaces) {
    json::Object out;
    for (const auto& [key, ns] : namespaces) {
        json::Array tools;
        for (const ToolDescription& t : ns.tools) {
            json::Object o{{"name", t.name}, {"description", t.description}};
            if (t.parameters) o.emplace_back("parameters", *t.parameters);
            tools.emplace_back(std::move(o));
        }
        json::Object n = object_with("name", ns.name);
        if (ns.description) n.emplace_back("description", *ns.description);
        n.emplace_back("tools", std::move(tools));
        out.emplace_back(key, std::move(n));
    }
    return out;
}

Value content_to_json(const Content& c) {
    if (const auto* t = std::get_if<TextContent>(&c)) return json::Object{{"type", "text"}, {"text", t->text}};
    if (const auto* sys = std::get_if<SystemContent>(&c)) {
        json::Object o{{"type", "system_content"},
                       {"model_identity", optional_to_json(sys->model_identity)},
                       {"reasoning_effort", sys->reasoning_effort
                                                ? Value(sys->reasoning_effort == ReasoningEffort::low      ? "Low"
                                                        : sys->reasoning_effort == ReasoningEffort::medium ? "Medium"
                                                                                                          : "High")
                                                : Value()},
                       {"conversation_start_date", optional_to_json(sys->conversation_start_date)},
                       {"knowledge_cutoff", optional_to_json(sys->knowledge_cutoff)}};
        if (sys->channel_config) {
            json::Array chans(sys->channel_config->valid_channels.begin(), sys->channel_config->valid_channels.end());
            o.emplace_back("channel_config", json::Object{{"valid_channels", std::move(chans)},
                                                          {"channel_required", sys->channel_config->channel_required}});
        } else {
            o.emplace_back("channel_config", Value());
        }
        if (sys->tools) o.emplace_back("tools", namespaces_to_json(*sys->tools));
        return o;
    }
    const auto& dev = std::get<DeveloperContent>(c);
    json::Object o = object_with("type", "developer_content");
    if (dev.instructions) o.emplace_back("instructions", *dev.instructions);
    if (dev.tools) o.emplace_back("tools", namespaces_to_json(*dev.tools));
    return o;
}

}  // namespace

Message message_from_json(const Value& v, const std::string& path) {
    expect(v, json::Type::object, path);
    check_keys(v, {"role", "name", "content", "channel", "recipient", "content_type"}, path);
    Message m;
    const std::string role = get_string(v, "role", path);
    const std::optional<Role> r = parse_role(role);
    OSPREY_CHECK(r.has_value(), path, ".role: unknown role '", role,
                 "' (expected system, developer, user, assistant or tool)");
    m.author.role = *r;
    m.author.name = get_optional_string(v, "name", path);
    m.channel = get_optional_string(v, "channel", path);
    m.recipient = get_optional_string(v, "recipient", path);
    m.content_type = get_optional_string(v, "content_type", path);
    const Value* content = v.find("content");
    OSPREY_CHECK(content != nullptr, path, ": missing field 'content'");
    if (content->is_string()) {
        m.content.emplace_back(TextContent{content->as_string()});
    } else {
        OSPREY_CHECK(content->is_array(), path, ".content: expected a string or a list of content parts, got ",
                     json::type_name(content->type()));
        for (size_t i = 0; i < content->size(); ++i)
            m.content.push_back(content_from_json(content->as_array()[i], path + ".content[" + std::to_string(i) + "]"));
    }
    return m;
}

Conversation conversation_from_json(const Value& value) {
    const Value* messages = &value;
    if (value.is_object()) {
        check_keys(value, {"messages"}, "conversation");
        messages = value.find("messages");
        OSPREY_CHECK(messages != nullptr, "conversation: missing field 'messages'");
    }
    expect(*messages, json::Type::array, "messages");
    Conversation c;
    for (size_t i = 0; i < messages->size(); ++i)
        c.messages.push_back(message_from_json(messages->as_array()[i], "messages[" + std::to_string(i) + "]"));
    return c;
}

Conversation conversation_from_json_text(std::string_view text) { return conversation_from_json(json::parse(text)); }

Value to_json(const Message& m) {
    json::Object o = object_with("role", role_name(m.author.role));
    if (m.author.name) o.emplace_back("name", *m.author.name);
    json::Array parts;
    for (const Content& c : m.content) parts.push_back(content_to_json(c));
    o.emplace_back("content", std::move(parts));
    if (m.channel) o.emplace_back("channel", *m.channel);
    if (m.recipient) o.emplace_back("recipient", *m.recipient);
    if (m.content_type) o.emplace_back("content_type", *m.content_type);
    return o;
}

Value to_json(const Conversation& c) {
    json::Array msgs;
    for (const Message& m : c.messages) msgs.push_back(to_json(m));
    return object_with("messages", std::move(msgs));
}

}  // namespace osprey::harmony
