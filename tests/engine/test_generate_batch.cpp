// `osprey generate --batch N` end to end: the executable on a small synthetic checkpoint.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include "model/synthetic.h"

namespace {

struct CommandResult {
    int status = -1;
    std::string output;  // stdout and stderr
};

CommandResult run(const std::string& args) {
    const std::string cmd = std::string(OSPREY_BINARY_DIR) + "/osprey " + args + " 2>&1";
    CommandResult r;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return r;
    std::array<char, 4096> buf{};
    while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) r.output.append(buf.data(), n);
    const int st = ::pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

std::filesystem::path small_model() {
    static const std::filesystem::path dir = [] {
        const auto d = std::filesystem::temp_directory_path() / ("osprey-genbatch-" + std::to_string(::getpid()));
        osprey::model::Config c;
        c.n_layers = 2;
        c.d_model = 64;
        c.n_heads = 4;
        c.n_kv_heads = 2;
        c.head_dim = 64;
        c.n_experts = 4;
        c.top_k = 2;
        c.d_ff = 64;
        c.vocab_size = 300;
        c.sliding_window = 16;
        c.eos_token_id = 299;
        c.pad_token_id = 298;
        osprey::model::SyntheticOptions o;
        o.out = d;
        osprey::model::write_synthetic_checkpoint(c, o);
        return d;
    }();
    return dir;
}

struct Cleanup {
    ~Cleanup() {
        std::error_code ec;
        std::filesystem::remove_all(
            std::filesystem::temp_directory_path() / ("osprey-genbatch-" + std::to_string(::getpid())), ec);
    }
} cleanup;

}  // namespace

TEST(generate_batch, runs_many_requests_and_prints_throughput) {
    const CommandResult r =
        run("generate --model " + small_model().string() +
            " --prompt-ids 5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35"
            " --max-tokens 6 --batch 12 --max-batch-tokens 64 --page-size 8 --ignore-eos");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("batch: 12 requests x 1 samples"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("72 tokens generated"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("generated tokens/s"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("request 0:"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(" 0 prefix-hit tokens"), std::string::npos) << "12 prompts share 3 full pages";
}

TEST(generate_batch, distinct_prompts_without_prefix_cache_share_nothing) {
    const std::string base = "generate --model " + small_model().string() +
                             " --prompt-ids 5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33"
                             " --max-tokens 5 --batch 6 --max-batch-tokens 64 --page-size 8 --ignore-eos";
    CommandResult r = run(base + " --prompts distinct --prefix-cache on");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(" 0 prefix-hit tokens"), std::string::npos) << "no two prompts share a page\n" << r.output;
    EXPECT_NE(r.output.find("decode: "), std::string::npos) << r.output;
    r = run(base + " --prefix-cache off");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(" 0 prefix-hit tokens"), std::string::npos) << "the cache is off\n" << r.output;
    r = run(base + " --prefix-cache maybe");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("--prefix-cache must be on or off"), std::string::npos) << r.output;
}

TEST(generate_batch, n_samples_fork_from_the_first) {
    // 4 requests x 3 samples of a 32-token prompt (31 + the distinct token): the 2 other samples of
    // each request fork at position 31, 4 x 2 x 31 = 248 forked tokens, 4 x 3 x 5 tokens generated.
    const CommandResult r = run(
        "generate --model " + small_model().string() +
        " --prompt-ids 5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35"
        " --max-tokens 5 --batch 4 --n 3 --temperature 1 --seed 7 --max-batch-tokens 64 --page-size 8 --ignore-eos");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("batch: 4 requests x 3 samples"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("60 tokens generated"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(" 248 forked tokens"), std::string::npos) << r.output;
    const CommandResult bad = run("generate --model " + small_model().string() + " --prompt-ids 1,2 --batch 2 --n 0");
    EXPECT_EQ(bad.status, 1);
    EXPECT_NE(bad.output.find("--n must be in [1, 128], got 0"), std::string::npos) << bad.output;
}

TEST(generate_batch, bad_options_are_clear_errors) {
    CommandResult r = run("generate --model " + small_model().string() + " --prompt-ids 1,2 --batch 0");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("--batch must be in [1, 100000], got 0"), std::string::npos) << r.output;
    r = run("generate --model " + small_model().string() + " --prompt-ids 1,2 --batch 2 --kv-memory-fraction 0");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("KV memory fraction"), std::string::npos) << r.output;
    r = run("generate --model " + small_model().string() + " --prompt-ids 1,2 --batch 2 --max-tokens 200000");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("exceeds"), std::string::npos) << r.output;
}
