// tokenizer.json reader and writer (see hf_json.h). Test: tests/tokenizer/test_hf_json.cpp.
#include "tokenizer/hf_json.h"

#include <algorithm>
#include <array>
#include <unordered_map>

#include "core/check.h"
#include "core/json.h"
#include "core/utf8.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/special_tokens.h"

namespace osprey::tok {
namespace {

// GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order.
const std::array<uint32_t, 256>& byte_to_char() {
    static const std::array<uint32_t, 256> table = [] {
        std::array<uint32_t, 256> t{};
        uint32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
            t[b] = printable ? uint32_t(b) : next++;
        }
        return t;
    }();
    return table;
}

std::string to_byte_level(std::string_view bytes) {
    std::string out;
    for (char c : bytes) utf8::append(out, byte_to_char()[uint8_t(c)]);
    return out;
}

// Inverse of to_byte_level; false when a char is not in the byte-level alphabet.
bool from_byte_level(std::string_view s, std::string& out) {
    static const std::unordered_map<uint32_t, uint8_t> inverse = [] {
        std::unordered_map<uint32_t, uint8_t> m;
        for (int b = 0; b < 256; ++b) m.emplace(byte_to_char()[b], uint8_t(b));
        return m;
    }();
    out.clear();
    size_t i = 0;
    while (i < s.size()) {
        if (utf8::sequence_length(s, i) == 0) return false;
        const auto it = inverse.find(utf8::decode(s, i));
        if (it == inverse.end()) return false;
        out += char(it->second);
    }
    return !out.empty();
}

const json::Value& member(const json::Value& obj, std::string_view key, std::string_view source,
                          std::string_view where) {
    OSPREY_CHECK(obj.is_object(), source, ": ", where, " must be an object");
    const json::Value* v = obj.find(key);
    OSPREY_CHECK(v != nullptr, source, ": ", where, " has no \"", key, "\"");
    return *v;
}

// True when the pre-tokenizer (a Split, or a Sequence holding one) uses the o200k pattern.
bool has_o200k_split(const json::Value& pre) {
    if (!pre.is_object()) return false;
    const json::Value* type = pre.find("type");
    if (!type || !type->is_string()) return false;
    if (type->as_string() == "Sequence") {
        const json::Value* list = pre.find("pretokenizers");
        if (!list || !list->is_array()) return false;
        for (const json::Value& p : list->as_array()) {
            if (has_o200k_split(p)) return true;
        }
        return false;
    }
    if (type->as_string() != "Split") return false;
    const json::Value* pattern = pre.find("pattern");
    const json::Value* regex = pattern ? pattern->find("Regex") : nullptr;
    return regex && regex->is_string() && regex->as_string() == kO200kPattern;
}

}  // namespace

uint32_t byte_level_char(uint8_t b) { return byte_to_char()[b]; }

std::vector<std::string> parse_hf_tokenizer_json(std::string_view text, std::string_view source) {
    json::Value root;
    try {
        root = json::parse(text);
    } catch (const Error& e) {
        OSPREY_FAIL(source, ": ", e.what());
    }
    return hf_tokenizer_tokens(root, source);
}

std::vector<std::string> hf_tokenizer_tokens(const json::Value& root, std::string_view source) {
    OSPREY_CHECK(root.is_object(), source, ": the top level must be an object");
    const json::Value& model = member(root, "model", source, "the file");
    const json::Value& type = member(model, "type", source, "\"model\"");
    OSPREY_CHECK(type.is_string() && type.as_string() == "BPE", source, ": model type must be \"BPE\", found ",
                 type.dump());
    if (const json::Value* norm = root.find("normalizer")) {
        OSPREY_CHECK(norm->is_null(), source, ": a normalizer is not supported by o200k_harmony (found ",
                     norm->dump().substr(0, 80), ")");
    }
    const json::Value* pre = root.find("pre_tokenizer");
    OSPREY_CHECK(pre && has_o200k_split(*pre), source,
                 ": the pre_tokenizer has no Split with the o200k pattern (only o200k_harmony is supported)");

    // Vocabulary: byte-level strings -> ids 0..N-1.
    const json::Value& vocab = member(model, "vocab", source, "\"model\"");
    OSPREY_CHECK(vocab.is_object(), source, ": model.vocab must be an object");
    std::vector<std::string> tokens;
    std::vector<bool> seen;
    std::string bytes;
    for (const auto& [key, value] : vocab.as_object()) {
        OSPREY_CHECK(value.is_integer() && value.as_int() >= 0 && value.as_int() < kVocabSize, source,
                     ": vocab entry ", json::quote(key), " has id ", value.dump(), ", expected 0..", kVocabSize - 1);
        const int64_t id = value.as_int();
        if (id >= kFirstSpecialId) {
            OSPREY_CHECK(special_name(int32_t(id)) == key, source, ": vocab entry ", json::quote(key), " has id ", id,
                         ", which is the special token ", special_name(int32_t(id)));
            continue;
        }
        OSPREY_CHECK(from_byte_level(key, bytes), source, ": vocab entry ", json::quote(key),
                     " is not a byte-level BPE string");
        if (size_t(id) >= tokens.size()) {
            tokens.resize(size_t(id) + 1);
            seen.resize(size_t(id) + 1, false);
        }
        OSPREY_CHECK(!seen[size_t(id)], source, ": id ", id, " appears twice in model.vocab");
        seen[size_t(id)] = true;
        tokens[size_t(id)] = bytes;
    }
    OSPREY_CHECK(tokens.size() == size_t(kFirstSpecialId), source, ": model.vocab has ids up to ",
                 int64_t(tokens.size()) - 1, ", expected exactly 0..", kFirstSpecialId - 1);
    for (size_t id = 0; id < tokens.size(); ++id) OSPREY_CHECK(seen[id], source, ": id ", id, " missing from model.vocab");

    // Merges: ["a", "b"] pairs (tokenizers ≥ 0.20) or "a b" strings (older files).
    std::unordered_map<std::string, int32_t> rank_of;
    rank_of.reserve(tokens.size());
    for (size_t id = 0; id < tokens.size(); ++id) rank_of.emplace(tokens[id], int32_t(id));
    const json::Value& merges = member(model, "merges", source, "\"model\"");
    OSPREY_CHECK(merges.is_array(), source, ": model.merges must be an array");
    int32_t last_rank = -1;
    std::string left, right;
    size_t index = 0;
    for (const json::Value& m : merges.as_array()) {
        std::string_view a, b;
        std::string joined;
        if (m.is_array() && m.size() == 2 && m.as_array()[0].is_string() && m.as_array()[1].is_string()) {
            a = m.as_array()[0].as_string();
            b = m.as_array()[1].as_string();
        } else if (m.is_string() && m.as_string().find(' ') != std::string::npos) {
            const std::string& s = m.as_string();
            a = std::string_view(s).substr(0, s.find(' '));
            b = std::string_view(s).substr(s.find(' ') + 1);
        } else {
            OSPREY_FAIL(source, ": model.merges[", index, "] is not a pair of strings: ", m.dump().substr(0, 80));
        }
        OSPREY_CHECK(from_byte_level(a, left) && from_byte_level(b, right) && rank_of.count(left) &&
                         rank_of.count(right),
                     source, ": model.merges[", index, "] ", m.dump(), " names a string that is not in the vocab");
        const auto it = rank_of.find(left + right);
        OSPREY_CHECK(it != rank_of.end(), source, ": model.merges[", index, "] ", m.dump(),
                     " yields a string that is not in the vocab");
        OSPREY_CHECK(it->second >= last_rank, source, ": model.merges[", index, "] ", m.dump(), " yields id ",
                     it->second, " after a merge that yields id ", last_rank,
                     "; merges must follow the ranks for the tiktoken algorithm to apply");
        last_rank = it->second;
        ++index;
    }

    // Added tokens must be Harmony specials with their ids.
    if (const json::Value* added = root.find("added_tokens")) {
        OSPREY_CHECK(added->is_array(), source, ": added_tokens must be an array");
        for (const json::Value& t : added->as_array()) {
            const json::Value& id = member(t, "id", source, "an added token");
            const json::Value& content = member(t, "content", source, "an added token");
            OSPREY_CHECK(id.is_integer() && content.is_string(), source, ": added token ", t.dump().substr(0, 80),
                         " needs an integer id and a string content");
            bool known = false;
            for (const SpecialToken& s : harmony_special_tokens()) {
                if (s.name == content.as_string()) known = s.id == id.as_int();
            }
            OSPREY_CHECK(known, source, ": added token ", json::quote(content.as_string()), " with id ", id.as_int(),
                         " is not an o200k_harmony special token with that id");
        }
    }
    return tokens;
}

std::string export_hf_tokenizer_json(const Tokenizer& tokenizer) {
    std::vector<std::string> tokens(kFirstSpecialId);
    for (int32_t id = 0; id < kFirstSpecialId; ++id) tokens[id] = tokenizer.token_bytes(id);
    const Bpe bpe(tokens);

    std::string out = "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [";
    for (int32_t id = kFirstSpecialId; id <= 200018; ++id) {
        out += id == kFirstSpecialId ? "\n" : ",\n";
        out += "    {\n      \"id\": " + std::to_string(id) + ",\n      \"content\": ";
        json::append_quoted(out, special_name(id));
        out += ",\n      \"single_word\": false,\n      \"lstrip\": false,\n      \"rstrip\": false,\n"
               "      \"normalized\": false,\n      \"special\": true\n    }";
    }
    out += "\n  ],\n  \"normalizer\": null,\n";
    out += "  \"pre_tokenizer\": {\n    \"type\": \"Sequence\",\n    \"pretokenizers\": [\n      {\n"
           "        \"type\": \"Split\",\n        \"pattern\": {\n          \"Regex\": ";
    json::append_quoted(out, kO200kPattern);
    out += "\n        },\n        \"behavior\": \"Isolated\",\n        \"invert\": false\n      },\n      {\n"
           "        \"type\": \"ByteLevel\",\n        \"add_prefix_space\": false,\n        \"trim_offsets\": true,\n"
           "        \"use_regex\": false\n      }\n    ]\n  },\n";
    out += "  \"post_processor\": {\n    \"type\": \"ByteLevel\",\n    \"add_prefix_space\": true,\n"
           "    \"trim_offsets\": false,\n    \"use_regex\": true\n  },\n";
    out += "  \"decoder\": {\n    \"type\": \"ByteLevel\",\n    \"add_prefix_space\": true,\n"
           "    \"trim_offsets\": true,\n    \"use_regex\": true\n  },\n";
    out += "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
           "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n    \"fuse_unk\": false,\n"
           "    \"byte_fallback\": false,\n    \"ignore_merges\": true,\n    \"vocab\": {";
    for (int32_t id = 0; id < kFirstSpecialId; ++id) {
        out += id == 0 ? "\n      " : ",\n      ";
        json::append_quoted(out, to_byte_level(tokens[id]));
        out += ": " + std::to_string(id);
    }
    out += "\n    },\n    \"merges\": [";
    // As transformers' gpt-oss converter (GptOssConverter) writes them: for each token in rank order,
    // every cut into two tokens, ordered by the ranks of the left then the right part. Hugging Face's
    // BPE then applies merges in the order of the merged token's rank, which is tiktoken's rule.
    bool first = true;
    std::vector<std::pair<int32_t, int32_t>> cuts;
    for (int32_t id = 0; id < kFirstSpecialId; ++id) {
        const std::string_view t = tokens[id];
        cuts.clear();
        for (size_t k = 1; k < t.size(); ++k) {
            const auto a = bpe.rank_of(t.substr(0, k));
            const auto b = a ? bpe.rank_of(t.substr(k)) : std::nullopt;
            if (a && b) cuts.emplace_back(*a, *b);
        }
        std::sort(cuts.begin(), cuts.end());
        for (const auto& [a, b] : cuts) {
            out += first ? "\n      [\n        " : ",\n      [\n        ";
            first = false;
            json::append_quoted(out, to_byte_level(tokens[a]));
            out += ",\n        ";
            json::append_quoted(out, to_byte_level(tokens[b]));
            out += "\n      ]";
        }
    }
    out += "\n    ]\n  }\n}\n";
    return out;
}

}  // namespace osprey::tok
