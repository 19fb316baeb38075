// Fuzz test of the streaming parser: random token sequences (formatting tokens, header words, text,
// partial UTF-8, reserved and out-of-vocabulary ids) pushed in random chunks. Checks: no exception,
// no hang, streamed deltas == final content, every delta and content valid UTF-8, one start and one end
// event per message, and no content byte lost (every text run after a <|message|> appears, in order,
// in the messages' content).
// Size: OSPREY_HARMONY_FUZZ_SEQUENCES (default 200000, ~4 s; the 1M run is the same test).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <random>

#include "core/utf8.h"
#include "harmony/stream_parser.h"
#include "harmony_fixture.h"

namespace osprey::harmony {
namespace {

size_t n_sequences() {
    const char* env = std::getenv("OSPREY_HARMONY_FUZZ_SEQUENCES");
    return env ? std::strtoull(env, nullptr, 10) : 200000;
}

bool is_formatting_or_invalid(TokenId t, int vocab) {
    return t < 0 || t >= vocab || test::o200k().is_special(t);
}

// U+FFFD for every maximal invalid subpart, as the parser decodes (Rust's from_utf8_lossy).
std::string lossy(const std::string& bytes) {
    std::string out;
    size_t i = 0;
    while (i < bytes.size()) {
        const size_t n = utf8::sequence_length(bytes, i);
        if (n > 0) {
            out.append(bytes, i, n);
            i += n;
            continue;
        }
        out += "\xEF\xBF\xBD";
        // Skip the maximal subpart: the lead byte and the continuation bytes that could still follow it.
        const auto b = uint8_t(bytes[i]);
        size_t need = b >= 0xC2 && b <= 0xDF ? 1 : b >= 0xE0 && b <= 0xEF ? 2 : b >= 0xF0 && b <= 0xF4 ? 3 : 0;
        ++i;
        for (size_t k = 0; k < need && i < bytes.size(); ++k) {
            const auto c = uint8_t(bytes[i]);
            bool ok = c >= 0x80 && c <= 0xBF;
            if (k == 0 && b == 0xE0) ok = c >= 0xA0 && c <= 0xBF;
            if (k == 0 && b == 0xED) ok = c >= 0x80 && c <= 0x9F;
            if (k == 0 && b == 0xF0) ok = c >= 0x90 && c <= 0xBF;
            if (k == 0 && b == 0xF4) ok = c >= 0x80 && c <= 0x8F;
            if (!ok) break;
            ++i;
        }
    }
    return out;
}

TEST(harmony_parser_fuzz, random_token_sequences) {
    const tok::Tokenizer& tk = test::o200k();
    const int vocab = tk.vocab_size();
    // Tokens that make headers: formatting tokens, role/channel words, " to", "=", "json", ".", text.
    std::vector<TokenId> header_words{kStart, kEnd, kMessage, kChannel, kConstrain, kReturn, kCall,
                                      173781, 1428, 17360, 35644, 17196, 12606, 815, 316, 28, 4108, 5701, 3490};
    for (const char* w : {"functions", ".", "get_weather", "browser", " search", "to", "json", "assistant", "\n", " "})
        for (TokenId t : tk.encode(w)) header_words.push_back(t);
    std::vector<TokenId> text_tokens;
    for (const char* w : {"Hello", " world", "\xF0\x9F\x92\x96", "\xE4\xBD\xA0\xE5\xA5\xBD", "\xC3\xA9t\xC3\xA9", "{\"a\": 1}"})
        for (TokenId t : tk.encode(w)) text_tokens.push_back(t);
    text_tokens.push_back(9552);  // 20 F0 9F: an unfinished character

    std::mt19937_64 rng(20260101);
    auto pick = [&](size_t n) { return size_t(rng() % n); };
    auto random_token = [&]() -> TokenId {
        const size_t r = pick(100);
        if (r < 35) return header_words[pick(header_words.size())];
        if (r < 60) return text_tokens[pick(text_tokens.size())];
        if (r < 90) return TokenId(pick(199998));            // any BPE token
        if (r < 96) return TokenId(199998 + pick(vocab - 199998));  // specials incl. reserved
        return r < 98 ? TokenId(-1 - int(pick(5))) : TokenId(vocab + int(pick(5)));
    };

    const size_t n = n_sequences();
    size_t n_tokens = 0, n_messages = 0, n_repairs = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t s = 0; s < n; ++s) {
        // Mostly short streams dense in formatting tokens; 1 in 32 is long and mostly text, so headers
        // overrun kMaxHeaderTokens and long contents stream.
        const bool long_stream = pick(32) == 0;
        std::vector<TokenId> ids(long_stream ? pick(600) : pick(64));
        for (TokenId& t : ids) t = long_stream && pick(50) != 0 ? TokenId(pick(199998)) : random_token();
        n_tokens += ids.size();
        StreamParserOptions options;
        if (pick(2) == 0) options.first_role = std::nullopt;
        StreamParser parser(tk, options);
        std::vector<Event> events;
        try {
            for (size_t i = 0; i < ids.size();) {
                const size_t chunk = 1 + pick(8);
                const size_t end = std::min(ids.size(), i + chunk);
                std::vector<Event> ev = parser.push(std::span<const TokenId>(ids.data() + i, end - i));
                events.insert(events.end(), ev.begin(), ev.end());
                i = end;
            }
            std::vector<Event> ev = parser.finish();
            events.insert(events.end(), ev.begin(), ev.end());
        } catch (const std::exception& e) {
            FAIL() << "sequence " << s << " threw: " << e.what();
        }
        const std::vector<Message>& msgs = parser.messages();
        n_messages += msgs.size();
        n_repairs += parser.n_repairs();
        std::vector<std::string> streamed(msgs.size());
        std::vector<int> starts(msgs.size()), ends(msgs.size());
        for (const Event& e : events) {
            ASSERT_LT(e.index, msgs.size()) << "sequence " << s;
            if (e.kind == EventKind::content_delta) {
                ASSERT_TRUE(utf8::is_valid(e.text)) << "sequence " << s << ": delta splits a character";
                ASSERT_FALSE(e.text.empty());
                streamed[e.index] += e.text;
            }
            if (e.kind == EventKind::message_start) ++starts[e.index];
            if (e.kind == EventKind::message_end) ++ends[e.index];
        }
        std::string all_content;
        for (size_t i = 0; i < msgs.size(); ++i) {
            const std::string text = msgs[i].text();
            ASSERT_EQ(streamed[i], text) << "sequence " << s << " message " << i;
            ASSERT_TRUE(utf8::is_valid(text));
            ASSERT_EQ(starts[i], 1);
            ASSERT_EQ(ends[i], 1);
            all_content += text;
        }
        // No content byte lost: each run of ordinary tokens right after <|message|> is in the content.
        size_t from = 0;
        for (size_t i = 0; i < ids.size(); ++i) {
            if (ids[i] != kMessage) continue;
            std::string run;
            size_t j = i + 1;
            while (j < ids.size() && !is_formatting_or_invalid(ids[j], vocab)) run += tk.token_bytes(ids[j++]);
            if (run.empty()) continue;
            const std::string want = lossy(run);
            const size_t at = all_content.find(want, from);
            ASSERT_NE(at, std::string::npos) << "sequence " << s << ": content after token " << i << " lost";
            from = at + want.size();
        }
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("fuzz: %zu sequences, %zu tokens, %zu messages, %zu repairs, %.2f s\n", n, n_tokens, n_messages,
                n_repairs, secs);
}

}  // namespace
}  // namespace osprey::harmony
