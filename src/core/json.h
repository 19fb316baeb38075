// A small JSON value type with a strict parser (RFC 8259, UTF-8 validated, depth-limited) and a
// serializer. Objects keep insertion order, which Harmony's tool rendering and stable output need.
// Every parse error names the line, column and problem; nothing here crashes on untrusted input.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace osprey::json {

class Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion order kept

enum class Type { null, boolean, number, string, array, object };
const char* type_name(Type t);

class Value {
public:
    Value() = default;  // null
    Value(std::nullptr_t) {}
    Value(bool b) : v_(b) {}
    Value(int i) : v_(Number{double(i), int64_t(i), true, false}) {}
    Value(int64_t i) : v_(Number{double(i), i, true, false}) {}
    Value(uint64_t i)
        : v_(Number{double(i), i <= uint64_t(INT64_MAX) ? int64_t(i) : 0, i <= uint64_t(INT64_MAX), false,
                    i > uint64_t(INT64_MAX), i}) {}
    Value(double d);
    Value(const char* s) : v_(std::string(s)) {}
    Value(std::string s) : v_(std::move(s)) {}
    Value(std::string_view s) : v_(std::string(s)) {}
    Value(Array a) : v_(std::make_shared<Array>(std::move(a))) {}
    Value(Object o) : v_(std::make_shared<Object>(std::move(o))) {}

    Type type() const { return Type(v_.index()); }
    bool is_null() const { return type() == Type::null; }
    bool is_bool() const { return type() == Type::boolean; }
    bool is_number() const { return type() == Type::number; }
    bool is_integer() const;  // a number with an exact int64 value
    // A number that was written with a fraction or exponent (or built from a double), even when its
    // value is integral: "1.0" -> true, "1" -> false. Renderers that must reproduce serde_json's
    // float formatting ("1.0") need this.
    bool is_float() const;
    // An integer in (INT64_MAX, UINT64_MAX]: kept exactly (serde_json's u64), written without a
    // fraction; as_double() rounds it.
    bool is_big_unsigned() const;
    uint64_t as_big_unsigned() const;
    bool is_string() const { return type() == Type::string; }
    bool is_array() const { return type() == Type::array; }
    bool is_object() const { return type() == Type::object; }

    // Typed access; each throws osprey::Error naming the actual type when it does not match.
    bool as_bool() const;
    double as_double() const;
    int64_t as_int() const;  // only for numbers with an exact integer value
    const std::string& as_string() const;
    const Array& as_array() const;
    Array& as_array();
    const Object& as_object() const;
    Object& as_object();

    // Object access. find() returns nullptr when absent (or when this is not an object).
    const Value* find(std::string_view key) const;
    bool contains(std::string_view key) const { return find(key) != nullptr; }
    const Value& at(std::string_view key) const;  // throws naming the missing key
    // Inserts or replaces; turns a null into an empty object first.
    Value& set(std::string_view key, Value v);
    // Appends to an array; turns a null into an empty array first.
    Value& push_back(Value v);
    size_t size() const;  // elements of an array or members of an object, else 0

    // Serialises compactly (no spaces), or with `indent` spaces per level when indent > 0.
    std::string dump(int indent = 0) const;

    bool operator==(const Value& o) const;

private:
    struct Number {
        double d = 0;
        int64_t i = 0;
        bool is_int = false;
        bool is_float = false;  // built from a double (a literal with '.', 'e' or outside [INT64_MIN, UINT64_MAX])
        bool is_big_unsigned = false;  // an integer in (INT64_MAX, UINT64_MAX], exact in `u`
        uint64_t u = 0;
    };
    // Index order must match Type.
    std::variant<std::monostate, bool, Number, std::string, std::shared_ptr<Array>, std::shared_ptr<Object>> v_;

    void dump_to(std::string& out, int indent, int depth) const;
    friend class Parser;
};

struct ParseOptions {
    int max_depth = 128;          // nesting limit: deeper documents are rejected, not recursed into
    bool allow_trailing = false;  // accept text after the value (for streaming use)
};

// Parses a complete JSON document. Throws osprey::Error("invalid JSON at line L, column C: ...").
Value parse(std::string_view text, const ParseOptions& options = {});

// Appends `s` as a JSON string literal (quotes included) to `out`. Invalid UTF-8 in `s` is replaced
// by U+FFFD so the output is always valid JSON. Non-ASCII is written as UTF-8 unless ensure_ascii.
void append_quoted(std::string& out, std::string_view s, bool ensure_ascii = false);
std::string quote(std::string_view s, bool ensure_ascii = false);

// Formats a double the shortest way that reads back identically (no exponent for integers < 2^53).
std::string format_number(double d);

}  // namespace osprey::json
