// The o200k_harmony tokenizer: o200k_base byte-level BPE (ranks from a tiktoken rank file or a
// Hugging Face tokenizer.json) plus the Harmony special tokens. CPU-only. Spec: shared/spec/harmony.md §1.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace osprey::tok {

using TokenId = int32_t;

// How special-token strings (e.g. "<|start|>") inside text are treated by encode().
enum class Specials {
    as_text,  // encoded as ordinary text, byte by byte through BPE
    allowed,  // recognised and emitted as their special ids
};

class Tokenizer {
public:
    // Each loader throws osprey::Error naming the file and the problem.
    static Tokenizer from_tiktoken_file(const std::filesystem::path& rank_file);
    static Tokenizer from_hf_json(const std::filesystem::path& tokenizer_json);
    // A model folder: the first existing file of tokenizer_search_paths(dir) (throws listing them all).
    static Tokenizer from_model_dir(const std::filesystem::path& dir);
    // A *.json file as tokenizer.json, anything else as a tiktoken rank file.
    static Tokenizer from_file(const std::filesystem::path& path);

    // Throws osprey::Error on invalid UTF-8 (naming the byte offset): text must be text, and a
    // silent replacement would change what the model sees.
    std::vector<TokenId> encode(std::string_view text, Specials specials = Specials::as_text) const;
    // Concatenated bytes of the tokens (may be invalid UTF-8 when cut mid-character). Throws on an
    // id outside the vocabulary.
    std::string decode_bytes(std::span<const TokenId> ids) const;
    // Strict: throws osprey::Error when the bytes are not valid UTF-8.
    std::string decode(std::span<const TokenId> ids) const;
    const std::string& token_bytes(TokenId id) const;

    std::optional<TokenId> special_id(std::string_view name) const;  // "<|start|>" -> 200006
    bool is_special(TokenId id) const;
    int vocab_size() const;  // 201088 for o200k_harmony (ids beyond the named specials are reserved)

    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;
    ~Tokenizer();

private:
    struct Impl;
    explicit Tokenizer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// Where from_model_dir(dir) looks, in order: dir/tokenizer.json, dir/o200k_base.tiktoken,
// dir/original/o200k_base.tiktoken, $OSPREY_TIKTOKEN_FILE, $HOME/.cache/osprey/o200k_base.tiktoken.
// An empty dir skips the first three.
std::vector<std::filesystem::path> tokenizer_search_paths(const std::filesystem::path& dir);

// Turns a stream of token ids into text without ever emitting part of a UTF-8 character: bytes of
// an unfinished character are held until the next token completes it.
class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}
    std::string push(TokenId id);  // the newly completed text (possibly empty; invalid bytes become U+FFFD)
    std::string flush();           // what is left at the end (invalid bytes become U+FFFD)

private:
    const Tokenizer* tokenizer_;
    std::string pending_;
};

}  // namespace osprey::tok
