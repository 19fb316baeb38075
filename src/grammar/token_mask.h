// Grammar states -> allowed-token masks over a tokenizer's vocabulary. The vocabulary's byte strings
// form a trie, stored flat in preorder (each node knows where its subtree ends), so one mask is a
// linear scan that follows the automaton byte by byte and skips every subtree whose prefix the
// grammar refuses. Tokens that end mid-character are fine: the grammar is over bytes. Masks are
// cached per automaton state, and JSON output revisits few states (inside a string every character
// leads back to the same one), so most steps cost a copy. Special tokens are never in the trie: the
// caller decides about them (end of output, Harmony markers).
// Tests: tests/grammar/test_token_mask.cpp; cost: bench/bench_token_mask.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#include "grammar/automaton.h"

namespace osprey::grammar {

// Bit t % 32 of word t / 32 is set when token t is allowed. [mask_words(vocab_size)] words.
inline size_t mask_words(int vocab_size) { return size_t(vocab_size + 31) / 32; }
inline void mask_set(std::span<uint32_t> m, int32_t t) { m[size_t(t) >> 5] |= uint32_t(1) << (t & 31); }
inline bool mask_has(std::span<const uint32_t> m, int32_t t) { return (m[size_t(t) >> 5] >> (t & 31)) & 1; }

class VocabTrie {
public:
    // token_bytes[t]: the bytes of token t; tokens with empty bytes or `skip[t]` set (special tokens)
    // are left out.
    VocabTrie(const std::vector<std::string>& token_bytes, const std::vector<bool>& skip);
    int vocab_size() const { return vocab_size_; }
    size_t n_nodes() const { return byte_.size(); }

    // Sets the bit of every trie token whose bytes the automaton accepts from `state` (a prefix of
    // some sentence: the state after them is not dead). `mask` is not cleared first.
    void fill(Automaton& a, int32_t state, std::span<uint32_t> mask) const;

private:
    int vocab_size_ = 0;
    // Preorder nodes below the root: byte, depth (1 = child of the root), one past the subtree's last
    // node, and the token ending there (-1 none; more tokens with the same bytes in extra_).
    std::vector<uint8_t> byte_;
    std::vector<uint8_t> depth_;
    std::vector<int32_t> end_;
    std::vector<int32_t> token_;
    std::unordered_multimap<int32_t, int32_t> extra_;  // node -> further tokens with its bytes
    int max_depth_ = 0;
};

// The trie of a tokenizer's vocabulary (any type with vocab_size(), is_special(t) and token_bytes(t),
// the last throwing osprey::Error for a reserved id): special tokens and reserved ids are left out.
// Header-only, so that this library stays free of the tokenizer.
template <class Tokenizer>
std::shared_ptr<const VocabTrie> vocab_trie_of(const Tokenizer& t) {
    std::vector<std::string> bytes(static_cast<size_t>(t.vocab_size()));
    std::vector<bool> skip(bytes.size(), false);
    for (int i = 0; i < t.vocab_size(); ++i) {
        if (t.is_special(i)) {
            skip[size_t(i)] = true;
            continue;
        }
        try {
            bytes[size_t(i)] = t.token_bytes(i);
        } catch (const Error&) {
            skip[size_t(i)] = true;  // a reserved id
        }
    }
    return std::make_shared<const VocabTrie>(bytes, skip);
}

// One automaton with the masks of its states cached (shared by the steps of one request).
class TokenMasker {
public:
    TokenMasker(std::shared_ptr<const VocabTrie> trie, std::shared_ptr<const Grammar> grammar);
    Automaton& automaton() { return automaton_; }
    const VocabTrie& trie() const { return *trie_; }
    // The allowed trie tokens from `state` (cached).
    const std::vector<uint32_t>& mask(int32_t state);

private:
    static constexpr size_t kMaxCached = 1024;  // masks kept (25 KiB each for o200k)
    std::shared_ptr<const VocabTrie> trie_;
    Automaton automaton_;
    std::unordered_map<int32_t, std::vector<uint32_t>> cache_;
};

}  // namespace osprey::grammar
