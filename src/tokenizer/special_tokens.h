// The special tokens of o200k_harmony (shared/spec/harmony.md §1.4): ids 199998..201087, named or
// <|reserved_N|>. Test: tests/tokenizer/test_tokenizer.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace osprey::tok {

constexpr int32_t kFirstSpecialId = 199998;  // = number of BPE ranks in o200k_base
constexpr int32_t kVocabSize = 201088;       // model vocabulary: BPE + specials

struct SpecialToken {
    std::string name;  // e.g. "<|start|>"
    int32_t id;
};

// Every string that encode(…, Specials::allowed) recognises, in id order. Id 200018 has two names,
// "<|endofprompt|>" (from o200k_base; listed first and used by decode) and "<|reserved_200018|>".
const std::vector<SpecialToken>& harmony_special_tokens();

// The name decode() writes for a special id (kFirstSpecialId ≤ id < kVocabSize).
const std::string& special_name(int32_t id);

}  // namespace osprey::tok
