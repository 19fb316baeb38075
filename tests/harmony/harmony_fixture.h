// Shared helpers of the Harmony tests: the o200k_harmony tokenizer from shared/data (loaded once),
// conformance files, and JSON test data under tests/harmony/data.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/json.h"
#include "harmony/message.h"
#include "tokenizer/tokenizer.h"

namespace osprey::harmony::test {

inline const tok::Tokenizer& o200k() {
    static const tok::Tokenizer t =
        tok::Tokenizer::from_tiktoken_file(std::filesystem::path(OSPREY_SHARED_DIR) / "data" / "o200k_base.tiktoken");
    return t;
}

inline std::string read_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open " + path.string());
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// A conformance file as the upstream tests read it: trailing whitespace removed.
inline std::string read_conformance(const std::string& name) {
    std::string s = read_file(std::filesystem::path(OSPREY_SHARED_DIR) / "conformance" / "harmony" / name);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r' || s.back() == '\t')) s.pop_back();
    return s;
}

inline json::Value read_test_json(const std::string& name) {
    return json::parse(read_file(std::filesystem::path(OSPREY_SOURCE_DIR) / "tests" / "harmony" / "data" / name));
}

inline json::Value derived_token_ids() {
    static const json::Value v = json::parse(read_file(std::filesystem::path(OSPREY_SHARED_DIR) / "conformance" /
                                                       "derived" / "harmony_test_data_token_ids.json"));
    return v;
}

// A compact description of a message for comparisons: role[:name] [to=r] [#channel] [type] |content
inline std::string describe(const Message& m) {
    std::string s = role_name(m.author.role);
    if (m.author.name) s += ":" + *m.author.name;
    if (m.recipient) s += " to=" + *m.recipient;
    if (m.channel) s += " #" + *m.channel;
    if (m.content_type) s += " " + *m.content_type;
    return s + " |" + m.text();
}

inline std::vector<std::string> describe(const std::vector<Message>& ms) {
    std::vector<std::string> out;
    for (const Message& m : ms) out.push_back(describe(m));
    return out;
}

}  // namespace osprey::harmony::test
