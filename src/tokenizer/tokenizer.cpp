// Tokenizer: loaders, encode (special-token scan + pre-tokenizer + BPE), decode, StreamDecoder.
#include "tokenizer/tokenizer.h"

#include <cstdlib>
#include <unordered_map>

#include "core/check.h"
#include "core/file.h"
#include "core/utf8.h"
#include "tokenizer/bpe.h"
#include "tokenizer/hf_json.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/rank_file.h"
#include "tokenizer/sha256.h"
#include "tokenizer/special_tokens.h"

namespace osprey::tok {

struct Tokenizer::Impl {
    explicit Impl(std::vector<std::string> tokens) : bpe(std::move(tokens)) {
        OSPREY_CHECK(bpe.n_tokens() == kFirstSpecialId, "the vocabulary has ", bpe.n_tokens(),
                     " BPE tokens; o200k_harmony needs exactly ", kFirstSpecialId, " (ids below its first special id)");
        for (const SpecialToken& t : harmony_special_tokens()) special_by_name.emplace(t.name, t.id);
    }

    Bpe bpe;
    std::unordered_map<std::string, TokenId> special_by_name;  // every recognised name
    static constexpr size_t kMaxSpecialLen = 32;

    void encode_ordinary(std::string_view text, std::vector<TokenId>& out) const {
        // NOTE: pieces are split a batch ahead and their hash slots prefetched before the lookups:
        // the whole-piece lookup is one cache miss in an 8 MB table and dominated the profile.
        constexpr size_t kBatch = 16;
        std::string_view pieces[kBatch];
        uint64_t hashes[kBatch];
        size_t pos = 0;
        while (pos < text.size()) {
            size_t n = 0;
            for (; n < kBatch && pos < text.size(); ++n) {
                const size_t end = piece_end(text, pos);
                pieces[n] = text.substr(pos, end - pos);
                hashes[n] = Bpe::hash_of(pieces[n]);
                bpe.prefetch(hashes[n]);
                pos = end;
            }
            for (size_t k = 0; k < n; ++k) bpe.encode_piece(pieces[k], hashes[k], out);
        }
    }

    struct SpecialHit {
        size_t begin, end;  // byte range of the special-token string
        TokenId id;
    };

    // The first special-token string in text[from..], if any.
    std::optional<SpecialHit> find_special(std::string_view text, size_t from) const {
        for (size_t p = text.find("<|", from); p != std::string_view::npos; p = text.find("<|", p + 1)) {
            // No special name contains "|>" before its end, so the candidate ends at the next "|>".
            const size_t close = text.find("|>", p + 2);
            if (close == std::string_view::npos) return std::nullopt;
            if (close + 2 - p > kMaxSpecialLen) continue;
            const auto it = special_by_name.find(std::string(text.substr(p, close + 2 - p)));
            if (it != special_by_name.end()) return SpecialHit{p, close + 2, it->second};
        }
        return std::nullopt;
    }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_tiktoken_file(const std::filesystem::path& rank_file) {
    const std::string text = read_file(rank_file);
    std::vector<std::string> tokens = parse_tiktoken_ranks(text, rank_file.string());
    const std::string digest = sha256_hex(text);
    OSPREY_CHECK(digest == kO200kSha256, rank_file.string(), ": sha256 is ", digest, ", expected ", kO200kSha256,
                 " (the o200k_base rank file); the file is corrupt or a different encoding");
    return Tokenizer(std::make_unique<Impl>(std::move(tokens)));
}

Tokenizer Tokenizer::from_hf_json(const std::filesystem::path& tokenizer_json) {
    const std::string text = read_file(tokenizer_json);
    std::vector<std::string> tokens = parse_hf_tokenizer_json(text, tokenizer_json.string());
    return Tokenizer(std::make_unique<Impl>(std::move(tokens)));
}

std::vector<std::filesystem::path> tokenizer_search_paths(const std::filesystem::path& dir) {
    std::vector<std::filesystem::path> paths;
    if (!dir.empty()) {
        paths.push_back(dir / "tokenizer.json");
        paths.push_back(dir / "o200k_base.tiktoken");
        paths.push_back(dir / "original" / "o200k_base.tiktoken");
    }
    if (const char* env = std::getenv("OSPREY_TIKTOKEN_FILE"); env && *env) paths.emplace_back(env);
    if (const char* home = std::getenv("HOME"); home && *home) {
        paths.push_back(std::filesystem::path(home) / ".cache" / "osprey" / "o200k_base.tiktoken");
    }
    return paths;
}

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
    if (path.extension() == ".json") return from_hf_json(path);
    return from_tiktoken_file(path);
}

Tokenizer Tokenizer::from_model_dir(const std::filesystem::path& dir) {
    const auto paths = tokenizer_search_paths(dir);
    std::string tried;
    for (const auto& p : paths) {
        std::error_code ec;
        if (std::filesystem::is_regular_file(p, ec)) return from_file(p);
        tried += "\n  " + p.string();
    }
    OSPREY_FAIL("no tokenizer found", dir.empty() ? std::string() : " for model folder '" + dir.string() + "'",
                "; looked for:", tried,
                "\n(set OSPREY_TIKTOKEN_FILE or run scripts/install_tiny_tokenizer.sh)");
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, Specials specials) const {
    const size_t bad = utf8::first_invalid(text);
    OSPREY_CHECK(bad == std::string_view::npos, "cannot tokenize: invalid UTF-8 at byte ", bad, " of ", text.size());
    std::vector<TokenId> out;
    out.reserve(text.size() / 4 + 4);
    if (specials == Specials::as_text) {
        impl_->encode_ordinary(text, out);
        return out;
    }
    size_t pos = 0;
    while (pos < text.size()) {
        const auto hit = impl_->find_special(text, pos);
        const size_t end = hit ? hit->begin : text.size();
        // Each stretch between special tokens is pre-tokenized on its own, as tiktoken does.
        impl_->encode_ordinary(text.substr(pos, end - pos), out);
        if (!hit) break;
        out.push_back(hit->id);
        pos = hit->end;
    }
    return out;
}

const std::string& Tokenizer::token_bytes(TokenId id) const {
    OSPREY_CHECK(id >= 0 && id < kVocabSize, "token id ", id, " is outside the vocabulary [0, ", kVocabSize, ")");
    if (id < kFirstSpecialId) return impl_->bpe.bytes_of(id);
    return special_name(id);
}

std::string Tokenizer::decode_bytes(std::span<const TokenId> ids) const {
    std::string out;
    out.reserve(ids.size() * 4);
    for (TokenId id : ids) out += token_bytes(id);
    return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
    std::string out = decode_bytes(ids);
    const size_t bad = utf8::first_invalid(out);
    OSPREY_CHECK(bad == std::string::npos, "decoded tokens are not valid UTF-8 (byte ", bad,
                 "); use decode_bytes() or StreamDecoder for partial characters");
    return out;
}

std::optional<TokenId> Tokenizer::special_id(std::string_view name) const {
    const auto it = impl_->special_by_name.find(std::string(name));
    if (it == impl_->special_by_name.end()) return std::nullopt;
    return it->second;
}

bool Tokenizer::is_special(TokenId id) const { return id >= kFirstSpecialId && id < kVocabSize; }

int Tokenizer::vocab_size() const { return kVocabSize; }

namespace {

// Appends s to out, each invalid byte becoming U+FFFD, so that what a stream emits is always text.
void append_replacing_invalid(std::string& out, std::string_view s) {
    if (utf8::is_valid(s)) {
        out += s;
        return;
    }
    size_t i = 0;
    while (i < s.size()) utf8::append(out, utf8::decode(s, i));
}

}  // namespace

std::string StreamDecoder::push(TokenId id) {
    pending_ += tokenizer_->token_bytes(id);
    const size_t n = utf8::complete_prefix_length(pending_);
    std::string out;
    append_replacing_invalid(out, std::string_view(pending_).substr(0, n));
    pending_.erase(0, n);
    return out;
}

std::string StreamDecoder::flush() {
    std::string out;
    append_replacing_invalid(out, pending_);
    pending_.clear();
    return out;
}

}  // namespace osprey::tok
