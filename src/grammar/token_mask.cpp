// The vocabulary trie and per-state masks (see token_mask.h).
#include "grammar/token_mask.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace osprey::grammar {

VocabTrie::VocabTrie(const std::vector<std::string>& token_bytes, const std::vector<bool>& skip)
    : vocab_size_(int(token_bytes.size())) {
    OSPREY_CHECK(skip.empty() || skip.size() == token_bytes.size(), "vocab trie: ", skip.size(), " skip flags for ",
                 token_bytes.size(), " tokens");
    std::vector<int32_t> ids;
    for (int32_t t = 0; t < vocab_size_; ++t)
        if (!token_bytes[size_t(t)].empty() && (skip.empty() || !skip[size_t(t)])) ids.push_back(t);
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
        return token_bytes[size_t(a)] < token_bytes[size_t(b)] || (token_bytes[size_t(a)] == token_bytes[size_t(b)] && a < b);
    });
    // In sorted order, a token's path shares with the previous one the longest common prefix; the
    // nodes past it are new. open[d] is the node at depth d+1 on the current path.
    std::vector<int32_t> open;
    std::string prev;
    for (int32_t t : ids) {
        const std::string& s = token_bytes[size_t(t)];
        OSPREY_CHECK(s.size() < 255, "vocab trie: token ", t, " is ", s.size(), " bytes long");
        size_t common = 0;
        while (common < prev.size() && common < s.size() && prev[common] == s[common]) ++common;
        if (common == s.size() && s.size() == prev.size()) {  // same bytes as the previous token
            extra_.emplace(open.back(), t);
            continue;
        }
        while (open.size() > common) {
            end_[size_t(open.back())] = int32_t(byte_.size());
            open.pop_back();
        }
        for (size_t d = common; d < s.size(); ++d) {
            open.push_back(int32_t(byte_.size()));
            byte_.push_back(uint8_t(s[d]));
            depth_.push_back(uint8_t(d + 1));
            end_.push_back(-1);
            token_.push_back(-1);
        }
        token_[size_t(open.back())] = t;
        max_depth_ = std::max(max_depth_, int(s.size()));
        prev = s;
    }
    for (int32_t n : open) end_[size_t(n)] = int32_t(byte_.size());
}

void VocabTrie::fill(Automaton& a, int32_t state, std::span<uint32_t> mask) const {
    OSPREY_CHECK(mask.size() >= mask_words(vocab_size_), "vocab trie: mask of ", mask.size(), " words");
    int32_t at[256];  // at[d]: the automaton state after the first d bytes of the current path
    at[0] = state;
    const int32_t n = int32_t(byte_.size());
    for (int32_t i = 0; i < n;) {
        const int d = depth_[size_t(i)];
        const int32_t s = a.next(at[d - 1], byte_[size_t(i)]);
        if (s == Automaton::kDead) {
            i = end_[size_t(i)];
            continue;
        }
        at[d] = s;
        if (const int32_t t = token_[size_t(i)]; t >= 0) {
            mask_set(mask, t);
            if (!extra_.empty()) {
                auto [lo, hi] = extra_.equal_range(i);
                for (auto it = lo; it != hi; ++it) mask_set(mask, it->second);
            }
        }
        ++i;
    }
}

TokenMasker::TokenMasker(std::shared_ptr<const VocabTrie> trie, std::shared_ptr<const Grammar> grammar)
    : trie_(std::move(trie)), automaton_(std::move(grammar)) {}

const std::vector<uint32_t>& TokenMasker::mask(int32_t state) {
    auto it = cache_.find(state);
    if (it != cache_.end()) return it->second;
    if (cache_.size() >= kMaxCached) cache_.clear();  // bounded memory for grammars with many states
    std::vector<uint32_t> m(mask_words(trie_->vocab_size()), 0);
    trie_->fill(automaton_, state, m);
    return cache_.emplace(state, std::move(m)).first->second;
}

}  // namespace osprey::grammar
