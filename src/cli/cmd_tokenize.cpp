// `osprey tokenize`: text to o200k_harmony token ids, ids back to text, or a tokenizer.json export.
// Test: tests/tokenizer/test_cli.sh.
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>

#include "cli/command.h"
#include "core/check.h"
#include "tokenizer/hf_json.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr const char* kHelp =
    "usage: osprey tokenize [TEXT...] [--allow-special] [--tokenizer FILE | --model DIR]\n"
    "       osprey tokenize --decode [ID...] [--tokenizer FILE | --model DIR]\n"
    "       osprey tokenize --export-hf-json OUT [--tokenizer FILE | --model DIR]\n"
    "\n"
    "Prints the token ids of TEXT (the arguments joined by spaces, or standard input exactly as read,\n"
    "final newline included, when there are none), space separated on one line. Text must be valid UTF-8.\n"
    "\n"
    "  --allow-special       recognise special-token strings such as <|start|> (default: plain text)\n"
    "  --decode              read ids (arguments or standard input; spaces, commas, newlines or [ ])\n"
    "                        and print their bytes exactly (special ids as <|name|>)\n"
    "  --export-hf-json OUT  write a Hugging Face tokenizer.json (byte-level BPE, vocab + merges from the\n"
    "                        ranks, o200k Split regex + ByteLevel, Harmony added tokens) to OUT\n"
    "  --tokenizer FILE      o200k_base.tiktoken, or a tokenizer.json (*.json)\n"
    "  --model DIR           a model folder: DIR/tokenizer.json, DIR/o200k_base.tiktoken,\n"
    "                        DIR/original/o200k_base.tiktoken\n"
    "Without --tokenizer or after the model folder: $OSPREY_TIKTOKEN_FILE, then\n"
    "~/.cache/osprey/o200k_base.tiktoken (scripts/install_tiny_tokenizer.sh puts it there).\n";

std::string read_stdin() {
    std::string s((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    return s;
}

std::vector<osprey::tok::TokenId> parse_ids(const std::string& text) {
    std::vector<osprey::tok::TokenId> ids;
    size_t i = 0;
    while (i < text.size()) {
        const char c = text[i];
        if (c == ' ' || c == ',' || c == '\n' || c == '\r' || c == '\t' || c == '[' || c == ']') {
            ++i;
            continue;
        }
        size_t j = i;
        while (j < text.size() && std::string_view(" ,\n\r\t[]").find(text[j]) == std::string_view::npos) ++j;
        const std::string_view word(text.data() + i, j - i);
        long long v = -1;
        const auto [ptr, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
        OSPREY_CHECK(ec == std::errc() && ptr == word.data() + word.size() && v >= INT32_MIN && v <= INT32_MAX,
                     "not a token id: '", word, "'");
        ids.push_back(osprey::tok::TokenId(v));
        i = j;
    }
    return ids;
}

int run_tokenize(const std::vector<std::string>& argv) {
    for (const auto& a : argv) {
        if (a == "--help" || a == "-h") {
            std::fputs(kHelp, stdout);
            return 0;
        }
    }
    const osprey::cli::Args args(argv, {"tokenizer", "model", "export-hf-json"}, {"allow-special", "decode"});
    OSPREY_CHECK(!(args.has("tokenizer") && args.has("model")), "give --tokenizer or --model, not both");
    const osprey::tok::Tokenizer tok = args.has("tokenizer") ? osprey::tok::Tokenizer::from_file(args.get("tokenizer"))
                                                             : osprey::tok::Tokenizer::from_model_dir(args.get("model"));
    if (args.has("export-hf-json")) {
        OSPREY_CHECK(args.positional().empty() && !args.has("decode"), "--export-hf-json takes no text or --decode");
        const std::string out_path = args.get("export-hf-json");
        std::ofstream out(out_path, std::ios::binary);
        OSPREY_CHECK(out.good(), "cannot write '", out_path, "'");
        out << osprey::tok::export_hf_tokenizer_json(tok);
        OSPREY_CHECK(out.good(), "error writing '", out_path, "'");
        return 0;
    }
    std::string input;
    if (args.positional().empty()) {
        input = read_stdin();
    } else {
        for (size_t k = 0; k < args.positional().size(); ++k) {
            if (k > 0) input += ' ';
            input += args.positional()[k];
        }
    }
    if (args.has("decode")) {
        OSPREY_CHECK(!args.has("allow-special"), "--allow-special applies to encoding only");
        const std::string bytes = tok.decode_bytes(parse_ids(input));
        std::fwrite(bytes.data(), 1, bytes.size(), stdout);
        return 0;
    }
    const auto ids = tok.encode(input, args.has("allow-special") ? osprey::tok::Specials::allowed
                                                                 : osprey::tok::Specials::as_text);
    std::string line;
    for (size_t k = 0; k < ids.size(); ++k) {
        if (k > 0) line += ' ';
        line += std::to_string(ids[k]);
    }
    line += "\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
    return 0;
}

}  // namespace

OSPREY_COMMAND(tokenize, "text to token ids and back (o200k_harmony)", run_tokenize);
