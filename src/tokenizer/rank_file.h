// Reads a tiktoken rank file (`<base64 bytes> <rank>` per line; shared/data/README.md).
// Test: tests/tokenizer/test_rank_file.cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace osprey::tok {

// The sha256 of OpenAI's o200k_base.tiktoken (hard-coded in tiktoken and harmony).
constexpr std::string_view kO200kSha256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d";

// Parses the text of a rank file into tokens[rank]. Ranks must be exactly 0..N-1, each once.
// Throws osprey::Error naming `source`, the line and the problem.
std::vector<std::string> parse_tiktoken_ranks(std::string_view text, std::string_view source);

}  // namespace osprey::tok
