// `osprey parse`: Harmony token ids (a completion, or a whole rendered conversation) to messages JSON,
// or to the parser's streaming events. Test: tests/harmony/test_cli.sh.
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "cli/command.h"
#include "core/check.h"
#include "core/json.h"
#include "harmony/conversation_json.h"
#include "harmony/stream_parser.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr const char* kHelp =
    "usage: osprey parse [FILE|-] [--role ROLE | --no-role] [--events] [--tools NAME,NAME]\n"
    "                    [--tokenizer FILE | --model DIR]\n"
    "\n"
    "Parses Harmony token ids into messages and prints {\"messages\": [...]} in the conversation JSON\n"
    "format of `osprey render`. FILE (default: standard input) holds token ids separated by spaces,\n"
    "commas or newlines, or a JSON array of ids.\n"
    "\n"
    "  --role ROLE       the prompt ended with <|start|>ROLE, so the ids start inside its header\n"
    "                    (default assistant: a model completion)\n"
    "  --no-role         the ids start with <|start|> (e.g. a rendered conversation)\n"
    "  --events          print the streaming events instead, one JSON object per line\n"
    "  --tools LIST      known tool names (functions.get_weather,...) for repairing a glued \"json\"\n"
    "  --tokenizer FILE  o200k_base.tiktoken or tokenizer.json (default: $OSPREY_TIKTOKEN_FILE, then\n"
    "                    ~/.cache/osprey/o200k_base.tiktoken)\n"
    "  --model DIR       take the tokenizer from a model folder\n"
    "\n"
    "Malformed streams never fail: the parser repairs what it can (the count is printed on stderr).\n";

// "1 2,3\n4" or "[1, 2, 3]".
std::vector<osprey::tok::TokenId> parse_ids(const std::string& text) {
    using namespace osprey;
    std::vector<tok::TokenId> ids;
    size_t first = text.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && text[first] == '[') {
        const json::Value v = json::parse(text);
        OSPREY_CHECK(v.is_array(), "input: expected a JSON array of token ids");
        for (size_t i = 0; i < v.size(); ++i) {
            const json::Value& x = v.as_array()[i];
            OSPREY_CHECK(x.is_integer() && !x.is_float() && x.as_int() >= 0 && x.as_int() <= INT32_MAX,
                         "input[", i, "]: expected a token id (a non-negative integer), got ", x.dump());
            ids.push_back(tok::TokenId(x.as_int()));
        }
        return ids;
    }
    size_t i = 0;
    while (i < text.size()) {
        const char c = text[i];
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ',') {
            ++i;
            continue;
        }
        size_t j = i;
        while (j < text.size() && std::isdigit(uint8_t(text[j]))) ++j;
        size_t end = j;
        while (end < text.size() && !std::strchr(" \t\r\n,", text[end])) ++end;
        const std::string word = text.substr(i, end - i);
        OSPREY_CHECK(j == end && j > i && word.size() <= 9, "input: token ", ids.size(), " is '", word,
                     "', expected a non-negative integer id");
        ids.push_back(tok::TokenId(std::stol(word)));
        i = end;
    }
    return ids;
}

osprey::json::Value event_json(const osprey::harmony::Event& e) {
    using namespace osprey;
    using harmony::EventKind;
    json::Object o;
    const char* kind = e.kind == EventKind::message_start   ? "message_start"
                       : e.kind == EventKind::content_delta ? "content_delta"
                       : e.kind == EventKind::message_end   ? "message_end"
                                                            : "tool_call";
    o.emplace_back("event", kind);
    o.emplace_back("index", int64_t(e.index));
    if (e.kind == EventKind::content_delta) {
        o.emplace_back("text", e.text);
    } else {
        json::Value m = harmony::to_json(e.message);
        if (e.kind == EventKind::message_start) {  // no content yet
            for (auto& [k, v] : m.as_object())
                if (k == "content") v = json::Array{};
        }
        o.emplace_back("message", m);
    }
    if (e.kind == EventKind::message_end || e.kind == EventKind::tool_call)
        o.emplace_back("end", harmony::end_reason_name(e.end));
    return json::Value(std::move(o));
}

int run_parse(const std::vector<std::string>& argv) {
    using namespace osprey;
    const cli::Args args(argv, {"role", "tokenizer", "model", "tools"}, {"no-role", "events", "help"});
    if (args.has("help")) {
        std::fputs(kHelp, stdout);
        return 0;
    }
    OSPREY_CHECK(!(args.has("role") && args.has("no-role")), "--role and --no-role exclude each other");
    OSPREY_CHECK(!(args.has("tokenizer") && args.has("model")), "--tokenizer and --model exclude each other");
    harmony::StreamParserOptions options;
    if (args.has("no-role")) {
        options.first_role = std::nullopt;
    } else {
        const std::string role = args.get("role", "assistant");
        options.first_role = harmony::parse_role(role);
        OSPREY_CHECK(options.first_role.has_value(), "--role: unknown role '", role,
                     "' (expected system, developer, user, assistant or tool)");
    }
    if (args.has("tools")) {
        std::stringstream ss(args.get("tools"));
        for (std::string name; std::getline(ss, name, ',');)
            if (!name.empty()) options.known_recipients.push_back(name);
    }
    const std::vector<tok::TokenId> ids = parse_ids(cli::read_file_or_stdin(args.positional()));
    const tok::Tokenizer tokenizer = args.has("tokenizer") ? tok::Tokenizer::from_file(args.get("tokenizer"))
                                                           : tok::Tokenizer::from_model_dir(args.get("model"));
    harmony::StreamParser parser(tokenizer, options);
    std::vector<harmony::Event> events;
    for (tok::TokenId id : ids) parser.push(id, events);
    const std::vector<harmony::Event> tail = parser.finish();
    events.insert(events.end(), tail.begin(), tail.end());
    if (args.has("events")) {
        for (const harmony::Event& e : events) std::printf("%s\n", event_json(e).dump().c_str());
    } else {
        json::Array msgs;
        for (const harmony::Message& m : parser.messages()) msgs.push_back(harmony::to_json(m));
        json::Object out;
        out.emplace_back("messages", std::move(msgs));
        std::printf("%s\n", json::Value(std::move(out)).dump(2).c_str());
    }
    if (parser.n_repairs() > 0)
        std::fprintf(stderr, "parse: repaired %zu malformed construct(s) in the stream\n", parser.n_repairs());
    return 0;
}

}  // namespace

OSPREY_COMMAND(parse, "parse Harmony token ids into messages JSON (or streaming events)", run_parse);
