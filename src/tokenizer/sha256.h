// SHA-256 (FIPS 180-4), used to verify the o200k rank file. Test: tests/tokenizer/test_rank_file.cpp.
#pragma once

#include <string>
#include <string_view>

namespace osprey::tok {

// Lower-case hex digest of `data`.
std::string sha256_hex(std::string_view data);

}  // namespace osprey::tok
