// Randomised inputs: arbitrary bytes either encode (valid UTF-8) or throw osprey::Error, never crash;
// valid text always round-trips, with or without special tokens; any id sequence decodes or throws.
// OSPREY_TOKENIZER_RANDOM_ITERS scales the run (default 3000 documents).
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "core/check.h"
#include "core/utf8.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer_fixture.h"

namespace osprey::tok {
namespace {

int iterations() {
    const char* env = std::getenv("OSPREY_TOKENIZER_RANDOM_ITERS");
    return env ? std::max(1, std::atoi(env)) : 3000;
}

std::string random_text(std::mt19937& rng) {
    static const uint32_t kInteresting[] = {' ', '\n', '\r', '\t', '\'', 's', 'S', 'A', 'a', '1', '/', '<', '|', '>',
                                            0xA0, 0x17F, 0x301, 0x1C5, 0x2B0, 0x3000, 0x0660, 0x4E2D, 0x1F600, 0x200D,
                                            0xFE0F, 0x10FFFF, 0xE0100};
    std::string s;
    const int n = int(rng() % 200);
    for (int k = 0; k < n; ++k) {
        uint32_t cp;
        switch (rng() % 4) {
            case 0: cp = kInteresting[rng() % (sizeof(kInteresting) / sizeof(kInteresting[0]))]; break;
            case 1: cp = 0x20 + rng() % 0x5f; break;
            case 2: cp = rng() % 0x3000; break;
            default: cp = rng() % 0x110000; break;
        }
        if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;
        utf8::append(s, cp);
        if (rng() % 50 == 0) s += "<|start|>";
    }
    return s;
}

TEST(tokenizer_random, valid_text_round_trips) {
    const Tokenizer& t = test::o200k();
    std::mt19937 rng(1234);
    for (int it = 0; it < iterations(); ++it) {
        const std::string text = random_text(rng);
        std::string joined;
        for_each_piece(text, [&](std::string_view p) {
            ASSERT_FALSE(p.empty());
            joined += p;
        });
        ASSERT_EQ(joined, text);
        ASSERT_EQ(t.decode(t.encode(text)), text) << "iteration " << it;
        ASSERT_EQ(t.decode(t.encode(text, Specials::allowed)), text) << "iteration " << it;
    }
}

TEST(tokenizer_random, arbitrary_bytes_encode_or_throw) {
    const Tokenizer& t = test::o200k();
    std::mt19937 rng(99);
    int n_invalid = 0;
    for (int it = 0; it < iterations(); ++it) {
        std::string bytes(rng() % 64, '\0');
        for (char& c : bytes) c = char(rng() % 4 == 0 ? 0x80 + rng() % 0x80 : rng() % 0x100);
        if (utf8::is_valid(bytes)) {
            EXPECT_EQ(t.decode_bytes(t.encode(bytes)), bytes);
        } else {
            ++n_invalid;
            EXPECT_THROW(t.encode(bytes), Error);
        }
    }
    EXPECT_GT(n_invalid, 0);
}

TEST(tokenizer_random, any_ids_decode_or_throw) {
    const Tokenizer& t = test::o200k();
    std::mt19937 rng(5);
    for (int it = 0; it < iterations(); ++it) {
        std::vector<TokenId> ids(rng() % 16);
        bool in_range = true;
        for (TokenId& id : ids) {
            id = TokenId(int64_t(rng() % 202000) - (rng() % 100 == 0 ? 300000 : 0));
            in_range = in_range && id >= 0 && id < t.vocab_size();
        }
        if (!in_range) {
            EXPECT_THROW(t.decode_bytes(ids), Error);
            continue;
        }
        const std::string bytes = t.decode_bytes(ids);
        StreamDecoder d(t);
        std::string streamed;
        for (TokenId id : ids) {
            const std::string piece = d.push(id);
            EXPECT_TRUE(utf8::is_valid(piece));
            streamed += piece;
        }
        streamed += d.flush();
        EXPECT_TRUE(utf8::is_valid(streamed));
        if (utf8::is_valid(bytes)) {
            EXPECT_EQ(streamed, bytes);
        }
    }
}

}  // namespace
}  // namespace osprey::tok
