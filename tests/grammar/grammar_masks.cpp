// Test helper for tests/grammar/oracle_check.py: prints the allowed-token mask of a constraint after a
// prefix, so an independent Python reference can check it over the whole vocabulary.
//   grammar_masks RANK_FILE < queries   (one JSON per line: {"kind": "json_schema"|"regex"|"gbnf",
//                                        "spec": schema or text, "prefix": text})
// Answers one JSON per line: {"allowed": [ids...], "accepts": bool} or {"error": message}.
#include <iostream>
#include <string>

#include "core/check.h"
#include "core/json.h"
#include "grammar/json_schema.h"
#include "grammar/parse.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

using namespace osprey;

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "usage: grammar_masks RANK_FILE < queries\n";
        return 2;
    }
    const tok::Tokenizer t = tok::Tokenizer::from_file(argv[1]);
    auto trie = grammar::vocab_trie_of(t);
    std::string line;
    while (std::getline(std::cin, line)) {
        json::Value out;
        try {
            const json::Value q = json::parse(line);
            const std::string kind = q.at("kind").as_string();
            grammar::Grammar g;
            if (kind == "json_schema") {
                g = grammar::json_schema_grammar(q.at("spec"));
            } else if (kind == "regex") {
                grammar::GrammarBuilder b;
                g = b.build(b.add("root", grammar::parse_regex(q.at("spec").as_string())));
            } else {
                g = grammar::parse_gbnf(q.at("spec").as_string());
            }
            grammar::TokenMasker m(trie, std::make_shared<const grammar::Grammar>(std::move(g)));
            const int32_t s = m.automaton().next(m.automaton().start(), q.at("prefix").as_string());
            if (s == grammar::Automaton::kDead) OSPREY_FAIL("the prefix is not in the language");
            const std::vector<uint32_t>& mask = m.mask(s);
            json::Value allowed = json::Array{};
            for (int i = 0; i < t.vocab_size(); ++i)
                if (grammar::mask_has(mask, i)) allowed.push_back(i);
            out.set("allowed", std::move(allowed));
            out.set("accepts", m.automaton().accepts(s));
        } catch (const std::exception& e) {
            out.set("error", std::string(e.what()));
        }
        std::cout << out.dump() << "\n" << std::flush;
    }
    return 0;
}
