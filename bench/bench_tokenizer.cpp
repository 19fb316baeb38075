// Single-thread encode throughput of the o200k_harmony tokenizer on a JSON-lines corpus (as written
// by tools/tokenizer/gen_corpus.py), to set beside tiktoken's on the same corpus
// (tools/tokenizer/bench_tiktoken.py). Reports MB/s of UTF-8 text and tokens/s, best of N passes.
//   bench_tokenizer TOKENIZER_FILE CORPUS.jsonl [passes=3]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/json.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Doc {
    std::string text;
    osprey::tok::Specials specials;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: bench_tokenizer TOKENIZER_FILE CORPUS.jsonl [passes=3]\n");
        return 2;
    }
    try {
        const int passes = argc > 3 ? std::max(1, std::atoi(argv[3])) : 3;
        auto t0 = std::chrono::steady_clock::now();
        const auto tok = osprey::tok::Tokenizer::from_file(argv[1]);
        const double load_s = seconds_since(t0);

        std::ifstream in(argv[2], std::ios::binary);
        OSPREY_CHECK(in.good(), "cannot open ", argv[2]);
        std::vector<Doc> docs;
        size_t n_bytes = 0;
        for (std::string line; std::getline(in, line);) {
            if (line.empty()) continue;
            const auto v = osprey::json::parse(line);
            docs.push_back({v.at("text").as_string(), v.at("mode").as_string() == "all_special"
                                                          ? osprey::tok::Specials::allowed
                                                          : osprey::tok::Specials::as_text});
            n_bytes += docs.back().text.size();
        }
        double best = 1e30;
        size_t n_tokens = 0;
        for (int p = 0; p < passes; ++p) {
            n_tokens = 0;
            t0 = std::chrono::steady_clock::now();
            for (const Doc& d : docs) n_tokens += tok.encode(d.text, d.specials).size();
            best = std::min(best, seconds_since(t0));
        }
        std::printf("osprey   load %.2f s; %zu documents, %.1f MB, %zu tokens; encode %.2f s (best of %d): "
                    "%.2f MB/s, %.0f tokens/s\n",
                    load_s, docs.size(), n_bytes / 1e6, n_tokens, best, passes, n_bytes / 1e6 / best,
                    n_tokens / best);
        return 0;
    } catch (const osprey::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
