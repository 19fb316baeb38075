// JSON Schema -> Harmony's TypeScript-like rendering. Each rule below is one rule of
// shared/spec/harmony.md §5.2, in the order harmony applies them.
#include "harmony/schema_typescript.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "core/check.h"

namespace osprey::harmony {

namespace {

using json::Array;
using json::Value;

// Shortest round-trip decimal digits of d > 0 and the exponent of their first digit: d ~ D[0].D[1..] x 10^exp10.
void shortest_digits(double d, std::string& digits, int& exp10) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    const std::string_view sci(buf, size_t(r.ptr - buf));  // "d.ddde+XX"
    const size_t e = sci.find('e');
    digits.clear();
    for (char c : sci.substr(0, e))
        if (c != '.') digits += c;
    std::from_chars(sci.data() + e + 1 + (sci[e + 1] == '+' ? 1 : 0), sci.data() + sci.size(), exp10);
}

// The double that openai-harmony actually renders for a JSON float. Its Python API writes the float
// with repr() and serde_json (without float_roundtrip) reads it back as significand * or / 10^k in
// f64 arithmetic, which can be one ulp off the exact value (e.g. 215507.77144925506 -> ...503).
// This rebuilds repr()'s digits (fixed notation for 1e-4 <= |d| < 1e16, ".0" appended to whole
// numbers), then repeats serde_json's arithmetic.
double serde_reparse(double d) {
    if (!std::isfinite(d) || d == 0) return d;
    const bool negative = d < 0;
    std::string digits;
    int exp10 = 0;
    shortest_digits(std::fabs(d), digits, exp10);
    const int len = int(digits.size());
    const int decpt = exp10 + 1;  // value = 0.DIGITS x 10^decpt
    uint64_t significand = 0;
    for (char c : digits) significand = significand * 10 + uint64_t(c - '0');
    int exponent = 0;
    if (decpt > -4 && decpt <= 16 && decpt >= len) {  // "1200.0": the ".0" digit joins the significand
        for (int i = len; i < decpt + 1; ++i) significand *= 10;
        exponent = -1;
    } else {  // "12.34", "0.0012" or "1.234e+20"
        exponent = decpt - len;
    }
    static const std::vector<double> pow10 = [] {
        std::vector<double> t(309);
        for (int i = 0; i <= 308; ++i) t[size_t(i)] = std::strtod(("1e" + std::to_string(i)).c_str(), nullptr);
        return t;
    }();
    double f = double(significand);
    for (;;) {
        const int a = exponent < 0 ? -exponent : exponent;
        if (a <= 308) {
            if (exponent >= 0)
                f *= pow10[size_t(a)];
            else
                f /= pow10[size_t(a)];
            break;
        }
        if (f == 0.0 || exponent >= 0) break;  // (serde_json would reject the overflow; repr never makes one)
        f /= 1e308;
        exponent += 308;
    }
    return negative ? -f : f;
}

// Rust's shortest float form (ryu, as used by serde_json): "1.0", "0.001", "1e20", "1.5e-7".
std::string format_float(double d) {
    if (!std::isfinite(d)) return "null";
    std::string out;
    if (std::signbit(d)) {
        out += '-';
        d = -d;
    }
    if (d == 0) return out + "0.0";
    std::string digits;
    int exp10 = 0;
    shortest_digits(d, digits, exp10);
    const int length = int(digits.size());
    const int kk = exp10 + 1;  // the decimal point sits after kk digits
    const int k = kk - length;
    if (k >= 0 && kk <= 16) {
        out += digits;
        out.append(size_t(k), '0');
        out += ".0";
    } else if (kk > 0 && kk <= 16) {
        out += digits.substr(0, size_t(kk));
        out += '.';
        out += digits.substr(size_t(kk));
    } else if (kk > -5 && kk <= 0) {
        out += "0.";
        out.append(size_t(-kk), '0');
        out += digits;
    } else {
        out += digits[0];
        if (length > 1) {
            out += '.';
            out += digits.substr(1);
        }
        out += 'e';
        out += std::to_string(kk - 1);
    }
    return out;
}

void append_serde_json(std::string& out, const Value& v) {
    switch (v.type()) {
        case json::Type::null:
            out += "null";
            break;
        case json::Type::boolean:
            out += v.as_bool() ? "true" : "false";
            break;
        case json::Type::number:
            if (v.is_integer() && !v.is_float())
                out += std::to_string(v.as_int());
            else if (v.is_big_unsigned())
                out += std::to_string(v.as_big_unsigned());  // serde_json's u64
            else
                out += format_float(serde_reparse(v.as_double()));
            break;
        // serde_json escapes strings as core/json does (\" \\ \b \f \n \r \t, other controls as
        // \u00xx, the rest as is); strings here come from the strict parser, so are valid UTF-8.
        case json::Type::string:
            json::append_quoted(out, v.as_string());
            break;
        case json::Type::array: {
            out += '[';
            bool first = true;
            for (const Value& e : v.as_array()) {
                if (!first) out += ',';
                first = false;
                append_serde_json(out, e);
            }
            out += ']';
            break;
        }
        case json::Type::object: {
            out += '{';
            bool first = true;
            for (const auto& [k, e] : v.as_object()) {
                if (!first) out += ',';
                first = false;
                json::append_quoted(out, k);
                out += ':';
                append_serde_json(out, e);
            }
            out += '}';
            break;
        }
    }
}

const std::string* get_string(const Value& v, std::string_view key) {
    const Value* x = v.find(key);
    return x && x->is_string() ? &x->as_string() : nullptr;
}

bool is_enum(const Value& schema) {
    const Value* e = schema.find("enum");
    return e && e->is_array() && e->size() > 0;
}

bool is_nullable(const Value& schema) {
    const Value* n = schema.find("nullable");
    return n && n->is_bool() && n->as_bool();
}

// "default: ..." text: a string default is quoted unless the schema is an enum; anything else is JSON.
std::string default_comment(const Value& schema, const Value& def) {
    if (def.is_string()) {
        if (is_enum(schema)) return "default: " + def.as_string();
        return "default: \"" + def.as_string() + "\"";
    }
    return "default: " + to_serde_json(def);
}

std::string with_nullable(const Value& schema, std::string type_text) {
    if (is_nullable(schema) && type_text.find("null") == std::string::npos) type_text += " | null";
    return type_text;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
        if (i) out += sep;
        out += parts[i];
    }
    return out;
}

// Rule 1: a schema whose value is a oneOf list renders one "\n{indent} | variant" per variant.
std::string render_one_of(const Array& variants, const std::string& indent) {
    std::string out;
    for (const Value& variant : variants) {
        out += "\n" + indent + " | ";
        out += with_nullable(variant, schema_to_typescript(variant, indent + "   "));
        std::vector<std::string> comments;
        if (const std::string* d = get_string(variant, "description")) comments.push_back(*d);
        if (const Value* def = variant.find("default")) {
            // NOTE: unlike property defaults, a string default of an enum variant is printed as JSON
            // (quoted and escaped) here; harmony v0.0.8 does exactly this.
            const bool raw = def->is_string() && !is_enum(variant);
            comments.push_back(raw ? "default: \"" + def->as_string() + "\"" : "default: " + to_serde_json(*def));
        }
        if (!comments.empty()) out += " // " + join(comments, " ");
    }
    return out;
}

// A property whose schema has a oneOf list: description and default above, one variant per line.
void render_one_of_property(std::string& out, const std::string& key, const Value& prop, const Array& variants,
                            bool required, const std::string& indent) {
    const std::string* prop_desc = get_string(prop, "description");
    bool skip_desc = false;
    if (prop_desc && !variants.empty()) {
        const std::string* first = get_string(variants.front(), "description");
        skip_desc = first && *first == *prop_desc;
    }
    const bool desc_above = prop_desc && !skip_desc;
    if (desc_above) out += indent + "// " + *prop_desc + "\n";
    if (const Value* def = prop.find("default")) out += indent + "// " + default_comment(prop, *def) + "\n";
    out += indent + key + (required ? "" : "?") + ":\n";
    for (size_t i = 0; i < variants.size(); ++i) {
        const Value& variant = variants[i];
        out += indent + " | ";
        out += with_nullable(variant, schema_to_typescript(variant, indent + "   "));
        std::vector<std::string> comments;
        if (!(i == 0 && desc_above)) {
            const std::string* d = get_string(variant, "description");
            if (d && !(prop_desc && *d == *prop_desc)) comments.push_back(*d);
        }
        if (const Value* def = variant.find("default")) comments.push_back(default_comment(variant, *def));
        if (!comments.empty()) out += " // " + join(comments, " ");
        out += '\n';
    }
    out += indent + ",\n";
}

// Rule 3: an object type, one line (plus comment lines) per property, in insertion order.
std::string render_object(const Value& schema, const std::string& indent) {
    std::string out;
    if (const std::string* d = get_string(schema, "description")) out += indent + "// " + *d + "\n";
    out += "{\n";
    const Value* props = schema.find("properties");
    if (props && props->is_object()) {
        std::vector<std::string> required;
        if (const Value* req = schema.find("required"); req && req->is_array())
            for (const Value& r : req->as_array())
                if (r.is_string()) required.push_back(r.as_string());
        for (const auto& [key, prop] : props->as_object()) {
            const bool is_required = std::find(required.begin(), required.end(), key) != required.end();
            if (const std::string* title = get_string(prop, "title"))
                out += indent + "// " + *title + "\n" + indent + "//\n";
            const Value* one_of = prop.find("oneOf");
            if (!one_of) {
                if (const std::string* d = get_string(prop, "description")) out += indent + "// " + *d + "\n";
            }
            if (const Value* ex = prop.find("examples"); ex && ex->is_array() && ex->size() > 0) {
                out += indent + "// Examples:\n";
                for (const Value& e : ex->as_array())
                    if (e.is_string()) out += indent + "// - \"" + e.as_string() + "\"\n";
            }
            if (one_of && one_of->is_array()) {
                render_one_of_property(out, key, prop, one_of->as_array(), is_required, indent);
                continue;
            }
            out += indent + key + (is_required ? "" : "?") + ": ";
            out += with_nullable(prop, schema_to_typescript(prop, indent + "    "));
            out += ',';
            if (!one_of) {
                if (const Value* def = prop.find("default")) out += " // " + default_comment(prop, *def);
            }
            out += '\n';
        }
    }
    out += indent + "}";
    return out;
}

}  // namespace

std::string to_serde_json(const Value& value) {
    std::string out;
    append_serde_json(out, value);
    return out;
}

std::string schema_to_typescript(const Value& schema, const std::string& indent) {
    if (const Value* one_of = schema.find("oneOf"); one_of && one_of->is_array())
        return render_one_of(one_of->as_array(), indent);
    const Value* type = schema.find("type");
    if (type && type->is_array()) {  // Rule 2: a union of type names
        std::vector<std::string> names;
        for (const Value& t : type->as_array())
            if (t.is_string()) names.push_back(t.as_string() == "integer" ? "number" : t.as_string());
        if (!names.empty()) return join(names, " | ");
    }
    if (!type || !type->is_string()) return "any";
    const std::string& t = type->as_string();
    if (t == "object") return render_object(schema, indent);
    if (t == "string") {  // Rule 4
        std::vector<std::string> members;
        if (const Value* e = schema.find("enum"); e && e->is_array())
            for (const Value& m : e->as_array())
                if (m.is_string()) members.push_back("\"" + m.as_string() + "\"");
        return members.empty() ? "string" : join(members, " | ");
    }
    if (t == "number" || t == "integer") return "number";  // Rule 5
    if (t == "boolean") return "boolean";
    if (t == "array") {  // Rule 6
        const Value* items = schema.find("items");
        return items ? schema_to_typescript(*items, indent) + "[]" : "Array<any>";
    }
    return "any";  // Rule 7
}

namespace {

bool known_type(const std::string& t) {
    return t == "object" || t == "string" || t == "number" || t == "integer" || t == "boolean" || t == "array" ||
           t == "null";
}

void expect_kind(const Value& v, json::Type want, const std::string& path) {
    OSPREY_CHECK(v.type() == want, path, ": expected a JSON ", json::type_name(want), ", got ",
                 json::type_name(v.type()));
}

}  // namespace

void validate_schema(const Value& schema, const std::string& path) {
    expect_kind(schema, json::Type::object, path);
    if (const Value* t = schema.find("type")) {
        if (t->is_string()) {
            OSPREY_CHECK(known_type(t->as_string()), path, ".type: unknown JSON-Schema type '", t->as_string(),
                         "' (expected object, string, number, integer, boolean, array or null)");
        } else {
            OSPREY_CHECK(t->is_array(), path, ".type: expected a string or an array of strings, got ",
                         json::type_name(t->type()));
            for (size_t i = 0; i < t->size(); ++i) {
                const Value& e = t->as_array()[i];
                const std::string p = path + ".type[" + std::to_string(i) + "]";
                expect_kind(e, json::Type::string, p);
                OSPREY_CHECK(known_type(e.as_string()), p, ": unknown JSON-Schema type '", e.as_string(), "'");
            }
        }
    }
    for (const char* key : {"description", "title"})
        if (const Value* v = schema.find(key)) expect_kind(*v, json::Type::string, path + "." + key);
    if (const Value* v = schema.find("nullable")) expect_kind(*v, json::Type::boolean, path + ".nullable");
    for (const char* key : {"enum", "examples", "required", "oneOf"})
        if (const Value* v = schema.find(key)) expect_kind(*v, json::Type::array, path + "." + key);
    if (const Value* req = schema.find("required"))
        for (size_t i = 0; i < req->size(); ++i)
            expect_kind(req->as_array()[i], json::Type::string, path + ".required[" + std::to_string(i) + "]");
    if (const Value* props = schema.find("properties")) {
        expect_kind(*props, json::Type::object, path + ".properties");
        for (const auto& [key, prop] : props->as_object()) validate_schema(prop, path + ".properties." + key);
    }
    if (const Value* items = schema.find("items")) validate_schema(*items, path + ".items");
    if (const Value* one_of = schema.find("oneOf"))
        for (size_t i = 0; i < one_of->size(); ++i)
            validate_schema(one_of->as_array()[i], path + ".oneOf[" + std::to_string(i) + "]");
}

}  // namespace osprey::harmony
