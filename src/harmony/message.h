// The Harmony data model: roles, messages, system/developer contents and tool descriptions, with
// the defaults of openai/harmony v0.0.8 (src/chat.rs). Spec: shared/spec/harmony.md §2-§5.
// Rendering lives in render.h, parsing in stream_parser.h, the JSON form in conversation_json.h.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/json.h"

namespace osprey::harmony {

enum class Role { system, developer, user, assistant, tool };

const char* role_name(Role role);                     // "system", ..., "tool"
std::optional<Role> parse_role(std::string_view name);  // nullopt for anything else

enum class ReasoningEffort { low, medium, high };

const char* effort_name(ReasoningEffort effort);  // "low", "medium", "high"

// Which channels the system message announces; empty valid_channels omits the whole line.
struct ChannelConfig {
    std::vector<std::string> valid_channels;
    bool channel_required = false;
};

// One callable tool. `parameters` is a JSON schema (an object); absent means "() => any".
struct ToolDescription {
    std::string name;
    std::string description;
    std::optional<json::Value> parameters;
    bool strict = false;  // structured outputs: the arguments must validate against `parameters`
};

// A namespace of tools as rendered under "## name". Built-in namespaces (browser, python) go in the
// system message; function tools go in the developer message under the name "functions".
struct ToolNamespace {
    std::string name;
    std::optional<std::string> description;
    std::vector<ToolDescription> tools;

    static ToolNamespace browser();  // the built-in browsing tool (search, open, find)
    static ToolNamespace python();   // the built-in stateful python tool (no functions)
    static ToolNamespace functions(std::vector<ToolDescription> tools);  // "functions", no description
};

// Namespaces keyed by name; rendered in the map's (byte-wise sorted) order, as harmony's BTreeMap.
using ToolNamespaces = std::map<std::string, ToolNamespace>;

inline constexpr const char* kDefaultModelIdentity = "You are ChatGPT, a large language model trained by OpenAI.";

// Content of the system message. Every field is optional; an absent field is not rendered. The
// defaults are harmony's SystemContent::new().
struct SystemContent {
    std::optional<std::string> model_identity = kDefaultModelIdentity;
    std::optional<ReasoningEffort> reasoning_effort = ReasoningEffort::medium;
    std::optional<ToolNamespaces> tools;
    std::optional<std::string> conversation_start_date;  // "Current date: ..." line
    std::optional<std::string> knowledge_cutoff = "2024-06";
    std::optional<ChannelConfig> channel_config = ChannelConfig{{"analysis", "commentary", "final"}, true};

    SystemContent& with_tool_namespace(ToolNamespace ns);  // adds or replaces ns under ns.name
    SystemContent& with_browser_tool() { return with_tool_namespace(ToolNamespace::browser()); }
    SystemContent& with_python_tool() { return with_tool_namespace(ToolNamespace::python()); }
};

// Content of the developer message: "# Instructions" and function tools.
struct DeveloperContent {
    std::optional<std::string> instructions;
    std::optional<ToolNamespaces> tools;

    DeveloperContent& with_tool_namespace(ToolNamespace ns);
    DeveloperContent& with_function_tools(std::vector<ToolDescription> tools) {
        return with_tool_namespace(ToolNamespace::functions(std::move(tools)));
    }
};

struct TextContent {
    std::string text;
};

using Content = std::variant<TextContent, SystemContent, DeveloperContent>;

// Who wrote a message. Tool messages carry the tool's name ("functions.get_weather",
// "browser.search", "python"), which is what their header shows instead of the word "tool".
struct Author {
    Role role = Role::user;
    std::optional<std::string> name;
};

struct Message {
    Author author;
    std::vector<Content> content;
    std::optional<std::string> channel;       // "analysis", "commentary", "final"
    std::optional<std::string> recipient;     // "functions.f", "browser.search", "assistant"; "all" is not rendered
    std::optional<std::string> content_type;  // "json", "code", "<|constrain|>json"

    static Message system(SystemContent content);
    static Message developer(DeveloperContent content);
    static Message user(std::string text);
    static Message assistant(std::string text, std::optional<std::string> channel = std::nullopt);
    // A tool's output: author = the tool ("functions.get_weather"), as gpt-oss's chat app renders it
    // use .with_recipient("assistant").with_channel("commentary").
    static Message tool(std::string tool_name, std::string text);

    Message& with_channel(std::string c) { channel = std::move(c); return *this; }
    Message& with_recipient(std::string r) { recipient = std::move(r); return *this; }
    Message& with_content_type(std::string t) { content_type = std::move(t); return *this; }

    // Concatenation of the text contents (system/developer contents contribute nothing).
    std::string text() const;
};

struct Conversation {
    std::vector<Message> messages;
};

}  // namespace osprey::harmony
