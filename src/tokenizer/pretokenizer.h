// The o200k pre-tokenizer: splits text into the pieces that BPE encodes one by one, exactly as
// tiktoken's regex (shared/spec/harmony.md §1.2) does under fancy-regex's leftmost-first semantics,
// but as a hand-written scanner. Test: tests/tokenizer/test_pretokenizer.cpp (+ the tiktoken
// differential, tools/tokenizer/differential.py).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace osprey::tok {

// The regex this scanner implements (tiktoken's o200k pat_str; also the Split pattern of tokenizer.json).
inline constexpr std::string_view kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// End (byte offset) of the piece that starts at byte `begin` of `text`. `text` must be valid UTF-8
// and begin < text.size(); the piece is never empty. The scan sees `text` as the whole input: the
// look-ahead in `\s+(?!\S)` treats text.size() as the end of input.
size_t piece_end(std::string_view text, size_t begin);

// Calls on_piece(std::string_view) for each piece of `text` (valid UTF-8), in order.
template <typename F>
void for_each_piece(std::string_view text, F&& on_piece) {
    size_t i = 0;
    while (i < text.size()) {
        const size_t end = piece_end(text, i);
        on_piece(text.substr(i, end - i));
        i = end;
    }
}

// The pieces as strings (for tests and tools).
std::vector<std::string> split_pieces(std::string_view text);

}  // namespace osprey::tok
