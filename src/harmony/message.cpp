// The Harmony data model: built-in tool namespaces and small constructors.
// The built-in tool texts must stay byte-identical to shared/conformance/harmony/test_browser_and_python_tool.txt
// (checked by tests/harmony/test_render.cpp).
#include "harmony/message.h"

namespace osprey::harmony {

const char* role_name(Role role) {
    switch (role) {
        case Role::system: return "system";
        case Role::developer: return "developer";
        case Role::user: return "user";
        case Role::assistant: return "assistant";
        case Role::tool: return "tool";
    }
    return "?";
}

std::optional<Role> parse_role(std::string_view name) {
    if (name == "system") return Role::system;
    if (name == "developer") return Role::developer;
    if (name == "user") return Role::user;
    if (name == "assistant") return Role::assistant;
    if (name == "tool") return Role::tool;
    return std::nullopt;
}

const char* effort_name(ReasoningEffort effort) {
    switch (effort) {
        case ReasoningEffort::low: return "low";
        case ReasoningEffort::medium: return "medium";
        case ReasoningEffort::high: return "high";
    }
    return "?";
}

ToolNamespace ToolNamespace::browser() {
    ToolNamespace ns;
    ns.name = "browser";
    ns.description =
        "Tool for browsing.\n"
        "The `cursor` appears in brackets before each browsing display: `[{cursor}]`.\n"
        "Cite information from the tool using the following format:\n"
        "`\u3010{cursor}\u2020L{line_start}(-L{line_end})?\u3011`, for example: `\u30106\u2020L9-L11\u3011` or "
        "`\u30108\u2020L3\u3011`.\n"
        "Do not quote more than 10 words directly from the tool output.\n"
        "sources=web (default: web)";
    ns.tools.push_back({
        "search",
        "Searches for information related to `query` and displays `topn` results.",
        json::parse(R"({"type": "object", "properties": {"query": {"type": "string"},
            "topn": {"type": "number", "default": 10}, "source": {"type": "string"}}, "required": ["query"]})"),
    });
    ns.tools.push_back({
        "open",
        "Opens the link `id` from the page indicated by `cursor` starting at line number `loc`, showing "
        "`num_lines` lines.\n"
        "Valid link ids are displayed with the formatting: `\u3010{id}\u2020.*\u3011`.\n"
        "If `cursor` is not provided, the most recent page is implied.\n"
        "If `id` is a string, it is treated as a fully qualified URL associated with `source`.\n"
        "If `loc` is not provided, the viewport will be positioned at the beginning of the document or "
        "centered on the most relevant passage, if available.\n"
        "Use this function without `id` to scroll to a new location of an opened page.",
        json::parse(R"({"type": "object", "properties": {
            "id": {"type": ["number", "string"], "default": -1},
            "cursor": {"type": "number", "default": -1}, "loc": {"type": "number", "default": -1},
            "num_lines": {"type": "number", "default": -1}, "view_source": {"type": "boolean", "default": false},
            "source": {"type": "string"}}})"),
    });
    ns.tools.push_back({
        "find",
        "Finds exact matches of `pattern` in the current page, or the page given by `cursor`.",
        json::parse(R"({"type": "object", "properties": {"pattern": {"type": "string"},
            "cursor": {"type": "number", "default": -1}}, "required": ["pattern"]})"),
    });
    return ns;
}

ToolNamespace ToolNamespace::python() {
    ToolNamespace ns;
    ns.name = "python";
    ns.description =
        "Use this tool to execute Python code in your chain of thought. The code will not be shown to the user. "
        "This tool should be used for internal reasoning, but not for code that is intended to be visible to the "
        "user (e.g. when creating plots, tables, or files).\n\n"
        "When you send a message containing Python code to python, it will be executed in a stateful Jupyter "
        "notebook environment. python will respond with the output of the execution or time out after 120.0 "
        "seconds. The drive at '/mnt/data' can be used to save and persist user files. Internet access for this "
        "session is UNKNOWN. Depends on the cluster.";
    return ns;
}

ToolNamespace ToolNamespace::functions(std::vector<ToolDescription> tools) {
    return ToolNamespace{"functions", std::nullopt, std::move(tools)};
}

namespace {
void add_namespace(std::optional<ToolNamespaces>& tools, ToolNamespace ns) {
    if (!tools) tools.emplace();
    std::string key = ns.name;
    (*tools)[key] = std::move(ns);
}
}  // namespace

SystemContent& SystemContent::with_tool_namespace(ToolNamespace ns) {
    add_namespace(tools, std::move(ns));
    return *this;
}

DeveloperContent& DeveloperContent::with_tool_namespace(ToolNamespace ns) {
    add_namespace(tools, std::move(ns));
    return *this;
}

Message Message::system(SystemContent content) {
    Message m;
    m.author.role = Role::system;
    m.content.emplace_back(std::move(content));
    return m;
}

Message Message::developer(DeveloperContent content) {
    Message m;
    m.author.role = Role::developer;
    m.content.emplace_back(std::move(content));
    return m;
}

Message Message::user(std::string text) {
    Message m;
    m.author.role = Role::user;
    m.content.emplace_back(TextContent{std::move(text)});
    return m;
}

Message Message::assistant(std::string text, std::optional<std::string> channel) {
    Message m;
    m.author.role = Role::assistant;
    m.content.emplace_back(TextContent{std::move(text)});
    m.channel = std::move(channel);
    return m;
}

Message Message::tool(std::string tool_name, std::string text) {
    Message m;
    m.author = Author{Role::tool, std::move(tool_name)};
    m.content.emplace_back(TextContent{std::move(text)});
    return m;
}

std::string Message::text() const {
    std::string out;
    for (const Content& c : content)
        if (const auto* t = std::get_if<TextContent>(&c)) out += t->text;
    return out;
}

}  // namespace osprey::harmony
