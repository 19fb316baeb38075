#include <gtest/gtest.h>

#include "core/utf8.h"

namespace utf8 = osprey::utf8;

TEST(utf8, validates_strictly) {
    EXPECT_TRUE(utf8::is_valid("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80"));
    EXPECT_EQ(utf8::first_invalid("ab\xc0\xafx"), 2u);         // overlong
    EXPECT_EQ(utf8::first_invalid("\xed\xa0\x80"), 0u);        // surrogate
    EXPECT_EQ(utf8::first_invalid("\xf4\x90\x80\x80"), 0u);    // above U+10FFFF
    EXPECT_EQ(utf8::first_invalid("ok\xe2\x82"), 2u);          // truncated
}

TEST(utf8, complete_prefix_holds_back_unfinished_characters) {
    EXPECT_EQ(utf8::complete_prefix_length("ab\xf0\x9f\x98"), 2u);
    EXPECT_EQ(utf8::complete_prefix_length("ab\xf0\x9f\x98\x80"), 6u);
    EXPECT_EQ(utf8::complete_prefix_length("ab\xc3"), 2u);
    EXPECT_EQ(utf8::complete_prefix_length("abc"), 3u);
}

TEST(utf8, decode_and_append_round_trip) {
    for (uint32_t cp : {0x41u, 0xe9u, 0x20acu, 0x1f600u, 0x10ffffu}) {
        std::string s;
        utf8::append(s, cp);
        size_t i = 0;
        EXPECT_EQ(utf8::decode(s, i), cp);
        EXPECT_EQ(i, s.size());
    }
}
