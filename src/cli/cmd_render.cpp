// `osprey render`: a conversation (openai-harmony Conversation JSON, see harmony/conversation_json.h)
// to the Harmony prompt, as token ids or text. Test: tests/harmony/test_cli.sh.
#include <cstdio>
#include <optional>
#include <sstream>

#include "cli/command.h"
#include "core/check.h"
#include "harmony/conversation_json.h"
#include "harmony/render.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr const char* kHelp =
    "usage: osprey render [FILE|-] [--tokens | --text] [--next-role ROLE | --no-next-role | --training]\n"
    "                     [--keep-analysis] [--tokenizer FILE | --model DIR]\n"
    "\n"
    "Renders a conversation to the Harmony prompt the model completes. FILE (default: standard input)\n"
    "holds openai-harmony's Conversation JSON: {\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, ...]}\n"
    "(system_content / developer_content parts, channel, recipient, content_type; see\n"
    "src/harmony/conversation_json.h).\n"
    "\n"
    "  --tokens          print token ids, space separated (default)\n"
    "  --text            print the prompt text, special tokens as <|start|>... (needs no tokenizer)\n"
    "  --next-role ROLE  role of the turn to complete (default assistant): ends with <|start|>ROLE\n"
    "  --no-next-role    render the messages only\n"
    "  --training        render for training: a last final assistant message ends with <|return|>\n"
    "  --keep-analysis   keep earlier analysis messages (default: drop analysis before the first final\n"
    "                    message when the last assistant message is final, as openai-harmony does)\n"
    "  --tokenizer FILE  o200k_base.tiktoken or tokenizer.json (default: $OSPREY_TIKTOKEN_FILE, then\n"
    "                    ~/.cache/osprey/o200k_base.tiktoken)\n"
    "  --model DIR       take the tokenizer from a model folder\n";

int run_render(const std::vector<std::string>& argv) {
    using namespace osprey;
    const cli::Args args(argv, {"next-role", "tokenizer", "model"},
                         {"tokens", "text", "no-next-role", "training", "keep-analysis", "help"});
    if (args.has("help")) {
        std::fputs(kHelp, stdout);
        return 0;
    }
    OSPREY_CHECK(!(args.has("tokens") && args.has("text")), "--tokens and --text exclude each other");
    const int n_modes = int(args.has("next-role")) + int(args.has("no-next-role")) + int(args.has("training"));
    OSPREY_CHECK(n_modes <= 1, "--next-role, --no-next-role and --training exclude each other");
    OSPREY_CHECK(!(args.has("tokenizer") && args.has("model")), "--tokenizer and --model exclude each other");

    const harmony::Conversation conversation =
        harmony::conversation_from_json_text(cli::read_file_or_stdin(args.positional()));
    harmony::RenderOptions options;
    if (args.has("keep-analysis")) options.drop_analysis = harmony::AnalysisPolicy::none;

    harmony::Rendered rendered;
    if (args.has("no-next-role")) {
        rendered = harmony::render_conversation(conversation, options);
    } else if (args.has("training")) {
        rendered = harmony::render_for_training(conversation, options);
    } else {
        const std::string role = args.get("next-role", "assistant");
        const std::optional<harmony::Role> next = harmony::parse_role(role);
        OSPREY_CHECK(next.has_value(), "--next-role: unknown role '", role,
                     "' (expected system, developer, user, assistant or tool)");
        rendered = harmony::render_for_completion(conversation, *next, options);
    }

    if (args.has("text")) {
        std::fwrite(rendered.text().data(), 1, rendered.text().size(), stdout);
        std::fputc('\n', stdout);
        return 0;
    }
    const tok::Tokenizer tokenizer = args.has("tokenizer") ? tok::Tokenizer::from_file(args.get("tokenizer"))
                                                           : tok::Tokenizer::from_model_dir(args.get("model"));
    const std::vector<tok::TokenId> ids = rendered.tokens(tokenizer);
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) line += ' ';
        line += std::to_string(ids[i]);
    }
    std::printf("%s\n", line.c_str());
    return 0;
}

}  // namespace

OSPREY_COMMAND(render, "render a conversation (JSON) to a Harmony prompt: token ids or text", run_render);
