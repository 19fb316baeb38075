// The o200k_harmony tokenizer from shared/data, loaded once per test binary.
#pragma once

#include <filesystem>
#include <string>

#include "tokenizer/tokenizer.h"

namespace osprey::tok::test {

inline std::filesystem::path rank_file_path() { return std::filesystem::path(OSPREY_SHARED_DIR) / "data" / "o200k_base.tiktoken"; }

inline const Tokenizer& o200k() {
    static const Tokenizer t = Tokenizer::from_tiktoken_file(rank_file_path());
    return t;
}

}  // namespace osprey::tok::test
