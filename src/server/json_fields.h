// Typed, validated access to the members of a JSON request object. Every getter names the field's
// full path in its error ("messages[2].content: expected a string, got number"); explicit nulls count
// as absent (as in OpenAI's API); finish() rejects members nobody asked for, naming them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"

namespace osprey::server {

class Fields {
public:
    // Throws ApiError naming `path` when `value` is not an object.
    Fields(const json::Value& value, std::string path);

    // The member (marked as used), or nullptr when absent or null.
    const json::Value* get(std::string_view key);
    // Marks members as known-and-ignored (accepted for compatibility, no effect).
    void ignore(std::initializer_list<std::string_view> keys);

    std::optional<std::string> string(std::string_view key);
    std::optional<bool> boolean(std::string_view key);
    std::optional<double> number(std::string_view key, double lo, double hi);
    std::optional<int64_t> integer(std::string_view key, int64_t lo, int64_t hi);
    const json::Value* object(std::string_view key);
    const json::Value* array(std::string_view key);

    std::string path(std::string_view key) const;  // "parent.key" (or "key" at the top)
    const std::string& path() const { return path_; }

    // Throws ApiError(400, code unknown_parameter) for the first member not used or ignored.
    void finish() const;

private:
    const json::Value& value_;
    std::string path_;
    std::vector<std::string> used_;
};

// "expected a string, got number" style message for `value` at `path`.
[[noreturn]] void wrong_type(const std::string& path, std::string_view expected, const json::Value& value);

// `value` (an array) as token ids, each an integer in [0, vocab_size); ApiError naming the element
// ("prompt[3]") otherwise. May be empty: the caller says whether that is allowed.
std::vector<int32_t> token_id_array(const json::Value& value, const std::string& path, int vocab_size);

}  // namespace osprey::server
