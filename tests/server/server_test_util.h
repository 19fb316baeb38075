// Shared helpers of the server tests: the o200k_harmony tokenizer from shared/data.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace osprey::test {

inline const tok::Tokenizer& harmony_tokenizer() {
    static const tok::Tokenizer t = tok::Tokenizer::from_tiktoken_file(std::string(OSPREY_SHARED_DIR) +
                                                                       "/data/o200k_base.tiktoken");
    return t;
}

}  // namespace osprey::test
