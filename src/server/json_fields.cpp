// Validated access to JSON request members (see json_fields.h).
#include "server/json_fields.h"

#include <algorithm>
#include <cmath>

#include "server/api_error.h"

namespace osprey::server {

void wrong_type(const std::string& path, std::string_view expected, const json::Value& value) {
    bad_param(path, str("expected ", expected, ", got ", json::type_name(value.type())), "invalid_type");
}

std::vector<int32_t> token_id_array(const json::Value& value, const std::string& path, int vocab_size) {
    std::vector<int32_t> ids;
    ids.reserve(value.size());
    for (size_t i = 0; i < value.size(); ++i) {
        const json::Value& t = value.as_array()[i];
        if (!t.is_integer()) wrong_type(str(path, "[", i, "]"), "a token id (integer)", t);
        const int64_t id = t.as_int();
        if (id < 0 || id >= vocab_size)
            bad_param(str(path, "[", i, "]"), str("token id ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
        ids.push_back(int32_t(id));
    }
    return ids;
}

Fields::Fields(const json::Value& value, std::string path) : value_(value), path_(std::move(path)) {
    if (!value.is_object()) wrong_type(path_.empty() ? "body" : path_, "an object", value);
}

std::string Fields::path(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

const json::Value* Fields::get(std::string_view key) {
    if (std::find(used_.begin(), used_.end(), key) == used_.end()) used_.emplace_back(key);
    const json::Value* v = value_.find(key);
    return v && !v->is_null() ? v : nullptr;
}

void Fields::ignore(std::initializer_list<std::string_view> keys) {
    for (std::string_view k : keys) get(k);
}

std::optional<std::string> Fields::string(std::string_view key) {
    const json::Value* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong_type(path(key), "a string", *v);
    return v->as_string();
}

std::optional<bool> Fields::boolean(std::string_view key) {
    const json::Value* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_bool()) wrong_type(path(key), "a boolean", *v);
    return v->as_bool();
}

std::optional<double> Fields::number(std::string_view key, double lo, double hi) {
    const json::Value* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) wrong_type(path(key), "a number", *v);
    const double d = v->as_double();
    if (!std::isfinite(d) || d < lo || d > hi)
        bad_param(path(key), str("must be in [", json::format_number(lo), ", ", json::format_number(hi), "], got ",
                                 json::format_number(d)));
    return d;
}

std::optional<int64_t> Fields::integer(std::string_view key, int64_t lo, int64_t hi) {
    const json::Value* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_integer()) wrong_type(path(key), "an integer", *v);
    const int64_t i = v->as_int();
    if (i < lo || i > hi) bad_param(path(key), str("must be in [", lo, ", ", hi, "], got ", i));
    return i;
}

const json::Value* Fields::object(std::string_view key) {
    const json::Value* v = get(key);
    if (v && !v->is_object()) wrong_type(path(key), "an object", *v);
    return v;
}

const json::Value* Fields::array(std::string_view key) {
    const json::Value* v = get(key);
    if (v && !v->is_array()) wrong_type(path(key), "an array", *v);
    return v;
}

void Fields::finish() const {
    for (const auto& [k, v] : value_.as_object()) {
        if (std::find(used_.begin(), used_.end(), k) == used_.end())
            throw ApiError(400, str("unknown parameter '", path(k), "'"), path(k), "unknown_parameter");
    }
}

}  // namespace osprey::server
