// Rank-file parsing: the real file, and every kind of corruption giving an error that names it.
#include <gtest/gtest.h>

#include <fstream>

#include "core/check.h"
#include "core/file.h"
#include "tokenizer/rank_file.h"
#include "tokenizer/sha256.h"
#include "tokenizer_fixture.h"

namespace osprey::tok {
namespace {

std::string error_of(std::string_view text) {
    try {
        parse_tiktoken_ranks(text, "f.tiktoken");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(rank_file, real_file_matches_the_spec) {
    const std::string text = read_file(test::rank_file_path());
    EXPECT_EQ(text.size(), 3613922u);
    EXPECT_EQ(sha256_hex(text), kO200kSha256);
    const auto tokens = parse_tiktoken_ranks(text, "o200k");
    EXPECT_EQ(tokens.size(), 199998u);
    EXPECT_EQ(tokens[0], "!");
    EXPECT_EQ(tokens[24912], "hello");
}

TEST(rank_file, sha256_known_vectors) {
    EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(sha256_hex(std::string(56, 'a')), "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
    EXPECT_EQ(sha256_hex(std::string(1000, 'x')).size(), 64u);
}

TEST(rank_file, parses_a_small_file) {
    const auto t = parse_tiktoken_ranks("YQ== 1\nYWI= 0\r\n\nYWJj 2", "f");
    EXPECT_EQ(t, (std::vector<std::string>{"ab", "a", "abc"}));
}

TEST(rank_file, corruptions_are_named) {
    EXPECT_NE(error_of("YQ==1\n").find("f.tiktoken:1: expected"), std::string::npos);
    EXPECT_NE(error_of("YQ== 0\nY!== 1\n").find("f.tiktoken:2: invalid base64"), std::string::npos);
    EXPECT_NE(error_of("YQ= 0\n").find("invalid base64"), std::string::npos);
    EXPECT_NE(error_of("YQ== x\n").find("invalid rank 'x'"), std::string::npos);
    EXPECT_NE(error_of("YQ== -1\n").find("invalid rank"), std::string::npos);
    EXPECT_NE(error_of("YQ== 0\nYg== 0\n").find("rank 0 appears twice"), std::string::npos);
    EXPECT_NE(error_of("YQ== 1\n").find("rank 0 is missing"), std::string::npos);
    EXPECT_NE(error_of("").find("no tokens"), std::string::npos);
    EXPECT_NE(error_of("YQ== 99999999999\n").find("invalid rank"), std::string::npos);
}

TEST(rank_file, a_changed_file_fails_the_hash_check) {
    std::string text = read_file(test::rank_file_path());
    // Swap the bytes of ranks 0 and 1: still a well-formed file, but not o200k_base.
    ASSERT_EQ(text.compare(0, 14, "IQ== 0\nIg== 1\n"), 0);
    text.replace(0, 14, "Ig== 0\nIQ== 1\n");
    const auto path = std::filesystem::temp_directory_path() / "osprey_test_swapped.tiktoken";
    std::ofstream(path, std::ios::binary) << text;
    try {
        Tokenizer::from_tiktoken_file(path);
        FAIL() << "a modified rank file must be rejected";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("sha256"), std::string::npos) << e.what();
    }
    std::filesystem::remove(path);
    EXPECT_THROW(Tokenizer::from_tiktoken_file("/nonexistent/o200k_base.tiktoken"), Error);
}

}  // namespace
}  // namespace osprey::tok
