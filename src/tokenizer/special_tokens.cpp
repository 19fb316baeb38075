// The o200k_harmony special-token table (see special_tokens.h).
#include "tokenizer/special_tokens.h"

#include <algorithm>
#include <cassert>

namespace osprey::tok {
namespace {

std::vector<SpecialToken> build() {
    std::vector<SpecialToken> out = {
        {"<|startoftext|>", 199998}, {"<|endoftext|>", 199999}, {"<|return|>", 200002},  {"<|constrain|>", 200003},
        {"<|channel|>", 200005},     {"<|start|>", 200006},     {"<|end|>", 200007},     {"<|message|>", 200008},
        {"<|call|>", 200012},        {"<|endofprompt|>", 200018},
    };
    for (int32_t id : {200000, 200001, 200004, 200009, 200010, 200011}) {
        out.push_back({"<|reserved_" + std::to_string(id) + "|>", id});
    }
    for (int32_t id = 200013; id < kVocabSize; ++id) out.push_back({"<|reserved_" + std::to_string(id) + "|>", id});
    // Stable: for id 200018 "<|endofprompt|>" stays ahead of "<|reserved_200018|>".
    std::stable_sort(out.begin(), out.end(), [](const SpecialToken& a, const SpecialToken& b) { return a.id < b.id; });
    return out;
}

}  // namespace

const std::vector<SpecialToken>& harmony_special_tokens() {
    static const std::vector<SpecialToken> tokens = build();
    return tokens;
}

const std::string& special_name(int32_t id) {
    static const std::vector<const std::string*> names = [] {
        std::vector<const std::string*> v(kVocabSize - kFirstSpecialId, nullptr);
        for (const SpecialToken& t : harmony_special_tokens()) {
            if (!v[t.id - kFirstSpecialId]) v[t.id - kFirstSpecialId] = &t.name;
        }
        return v;
    }();
    assert(id >= kFirstSpecialId && id < kVocabSize);
    return *names[id - kFirstSpecialId];
}

}  // namespace osprey::tok
