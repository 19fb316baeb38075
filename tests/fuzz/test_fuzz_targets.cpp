// The fuzz targets of fuzz_targets.h on every CI run without libFuzzer: each target gets its seeds,
// then random mutations of them (byte flips, insertions of structural tokens, deletions, splices)
// for OSPREY_FUZZ_SECONDS seconds (default 2). A broken contract aborts the test binary.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <random>

#include "fuzz/fuzz_targets.h"

namespace osprey::fuzz {
namespace {

double budget_s() {
    const char* env = std::getenv("OSPREY_FUZZ_SECONDS");
    return env ? std::atof(env) : 2.0;
}

std::string mutate(const std::vector<std::string>& seeds, std::mt19937_64& rng) {
    static const char* kTokens[] = {
        "\r\n",     "\r\n\r\n",    ":",        " ",         "\"",          "{",
        "}",        "[",           "]",        ",",         "\\u",         "\\",
        "-",        "1e999",       "0",        "null",      "Host: a\r\n", "Content-Length: 3\r\n",
        "Expect: ", "\"content\"", "\"role\"", "\"tools\"", "\"default\"", "<|start|>",
        "\xff",     "\xc3"};
    std::string s = seeds[rng() % seeds.size()];
    const int n = 1 + int(rng() % 8);
    for (int i = 0; i < n; ++i) {
        const size_t at = s.empty() ? 0 : rng() % (s.size() + 1);
        switch (rng() % 5) {
            case 0:
                if (!s.empty() && at < s.size()) s[at] = char(rng());
                break;
            case 1:
                s.insert(at, kTokens[rng() % std::size(kTokens)]);
                break;
            case 2:
                s.erase(at, rng() % 8);
                break;
            case 3: {  // splice a piece of another seed
                const std::string& o = seeds[rng() % seeds.size()];
                const size_t from = rng() % (o.size() + 1);
                s.insert(at, o.substr(from, rng() % 64));
                break;
            }
            default:
                s.insert(at, std::string(1 + rng() % 4, char(rng())));
                break;
        }
    }
    return s;
}

void run(const char* name, int (*target)(const uint8_t*, size_t), const std::vector<std::string>& seeds) {
    for (const std::string& s : seeds) target(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    std::mt19937_64 rng(std::hash<std::string>{}(name));
    const auto t0 = std::chrono::steady_clock::now();
    size_t n = 0;
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < budget_s()) {
        for (int i = 0; i < 64; ++i, ++n) {
            const std::string s = mutate(seeds, rng);
            target(reinterpret_cast<const uint8_t*>(s.data()), s.size());
        }
    }
    std::printf("%s: %zu inputs\n", name, n);
    EXPECT_GT(n, 0u);
}

TEST(FuzzTargets, HttpRequest) {
    run("http_request", http_request, http_seeds());
}
TEST(FuzzTargets, JsonDocument) {
    run("json_document", json_document, json_seeds());
}
TEST(FuzzTargets, ChatRequest) {
    run("chat_request", chat_request, chat_seeds());
}

}  // namespace
}  // namespace osprey::fuzz
