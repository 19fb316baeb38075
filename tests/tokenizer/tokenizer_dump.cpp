// Encodes every document of a JSON-lines corpus ({"mode": "ordinary"|"all_special", "text": ...}, as
// written by tools/tokenizer/gen_corpus.py) and writes the ids for tools/tokenizer/differential.py:
// per document a little-endian uint32 count, then that many int32 ids. Also checks that decoding
// gives the text back (for ordinary documents).
//   tokenizer_dump TOKENIZER_FILE CORPUS.jsonl OUT.bin
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/check.h"
#include "core/json.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
    if (argc != 4) {
        std::cerr << "usage: tokenizer_dump TOKENIZER_FILE CORPUS.jsonl OUT.bin\n";
        return 2;
    }
    try {
        const auto tok = osprey::tok::Tokenizer::from_file(argv[1]);
        std::ifstream in(argv[2], std::ios::binary);
        OSPREY_CHECK(in.good(), "cannot open ", argv[2]);
        std::ofstream out(argv[3], std::ios::binary);
        OSPREY_CHECK(out.good(), "cannot write ", argv[3]);
        std::string line;
        size_t n_docs = 0, n_roundtrip_errors = 0;
        while (std::getline(in, line)) {
            if (line.empty()) continue;
            const osprey::json::Value doc = osprey::json::parse(line);
            const std::string& text = doc.at("text").as_string();
            const auto specials = doc.at("mode").as_string() == "all_special" ? osprey::tok::Specials::allowed
                                                                                : osprey::tok::Specials::as_text;
            const auto ids = tok.encode(text, specials);
            const uint32_t n = uint32_t(ids.size());
            out.write(reinterpret_cast<const char*>(&n), 4);
            out.write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 4));
            // (With specials allowed, "<|reserved_200018|>" comes back as its other name "<|endofprompt|>".)
            if (specials == osprey::tok::Specials::as_text && tok.decode_bytes(ids) != text) {
                if (n_roundtrip_errors++ < 5) std::cerr << "document " << n_docs << ": decode(encode(text)) != text\n";
            }
            ++n_docs;
        }
        std::cerr << n_docs << " documents encoded, " << n_roundtrip_errors << " round-trip errors\n";
        return n_roundtrip_errors == 0 ? 0 : 1;
    } catch (const osprey::Error& e) {
        std::cerr << "error: " << e.what() << "\n";
        return 1;
    }
}
