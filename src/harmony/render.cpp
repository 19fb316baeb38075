// Conversation -> Harmony prompt pieces, following openai/harmony v0.0.8 (src/encoding.rs) rule for
// rule. Spec: shared/spec/harmony.md §2-§6.
#include "harmony/render.h"

#include <string_view>

#include "core/check.h"
#include "core/utf8.h"
#include "harmony/schema_typescript.h"
#include "tokenizer/tokenizer.h"

namespace osprey::harmony {

namespace {

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
        if (i) out += sep;
        out += parts[i];
    }
    return out;
}

// Rust's str::lines(): split on '\n', drop one '\r' before each '\n', no empty last line.
std::vector<std::string_view> lines(std::string_view s) {
    std::vector<std::string_view> out;
    while (!s.empty()) {
        const size_t nl = s.find('\n');
        std::string_view line = s.substr(0, nl);
        if (nl == std::string_view::npos) {
            s = {};
        } else {
            s.remove_prefix(nl + 1);
            if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        }
        out.push_back(line);
    }
    return out;
}

// "# Tools" then one "## name" section per namespace (§5.1).
std::string tools_section(const ToolNamespaces& namespaces) {
    std::vector<std::string> sections{"# Tools"};
    for (const auto& [key, ns] : namespaces) {
        std::vector<std::string> entries{"## " + ns.name + "\n"};
        const bool has_tools = !ns.tools.empty();
        if (ns.description)
            for (std::string_view line : lines(*ns.description))
                entries.push_back(has_tools ? "// " + std::string(line) : std::string(line));
        if (has_tools) {
            entries.push_back("namespace " + ns.name + " {\n");
            for (const ToolDescription& tool : ns.tools) {
                for (std::string_view line : lines(tool.description)) entries.push_back("// " + std::string(line));
                if (tool.parameters)
                    entries.push_back("type " + tool.name + " = (_: " + schema_to_typescript(*tool.parameters) +
                                      ") => any;\n");
                else
                    entries.push_back("type " + tool.name + " = () => any;\n");
            }
            entries.push_back("} // namespace " + ns.name);
        }
        sections.push_back(join(entries, "\n"));
    }
    return join(sections, "\n\n");
}

std::string system_text(const SystemContent& sys, bool has_function_tools) {
    std::vector<std::string> sections;
    std::vector<std::string> top;
    if (sys.model_identity) top.push_back(*sys.model_identity);
    if (sys.knowledge_cutoff) top.push_back("Knowledge cutoff: " + *sys.knowledge_cutoff);
    if (sys.conversation_start_date) top.push_back("Current date: " + *sys.conversation_start_date);
    if (!top.empty()) sections.push_back(join(top, "\n"));
    if (sys.reasoning_effort) sections.push_back(std::string("Reasoning: ") + effort_name(*sys.reasoning_effort));
    if (sys.tools && !sys.tools->empty()) sections.push_back(tools_section(*sys.tools));
    if (sys.channel_config && !sys.channel_config->valid_channels.empty()) {
        std::string line = "# Valid channels: " + join(sys.channel_config->valid_channels, ", ") + ".";
        if (sys.channel_config->channel_required) line += " Channel must be included for every message.";
        if (has_function_tools) line += "\nCalls to these tools must go to the commentary channel: 'functions'.";
        sections.push_back(line);
    }
    return join(sections, "\n\n");
}

std::string developer_text(const DeveloperContent& dev) {
    std::vector<std::string> sections;
    if (dev.instructions) {
        sections.push_back("# Instructions");
        sections.push_back(*dev.instructions);
    }
    if (dev.tools && !dev.tools->empty()) sections.push_back(tools_section(*dev.tools));
    return join(sections, "\n\n");
}

bool defines_function_tools(const Message& m) {
    for (const Content& c : m.content) {
        const auto* dev = std::get_if<DeveloperContent>(&c);
        if (!dev || !dev->tools) continue;
        auto it = dev->tools->find("functions");
        if (it != dev->tools->end() && !it->second.tools.empty()) return true;
    }
    return false;
}

void render_into(Rendered& out, const Message& m, bool has_function_tools) {
    out.add_special(kStart);
    if (m.author.role == Role::tool) {
        OSPREY_CHECK(m.author.name.has_value(), "a tool message needs the tool's name (author name)");
        out.add_text(*m.author.name);
    } else {
        out.add_text(role_name(m.author.role));
        if (m.author.name) out.add_text(":" + *m.author.name);
    }
    if (m.recipient && *m.recipient != "all") out.add_text(" to=" + *m.recipient);
    if (m.channel) {
        out.add_special(kChannel);
        out.add_text(*m.channel);
    }
    if (m.content_type) {
        const std::string& type = *m.content_type;
        if (type.starts_with(kConstrainText)) {
            out.add_text(" ");
            out.add_special(kConstrain);
            if (type.size() > kConstrainText.size()) out.add_text(type.substr(kConstrainText.size()));
        } else {
            out.add_text(" " + type);
        }
    }
    out.add_special(kMessage);
    for (const Content& c : m.content) {
        if (const auto* t = std::get_if<TextContent>(&c)) {
            out.add_text(t->text);
        } else if (const auto* sys = std::get_if<SystemContent>(&c)) {
            OSPREY_CHECK(m.author.role == Role::system, "system content may only appear in a system message, found in a ",
                         role_name(m.author.role), " message");
            out.add_text(system_text(*sys, has_function_tools));
        } else {
            OSPREY_CHECK(m.author.role == Role::developer,
                         "developer content may only appear in a developer message, found in a ",
                         role_name(m.author.role), " message");
            out.add_text(developer_text(std::get<DeveloperContent>(c)));
        }
    }
    out.add_special(m.author.role == Role::assistant && m.recipient ? kCall : kEnd);
}

void check_utf8(std::string_view s, const std::string& field) {
    const size_t bad = utf8::first_invalid(s);
    OSPREY_CHECK(bad == std::string_view::npos, field, ": invalid UTF-8 at byte ", bad);
}

// A header field the parser must be able to read back: non-empty, no whitespace.
void check_header_word(const std::string& s, const std::string& field) {
    check_utf8(s, field);
    OSPREY_CHECK(!s.empty(), field, ": must not be empty");
    for (char c : s)
        OSPREY_CHECK(c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v', field,
                     ": must not contain whitespace, got '", s, "'");
}

void validate_namespaces(const ToolNamespaces& namespaces, const std::string& path) {
    for (const auto& [key, ns] : namespaces) {
        const std::string p = path + "." + key;
        check_header_word(key, p + " (namespace key)");
        check_header_word(ns.name, p + ".name");
        if (ns.description) check_utf8(*ns.description, p + ".description");
        for (size_t i = 0; i < ns.tools.size(); ++i) {
            const ToolDescription& t = ns.tools[i];
            const std::string tp = p + ".tools[" + std::to_string(i) + "]";
            check_header_word(t.name, tp + ".name");
            check_utf8(t.description, tp + ".description");
            if (t.parameters) validate_schema(*t.parameters, tp + ".parameters");
        }
    }
}

void validate_message(const Message& m, const std::string& path) {
    if (m.author.role == Role::tool) {
        OSPREY_CHECK(m.author.name.has_value(), path, ".name: a tool message needs the tool's name");
        check_header_word(*m.author.name, path + ".name");
    } else if (m.author.name) {
        check_header_word(*m.author.name, path + ".name");
    }
    if (m.channel) check_header_word(*m.channel, path + ".channel");
    if (m.channel)
        OSPREY_CHECK(m.channel->find('<') == std::string::npos, path, ".channel: must not contain '<', got '",
                     *m.channel, "'");
    if (m.recipient) check_header_word(*m.recipient, path + ".recipient");
    if (m.content_type) check_header_word(*m.content_type, path + ".content_type");
    for (size_t i = 0; i < m.content.size(); ++i) {
        const std::string p = path + ".content[" + std::to_string(i) + "]";
        const Content& c = m.content[i];
        if (const auto* t = std::get_if<TextContent>(&c)) {
            check_utf8(t->text, p + ".text");
        } else if (const auto* sys = std::get_if<SystemContent>(&c)) {
            OSPREY_CHECK(m.author.role == Role::system, p, ": system content may only appear in a system message");
            for (const auto* s : {&sys->model_identity, &sys->conversation_start_date, &sys->knowledge_cutoff})
                if (*s) check_utf8(**s, p);
            if (sys->channel_config)
                for (const std::string& ch : sys->channel_config->valid_channels) check_utf8(ch, p + ".channel_config");
            if (sys->tools) validate_namespaces(*sys->tools, p + ".tools");
        } else {
            const auto& dev = std::get<DeveloperContent>(c);
            OSPREY_CHECK(m.author.role == Role::developer, p,
                         ": developer content may only appear in a developer message");
            if (dev.instructions) check_utf8(*dev.instructions, p + ".instructions");
            if (dev.tools) validate_namespaces(*dev.tools, p + ".tools");
        }
    }
}

}  // namespace

void validate(const Conversation& conversation) {
    for (size_t i = 0; i < conversation.messages.size(); ++i)
        validate_message(conversation.messages[i], "messages[" + std::to_string(i) + "]");
}

std::string Rendered::text() const {
    std::string out;
    for (const Piece& p : pieces) out += p.special >= 0 ? std::string(formatting_token_text(p.special)) : p.text;
    return out;
}

std::vector<TokenId> Rendered::tokens(const tok::Tokenizer& tokenizer) const {
    std::vector<TokenId> out;
    for (const Piece& p : pieces) {
        if (p.special >= 0) {
            out.push_back(p.special);
        } else {
            const std::vector<TokenId> ids = tokenizer.encode(p.text, tok::Specials::as_text);
            out.insert(out.end(), ids.begin(), ids.end());
        }
    }
    return out;
}

Rendered render_message(const Message& message, bool has_function_tools) {
    validate_message(message, "message");
    Rendered out;
    render_into(out, message, has_function_tools);
    return out;
}

Rendered render_conversation(const Conversation& conversation, const RenderOptions& options) {
    validate(conversation);
    const std::vector<Message>& msgs = conversation.messages;
    bool has_function_tools = false;
    for (const Message& m : msgs) has_function_tools = has_function_tools || defines_function_tools(m);

    // §6.3: drop analysis before the first final message when the last assistant message is final.
    bool last_assistant_is_final = false;
    for (auto it = msgs.rbegin(); it != msgs.rend(); ++it) {
        if (it->author.role == Role::assistant) {
            last_assistant_is_final = it->channel == "final";
            break;
        }
    }
    const bool drop = options.drop_analysis == AnalysisPolicy::first_final && last_assistant_is_final;
    size_t first_final = msgs.size();
    for (size_t i = 0; i < msgs.size(); ++i) {
        if (msgs[i].channel == "final") {
            first_final = i;
            break;
        }
    }
    Rendered out;
    for (size_t i = 0; i < msgs.size(); ++i) {
        if (drop && i < first_final && msgs[i].channel == "analysis") continue;
        render_into(out, msgs[i], has_function_tools);
    }
    return out;
}

Rendered render_for_completion(const Conversation& conversation, Role next_role, const RenderOptions& options) {
    Rendered out = render_conversation(conversation, options);
    out.add_special(kStart);
    out.add_text(role_name(next_role));
    return out;
}

Rendered render_for_training(const Conversation& conversation, const RenderOptions& options) {
    Rendered out = render_conversation(conversation, options);
    const std::vector<Message>& msgs = conversation.messages;
    if (!msgs.empty() && msgs.back().author.role == Role::assistant && msgs.back().channel == "final" &&
        !out.pieces.empty())
        out.pieces.back() = Piece{kReturn, {}};
    return out;
}

}  // namespace osprey::harmony
