// Requests -> Harmony conversations (see harmony_prompt.h).
#include "frontend/harmony_prompt.h"

#include <ctime>

#include "harmony/render.h"
#include "harmony/special_tokens.h"

namespace osprey::frontend {

using namespace harmony;

namespace {

std::string today() {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    ::gmtime_r(&now, &tm);
    char buf[16];
    std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
    return buf;
}

}  // namespace

Conversation build_conversation(const PromptSpec& spec) {
    Conversation c;
    SystemContent system;
    system.reasoning_effort = spec.effort;
    system.conversation_start_date = today();
    c.messages.push_back(Message::system(system));
    if (!spec.instructions.empty() || !spec.tools.empty()) {
        DeveloperContent developer;
        if (!spec.instructions.empty()) {
            std::string text;
            for (size_t i = 0; i < spec.instructions.size(); ++i) text += (i ? "\n\n" : "") + spec.instructions[i];
            developer.instructions = text;
        }
        if (!spec.tools.empty()) developer.with_function_tools(spec.tools);
        c.messages.push_back(Message::developer(developer));
    }
    for (const Message& m : spec.turns) c.messages.push_back(m);
    return c;
}

Message tool_call_message(const std::string& name, const std::string& arguments) {
    return Message::assistant(arguments, "commentary")
        .with_recipient("functions." + name)
        .with_content_type("<|constrain|>json");
}

Message tool_result_message(const std::string& name, const std::string& output) {
    return Message::tool("functions." + name, output).with_recipient("assistant").with_channel("commentary");
}

std::vector<int32_t> forced_call_tokens(const tok::Tokenizer& tokenizer, const ForcedCall& f) {
    harmony::Rendered header;
    header.add_special(harmony::kChannel);
    if (f.name.empty()) {
        header.add_text("commentary to=functions.");
    } else {
        header.add_text("commentary to=functions." + f.name + " ");
        header.add_special(harmony::kConstrain);
        header.add_text("json");
        header.add_special(harmony::kMessage);
    }
    return header.tokens(tokenizer);
}

}  // namespace osprey::frontend
