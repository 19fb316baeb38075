// Hugging Face tokenizer.json for o200k_harmony: reading the byte-level BPE a gpt-oss checkpoint
// ships, and writing one from the rank file the way transformers' gpt-oss converter does (vocab
// from the ranks, every two-token cut of each token as a merge in rank order, the o200k Split regex
// + ByteLevel, added_tokens 199998..200018). Test: tests/tokenizer/test_hf_json.cpp, and
// tools/tokenizer/check_hf_export.py (Hugging Face's tokenizers library on the export).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"
#include "tokenizer/tokenizer.h"

namespace osprey::tok {

// tokens[id] for the BPE ids of a tokenizer.json. Checks that it is o200k_harmony's: a BPE model
// without normalizer, the o200k pre-tokenizer pattern, ids 0..N-1 each once, merges whose parts and
// results are in the vocabulary and ordered by the result's id (so that merge order = rank order and
// the tiktoken algorithm applies), and added tokens that agree with the Harmony special ids.
// Throws osprey::Error naming `source` and the problem.
std::vector<std::string> parse_hf_tokenizer_json(std::string_view text, std::string_view source);
// The same checks on an already parsed document.
std::vector<std::string> hf_tokenizer_tokens(const json::Value& root, std::string_view source);

// The tokenizer.json text for `tokenizer` (2-space indented JSON, UTF-8).
std::string export_hf_tokenizer_json(const Tokenizer& tokenizer);

// GPT-2's byte-level alphabet: byte b is written as the code point byte_level_char(b).
uint32_t byte_level_char(uint8_t b);

}  // namespace osprey::tok
