// Byte-level BPE over a rank table (tiktoken's algorithm, shared/spec/harmony.md §1.3): a piece
// that is a whole token is one id; otherwise start from bytes and repeatedly merge the adjacent
// pair whose concatenation has the lowest rank (ties: leftmost). Test: tests/tokenizer/test_bpe.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace osprey::tok {

class Bpe {
public:
    // tokens[rank] = the token's bytes. All 256 single bytes must be present, no two tokens may be
    // equal and there may be at most 2^18 tokens (throws osprey::Error naming the problem otherwise).
    explicit Bpe(std::vector<std::string> tokens);

    int n_tokens() const { return int(tokens_.size()); }
    const std::string& bytes_of(int32_t rank) const { return tokens_[size_t(rank)]; }
    std::optional<int32_t> rank_of(std::string_view bytes) const;
    std::optional<int32_t> rank_of(std::string_view bytes, uint64_t hash) const;  // hash = hash_of(bytes)
    static uint64_t hash_of(std::string_view bytes);
    // Starts loading the table slot of a piece whose hash is known, so that a later encode_piece()
    // finds it in cache (encode looks pieces up a few at a time to hide memory latency).
    void prefetch(uint64_t hash) const { __builtin_prefetch(&by_bytes_[hash & (by_bytes_.size() - 1)]); }
    // Rank of the concatenation of tokens a and b, or -1 when it is not a token.
    int32_t merged_rank(int32_t a, int32_t b) const;

    // Appends the ids of one pre-tokenized piece (non-empty) to out.
    void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
    void encode_piece(std::string_view piece, uint64_t hash, std::vector<int32_t>& out) const;

private:
    void merge_short(std::string_view piece, std::vector<int32_t>& out) const;
    void merge_long(std::string_view piece, std::vector<int32_t>& out) const;

    // Hash slot for a byte string: its first 8 bytes packed (zero padded), length and rank, so that
    // tokens of up to 8 bytes (most of them) are compared without touching tokens_.
    struct BytesSlot {
        uint64_t prefix = 0;
        uint32_t len = 0;
        int32_t rank = -1;  // -1: empty
    };

    std::vector<std::string> tokens_;  // [n_tokens] bytes of each rank
    size_t max_token_len_ = 0;
    int32_t byte_rank_[256];
    // Rank of the token made of bytes (x, y), or -1: the first merges of every piece, from a 256 KB
    // table that stays in cache instead of the pair hash table.
    std::vector<int32_t> byte_pair_rank_;  // [256 * 256]
    std::vector<BytesSlot> by_bytes_;  // [power of two ≥ 2 n_tokens], linear probing
    // Merges packed in one word: (a << 18 | b) << 18 | rank, ~0 = empty (ids < 2^18); linear probing.
    std::vector<uint64_t> pairs_;  // [power of two ≥ 2 n_pairs]
};

}  // namespace osprey::tok
