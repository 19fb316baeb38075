// The incremental JSON-prefix check (src/frontend/json_prefix.h) against json::parse: every prefix of
// every document the parser accepts is viable (so it never rejects too early), every viable prefix
// can be completed into a document the parser accepts (so it never accepts too long; the completion
// is built greedily, driven by the check itself), and on any text "viable and complete" agrees with
// the parser. Random documents (escapes, surrogate pairs, UTF-8, numbers near the double range,
// whitespace) and random byte mutations of them. OSPREY_JSON_PREFIX_DOCS=<n> runs more documents.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "core/json.h"
#include "frontend/json_prefix.h"

namespace osprey::frontend {
namespace {

bool parses(const std::string& text) {
    try {
        json::parse(text);
        return true;
    } catch (const std::exception&) {
        return false;
    }
}

size_t accepted(const std::string& text, JsonPrefix& p) { return p.push(text); }

bool complete_text(const std::string& text) {
    JsonPrefix p;
    return accepted(text, p) == text.size() && p.complete();
}

class Gen {
public:
    explicit Gen(uint64_t seed) : rng_(seed) {}
    int pick(int n) { return int(rng_() % uint64_t(n)); }
    std::string ws() {
        static const char kWs[] = " \t\n\r";
        std::string s;
        for (int n = pick(4) == 0 ? pick(3) : 0; n > 0; --n) s += kWs[pick(4)];
        return s;
    }
    std::string digits(int min) {
        std::string s;
        for (int n = min + pick(4); n > 0; --n) s += char('0' + pick(10));
        return s;
    }
    std::string number() {
        std::string s = pick(3) == 0 ? "-" : "";
        s += pick(4) == 0 ? "0" : std::string(1, char('1' + pick(9))) + digits(0);
        if (pick(2)) s += "." + digits(1);
        if (pick(2)) {
            s += pick(2) ? "e" : "E";
            const int sign = pick(3);
            if (sign) s += sign == 1 ? "+" : "-";
            if (pick(5) == 0) s += std::string(size_t(pick(3)), '0');                  // leading zeros
            s += pick(6) == 0 ? std::to_string(290 + pick(60)) : digits(1).substr(0, 2);  // near the range edges
        }
        if (pick(20) == 0) s = "0." + std::string(size_t(300 + pick(40)), '0') + "1e" + std::to_string(pick(40));
        return s;
    }
    std::string string() {
        static const char* kPieces[] = {"a", "Z", " ", "q", "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t",
                                        "\\u0041", "\\u00e9", "\\uD83D\\uDE00", "\\ud800\\udfff", "é", "€", "😀", "{",
                                        "]", ":", ","};
        std::string s = "\"";
        for (int n = pick(6); n > 0; --n) s += kPieces[pick(int(std::size(kPieces)))];
        return s + "\"";
    }
    std::string value(int depth) {
        const int kind = depth >= 4 ? 2 + pick(3) : pick(5);
        std::string s;
        if (kind == 0) {
            s = "{" + ws();
            for (int n = pick(4), i = 0; i < n; ++i) {
                if (i) s += "," + ws();
                s += string() + ws() + ":" + ws() + value(depth + 1) + ws();
            }
            return s + "}";
        }
        if (kind == 1) {
            s = "[" + ws();
            for (int n = pick(4), i = 0; i < n; ++i) {
                if (i) s += "," + ws();
                s += value(depth + 1) + ws();
            }
            return s + "]";
        }
        if (kind == 2) return string();
        if (kind == 3) return number();
        static const char* kLiterals[] = {"true", "false", "null"};
        return kLiterals[pick(3)];
    }
    std::string document() { return ws() + value(0) + ws(); }
    std::string mutate(std::string s) {
        static const char kBytes[] = "{}[],:\"\\ 0123456789.eE+-tfnulrsdcaxu\x01\x1f\x7f\x80\xbf\xc0\xc3\xe0\xed\xf0\xf4\xff";
        for (int n = 1 + pick(3); n > 0; --n) {
            const size_t at = s.empty() ? 0 : size_t(pick(int(s.size())));
            const char b = kBytes[pick(int(sizeof kBytes - 1))];
            switch (pick(4)) {
                case 0: if (!s.empty()) s.erase(at, 1); break;
                case 1: s.insert(at, 1, b); break;
                case 2: if (!s.empty()) s[at] = b; break;
                default: s.resize(at); break;
            }
        }
        return s;
    }

private:
    std::mt19937_64 rng_;
};

// Completes a viable prefix greedily, preferring bytes that end things; checks the result parses.
void expect_completable(const std::string& prefix) {
    JsonPrefix p;
    ASSERT_EQ(accepted(prefix, p), prefix.size()) << prefix;
    static const std::string kOrder = "\"}]:e-9876543210dcu\\ralsn,\x80\xa0";
    std::string text = prefix;
    for (int step = 0; !p.complete(); ++step) {
        ASSERT_LT(step, 5000) << "no completion found for: " << prefix;
        bool moved = false;
        for (char c : kOrder) {
            JsonPrefix q = p;
            if (q.push(c)) {
                p = q;
                text += c;
                moved = true;
                break;
            }
        }
        ASSERT_TRUE(moved) << "a viable prefix with no viable next byte: " << text;
    }
    EXPECT_TRUE(parses(text)) << "viable prefix " << prefix << " completed to " << text << " which does not parse";
}

void check_text(const std::string& text, std::mt19937_64& rng) {
    JsonPrefix p;
    const size_t n = accepted(text, p);
    const bool ok = parses(text);
    EXPECT_EQ(ok, n == text.size() && p.complete()) << text;
    if (ok) {
        EXPECT_EQ(n, text.size()) << "a prefix of a valid document was rejected: " << text;
    }
    // The longest viable prefix, and a random shorter one, can be completed.
    expect_completable(text.substr(0, n));
    if (n > 0) expect_completable(text.substr(0, size_t(rng() % n)));
}

TEST(JsonPrefix, RandomDocumentsPrefixesAndMutations) {
    int docs = 20000;
    if (const char* env = std::getenv("OSPREY_JSON_PREFIX_DOCS")) docs = std::atoi(env);
    Gen gen(20261129);
    std::mt19937_64 rng(7);
    int valid = 0;
    for (int i = 0; i < docs; ++i) {
        const std::string doc = gen.document();
        valid += parses(doc);
        check_text(doc, rng);
        for (int m = 0; m < 4; ++m) check_text(gen.mutate(doc), rng);
        if (HasFailure()) return;
    }
    EXPECT_GT(valid, docs * 3 / 4);  // the generator mostly writes valid documents
}

TEST(JsonPrefix, Basics) {
    EXPECT_TRUE(JsonPrefix().viable());
    EXPECT_FALSE(JsonPrefix().complete());
    EXPECT_TRUE(complete_text("{\"a\": [1, 2.5e3, true, null, \"x\"]}\n"));
    EXPECT_TRUE(complete_text("12"));
    EXPECT_FALSE(complete_text("12."));
    JsonPrefix p;
    EXPECT_EQ(p.push(std::string("{\"city\": \"Paris\"} x")), 18u);  // text after the document
    EXPECT_FALSE(p.viable());
    EXPECT_FALSE(p.push('}'));  // stays rejected
    JsonPrefix q;
    EXPECT_EQ(q.push(std::string("{\"a\" 1}")), 5u);  // missing ':'
}

TEST(JsonPrefix, EscapesAndSurrogatesRejectedAtTheFirstImpossibleByte) {
    EXPECT_EQ(JsonPrefix().push(std::string("\"\\uDC")), 5u - 1);     // a lone low surrogate: rejected at 'C'
    EXPECT_EQ(JsonPrefix().push(std::string("\"\\uD83D\\n")), 8u);    // high surrogate not followed by \u
    EXPECT_EQ(JsonPrefix().push(std::string("\"\\uD83D\\uA")), 9u);   // low half must start with d
    EXPECT_EQ(JsonPrefix().push(std::string("\"\\x")), 2u);
    EXPECT_EQ(JsonPrefix().push(std::string("\"\xed\xa0")), 2u);       // UTF-8-encoded surrogate
    EXPECT_EQ(JsonPrefix().push(std::string("\"\xe0\x80")), 2u);       // overlong
    EXPECT_EQ(JsonPrefix().push(std::string("\"\t")), 1u);             // raw control character
}

TEST(JsonPrefix, NumbersOutOfDoubleRangeAsTheParserSeesThem) {
    std::mt19937_64 rng(1);
    const std::string tiny = "0." + std::string(400, '0') + "1";
    const std::string huge = "1" + std::string(400, '0');
    for (const std::string& s : {std::string("1e400"), std::string("1e-400"), std::string("[1e30"), tiny, tiny + "e0",
                                 tiny + "e04", tiny + "e-1", tiny + "e5", tiny + "e+", huge, huge + "e", huge + "e+",
                                 huge + "e-0", huge + "e-4", huge + "e-40", huge + "e-5", std::string("-0e-99999")}) {
        check_text(s, rng);
        check_text("[" + s + "]", rng);
    }
    EXPECT_FALSE(complete_text("1e400"));
    EXPECT_EQ(JsonPrefix().push(std::string("1e400")), 4u);  // e40 is fine, e400 can never be
    EXPECT_EQ(JsonPrefix().push(huge + "e+"), huge.size() + 1);
    EXPECT_TRUE(complete_text(tiny + "e0400"));
}

TEST(JsonPrefix, NestingLimitAsTheParser) {
    for (int n : {127, 128, 129, 130}) {
        const std::string open(size_t(n), '[');
        std::mt19937_64 rng(2);
        check_text(open + std::string(size_t(n), ']'), rng);
        check_text(open + "0" + std::string(size_t(n), ']'), rng);
    }
}

}  // namespace
}  // namespace osprey::frontend
