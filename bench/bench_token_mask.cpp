// Cost of constrained decoding's per-step mask on the CPU, over the 201088-token o200k_harmony
// vocabulary: building the vocabulary trie (once per process), compiling a typical schema, a cold
// mask at several states (a walk of the trie through the automaton), a cached one (what most steps
// cost: JSON output revisits few states) and advancing past a token.
//   bench_token_mask [RANK_FILE]   (default: $OSPREY_TIKTOKEN_FILE)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/check.h"
#include "core/json.h"
#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

using namespace osprey;
using Clock = std::chrono::steady_clock;

namespace {

double us_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string"},"age":{"type":"integer"},"email":{"type":"string","format":"email"},
  "tags":{"type":"array","items":{"type":"string"},"maxItems":5},
  "address":{"type":"object","properties":{"street":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"},
    "country":{"enum":["FR","DE","US"]}},"required":["street","country"]},
  "active":{"type":"boolean"}},"required":["name","age","active"]})";

}  // namespace

int main(int argc, char** argv) {
    const char* env = std::getenv("OSPREY_TIKTOKEN_FILE");
    const std::string path = argc > 1 ? argv[1] : env ? env : "";
    if (path.empty()) {
        std::fprintf(stderr, "usage: bench_token_mask RANK_FILE (or set OSPREY_TIKTOKEN_FILE)\n");
        return 2;
    }
    const tok::Tokenizer t = tok::Tokenizer::from_file(path);
    auto t0 = Clock::now();
    auto trie = grammar::vocab_trie_of(t);
    std::printf("vocabulary trie: %d tokens, %zu nodes, built in %.1f ms\n", t.vocab_size(), trie->n_nodes(),
                us_since(t0) / 1e3);

    t0 = Clock::now();
    auto g = std::make_shared<const grammar::Grammar>(grammar::json_schema_grammar(json::parse(kSchema)));
    std::printf("schema compiled in %.1f us (%zu rules)\n", us_since(t0), g->rule_alts.size());

    grammar::TokenMasker m(trie, g);
    grammar::Automaton& a = m.automaton();
    struct Point {
        const char* what;
        std::string prefix;
    };
    const Point points[] = {
        {"start ('{' only)", ""},
        {"a property name", "{\"na"},
        {"inside a string value", "{\"name\":\"Ada Lov"},
        {"inside an integer", "{\"name\":\"Ada\",\"age\":3"},
        {"after a value (',' or '}')", "{\"name\":\"Ada\",\"age\":36,\"active\":true"},
        {"inside a pattern string", "{\"name\":\"A\",\"age\":1,\"address\":{\"street\":\"x\",\"zip\":\"12"},
    };
    std::printf("%-30s %8s %12s %12s\n", "state", "allowed", "cold us", "cached us");
    for (const Point& p : points) {
        const int32_t s = a.next(a.start(), p.prefix);
        if (s == grammar::Automaton::kDead) {
            std::printf("%-30s dead prefix\n", p.what);
            continue;
        }
        // Cold: a fresh masker, so neither masks nor transitions are cached.
        grammar::TokenMasker fresh(trie, g);
        const int32_t fs = fresh.automaton().next(fresh.automaton().start(), p.prefix);
        auto c0 = Clock::now();
        const std::vector<uint32_t>& mask = fresh.mask(fs);
        const double cold = us_since(c0);
        int allowed = 0;
        for (uint32_t w : mask) allowed += __builtin_popcount(w);
        // Cached: the copy into a step's buffer, as the engine does.
        std::vector<uint32_t> out(mask.size());
        const int reps = 2000;
        auto w0 = Clock::now();
        for (int i = 0; i < reps; ++i) {
            const std::vector<uint32_t>& c = fresh.mask(fs);
            std::copy(c.begin(), c.end(), out.begin());
        }
        std::printf("%-30s %8d %12.1f %12.2f\n", p.what, allowed, cold, us_since(w0) / reps);
    }
    // Advancing past a token (cached transitions): the per-step cost after sampling.
    const std::string tok = " Lovelace";
    const int32_t s = a.next(a.start(), "{\"name\":\"Ada");
    a.next(s, tok);
    auto w0 = Clock::now();
    const int reps = 100000;
    int32_t sink = 0;
    for (int i = 0; i < reps; ++i) sink += a.next(s, tok);
    std::printf("advance past a 9-byte token: %.3f us (%d)\n", us_since(w0) / reps, sink & 1);
    return 0;
}
