// BPE merge order on tiny hand-made vocabularies, and the short (array) and long (heap) merge paths
// agreeing on the real one.
#include <gtest/gtest.h>

#include <random>

#include "core/check.h"
#include "tokenizer/bpe.h"
#include "tokenizer_fixture.h"

namespace osprey::tok {
namespace {

std::vector<std::string> byte_vocab() {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.push_back(std::string(1, char(b)));
    return t;
}

std::vector<int32_t> encode(const Bpe& bpe, std::string_view piece) {
    std::vector<int32_t> out;
    bpe.encode_piece(piece, out);
    return out;
}

TEST(bpe, lowest_rank_first_then_leftmost) {
    auto t = byte_vocab();
    t.push_back("bc");  // 256
    t.push_back("ab");  // 257
    const Bpe bpe(t);
    EXPECT_EQ(encode(bpe, "abc"), (std::vector<int32_t>{'a', 256}));
    EXPECT_EQ(encode(bpe, "aaa"), (std::vector<int32_t>{'a', 'a', 'a'}));
    auto t2 = byte_vocab();
    t2.push_back("aa");  // 256
    const Bpe bpe2(t2);
    EXPECT_EQ(encode(bpe2, "aaa"), (std::vector<int32_t>{256, 'a'}));  // tie: leftmost pair merges
}

TEST(bpe, merges_use_the_rank_of_the_concatenation) {
    auto t = byte_vocab();
    t.push_back("ab");    // 256
    t.push_back("cd");    // 257
    t.push_back("abcd");  // 258
    const Bpe bpe(t);
    EXPECT_EQ(encode(bpe, "abcd"), (std::vector<int32_t>{258}));
    EXPECT_EQ(encode(bpe, "abcdx"), (std::vector<int32_t>{258, 'x'}));
}

TEST(bpe, rejects_missing_bytes_and_duplicates) {
    auto t = byte_vocab();
    t.pop_back();
    EXPECT_THROW(Bpe{t}, Error);
    auto d = byte_vocab();
    d.push_back("a");
    EXPECT_THROW(Bpe{d}, Error);
}

TEST(bpe, long_pieces_merge_like_short_ones) {
    // Pieces longer than the array path's limit go through the heap; cutting them into <=128-byte
    // windows is not equivalent, so compare against a direct quadratic reference instead.
    const Tokenizer& tok = test::o200k();
    std::vector<std::string> tokens;
    for (int32_t id = 0; id < 199998; ++id) tokens.push_back(tok.token_bytes(id));
    const Bpe bpe(tokens);
    auto reference = [&](std::string_view piece) {
        std::vector<int32_t> parts;
        for (char c : piece) parts.push_back(*bpe.rank_of(std::string_view(&c, 1)));
        while (true) {
            int32_t best = INT32_MAX;
            size_t at = 0;
            for (size_t k = 0; k + 1 < parts.size(); ++k) {
                const int32_t r = bpe.merged_rank(parts[k], parts[k + 1]);
                if (r >= 0 && r < best) best = r, at = k;
            }
            if (best == INT32_MAX) break;
            parts[at] = best;
            parts.erase(parts.begin() + at + 1);
        }
        return parts;
    };
    std::mt19937 rng(7);
    const std::vector<std::string> alphabet = {"a", "b", "e", "n", "t", "\xD0\xB0", "\xD0\xBD", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "ing", "tion"};
    for (int trial = 0; trial < 40; ++trial) {
        std::string piece;
        const size_t len = 100 + rng() % 400;
        while (piece.size() < len) piece += alphabet[rng() % alphabet.size()];
        EXPECT_EQ(encode(bpe, piece), reference(piece)) << "piece of " << piece.size() << " bytes";
    }
}

}  // namespace
}  // namespace osprey::tok
