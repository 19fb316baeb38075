// Incremental JSON-prefix check: fed the bytes of a document as they are generated, it says whether
// the text so far can still be completed into a document that json::parse (core/json.h, default
// options: depth limit 128, UTF-8 validated, numbers in double range) accepts. It accepts every
// prefix of every valid document and rejects at the first byte after which no completion is valid.
// Used to stream a tool call's arguments only while they can still become valid JSON.
// Tests: tests/frontend/test_json_prefix.cpp (differential against json::parse).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace osprey::frontend {

class JsonPrefix {
public:
    explicit JsonPrefix(int max_depth = 128) : max_depth_(max_depth) {}

    // Feeds one byte; false (now and for every later byte) once the text is no longer a viable prefix.
    bool push(char c);
    // Feeds bytes until one is rejected; returns how many were accepted.
    size_t push(std::string_view s);

    bool viable() const { return viable_; }
    // The text so far is a complete document (json::parse would accept it as it is).
    bool complete() const;

private:
    enum class Mode { value, first_value, key, first_key, colon, after, string, literal, number };
    enum class Num { minus, zero, int_digits, dot, frac, e, e_sign, exp };

    bool step(uint8_t c);
    bool start_value(uint8_t c);
    bool end_value();  // a value just ended: expect ',' / closer / end
    bool number_byte(uint8_t c);
    bool number_viable() const;  // the number so far can still be completed in range
    bool number_in_range() const;
    bool string_byte(uint8_t c);

    int max_depth_;
    bool viable_ = true;
    Mode mode_ = Mode::value;
    std::vector<char> stack_;  // open containers, '[' or '{'
    bool top_done_ = false;    // the top-level value has ended
    // string state
    bool is_key_ = false;
    int escape_ = 0;            // 0 none, 1 after '\', 2..5 reading hex digit 1..4 of \u
    uint32_t hex_ = 0;
    int surrogate_ = 0;         // 0 none, 1 need '\', 2 need 'u' (after a high surrogate), 3 reading the low one
    int utf8_left_ = 0;         // continuation bytes still expected
    uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xbf;  // allowed range of the next continuation byte
    // literal state
    std::string_view literal_;
    size_t literal_pos_ = 0;
    // number state
    Num num_ = Num::minus;
    std::string number_;
};

}  // namespace osprey::frontend
