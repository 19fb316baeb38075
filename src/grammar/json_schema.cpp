// JSON Schema compiler (see json_schema.h).
#include "grammar/json_schema.h"

#include <functional>
#include <map>
#include <set>
#include <string>

#include "core/check.h"
#include "grammar/parse.h"

namespace osprey::grammar {

namespace {

// Keywords that only describe (never constrain) and are accepted anywhere.
const std::set<std::string> kAnnotations = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "$defs", "definitions", "strict", "name", "format_hint", "x-order"};

ByteSet one(char c) {
    ByteSet s;
    s.add(uint8_t(c));
    return s;
}

// Removes from every terminal of `e` the bytes that cannot appear raw inside a JSON string (the
// quote, the backslash and control characters), so a pattern's language stays inside the string.
ExprPtr json_string_safe(const ExprPtr& e, std::map<const Expr*, ExprPtr>& memo) {
    if (auto it = memo.find(e.get()); it != memo.end()) return it->second;
    ExprPtr out;
    if (e->kind == Expr::Kind::bytes) {
        ByteSet s = e->set;
        for (int b = 0; b < 0x20; ++b) s.w[0] &= ~(uint64_t(1) << b);
        s.w[0] &= ~(uint64_t(1) << '"');
        s.w[1] &= ~(uint64_t(1) << ('\\' - 64));
        out = bytes(s);
    } else if (e->kind == Expr::Kind::ref) {
        out = e;
    } else {
        Expr copy = *e;
        for (ExprPtr& i : copy.items) i = json_string_safe(i, memo);
        out = std::make_shared<const Expr>(std::move(copy));
    }
    memo[e.get()] = out;
    return out;
}

class SchemaCompiler {
public:
    explicit SchemaCompiler(const json::Value& root) : root_(root) {}

    Grammar run() {
        const int r = b_.declare("root");
        b_.define(r, compile(root_, "#"));
        return b_.build(r);
    }

    Grammar any_object() {
        const int r = b_.declare("root");
        b_.define(r, ref(object_any()));
        return b_.build(r);
    }

private:
    template <typename... A>
    [[noreturn]] static void fail(const A&... a) {
        OSPREY_FAIL(a...);
    }

    // ---- shared pieces ----
    // Separators: "," and ":" each followed by at most one space, so both compact JSON and Python's
    // json.dumps default (", ", ": ") are accepted while a model cannot pad without end.
    ExprPtr comma() {
        if (!comma_) comma_ = seq({literal(","), opt(literal(" "))});
        return comma_;
    }
    ExprPtr colon() {
        if (!colon_) colon_ = seq({literal(":"), opt(literal(" "))});
        return colon_;
    }
    ExprPtr string_char() {
        if (!string_char_) {
            ByteSet esc;
            for (char c : std::string("\"\\/bfnrt")) esc.add(uint8_t(c));
            ByteSet hex;
            hex.add_range('0', '9');
            hex.add_range('a', 'f');
            hex.add_range('A', 'F');
            ExprPtr h = bytes(hex);
            string_char_ = alt({codepoints({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, true),
                                seq({bytes(one('\\')), alt({bytes(esc), seq({bytes(one('u')), h, h, h, h})})})});
        }
        return string_char_;
    }
    int string_any() {
        if (string_rule_ < 0)
            string_rule_ = b_.add("string", seq({bytes(one('"')), star(string_char()), bytes(one('"'))}));
        return string_rule_;
    }
    ExprPtr digits() {
        ByteSet d;
        d.add_range('0', '9');
        return bytes(d);
    }
    int integer_rule() {
        if (integer_rule_ < 0) {
            ByteSet nz;
            nz.add_range('1', '9');
            integer_rule_ = b_.add("integer", seq({opt(literal("-")),
                                                   alt({literal("0"), seq({bytes(nz), star(digits())})})}));
        }
        return integer_rule_;
    }
    int number_rule() {
        if (number_rule_ < 0) {
            ByteSet e, sign;
            e.add('e');
            e.add('E');
            sign.add('+');
            sign.add('-');
            number_rule_ = b_.add("number", seq({ref(integer_rule()), opt(seq({literal("."), plus(digits())})),
                                                 opt(seq({bytes(e), opt(bytes(sign)), plus(digits())}))}));
        }
        return number_rule_;
    }
    int value_any() {
        if (value_rule_ < 0) {
            value_rule_ = b_.declare("value");
            object_rule_ = b_.declare("object");
            const int array = b_.declare("array");
            b_.define(value_rule_, alt({ref(object_rule_), ref(array), ref(string_any()), ref(number_rule()),
                                        literal("true"), literal("false"), literal("null")}));
            ExprPtr member = seq({ref(string_any()), colon(), ref(value_rule_)});
            b_.define(object_rule_,
                      seq({literal("{"), opt(seq({member, star(seq({comma(), member}))})), literal("}")}));
            b_.define(array, seq({literal("["), opt(seq({ref(value_rule_), star(seq({comma(), ref(value_rule_)}))})),
                                  literal("]")}));
        }
        return value_rule_;
    }
    int object_any() {
        value_any();
        return object_rule_;
    }

    // ---- schemas ----
    ExprPtr compile(const json::Value& s, const std::string& path) {
        if (s.is_bool()) {
            if (s.as_bool()) return ref(value_any());
            fail("schema at ", path, " is false: nothing can match it");
        }
        if (!s.is_object()) fail("schema at ", path, " must be an object or a boolean");
        if (++depth_ > 64) fail("schema at ", path, " nests too deeply");
        ExprPtr e = compile_object(s, path);
        --depth_;
        return e;
    }

    ExprPtr compile_object(const json::Value& s, const std::string& path) {
        if (const json::Value* r = s.find("$ref")) {
            only(s, path, {"$ref"});
            if (!r->is_string()) fail("'$ref' at ", path, " must be a string");
            return ref(ref_rule(r->as_string(), path));
        }
        for (const char* k : {"anyOf", "oneOf"})
            if (const json::Value* list = s.find(k)) {
                only(s, path, {k, "type"});
                if (!list->is_array() || list->size() == 0) fail("'", k, "' at ", path, " must be a non-empty array");
                std::vector<ExprPtr> alts;
                for (size_t i = 0; i < list->size(); ++i)
                    alts.push_back(compile(list->as_array()[i], path + "/" + k + "/" + std::to_string(i)));
                return alt(std::move(alts));
            }
        if (const json::Value* list = s.find("allOf")) {
            only(s, path, {"allOf"});
            if (!list->is_array() || list->size() != 1)
                fail("'allOf' at ", path, " is supported with exactly one schema");
            return compile(list->as_array()[0], path + "/allOf/0");
        }
        if (const json::Value* c = s.find("const")) {
            only(s, path, {"const", "type"});
            return literal(c->dump());
        }
        if (const json::Value* e = s.find("enum")) {
            only(s, path, {"enum", "type"});
            if (!e->is_array() || e->size() == 0) fail("'enum' at ", path, " must be a non-empty array");
            std::vector<ExprPtr> alts;
            for (const json::Value& v : e->as_array()) alts.push_back(literal(v.dump()));
            return alt(std::move(alts));
        }
        const json::Value* type = s.find("type");
        if (!type) {
            if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required"))
                return compile_typed(s, "object", path);
            if (s.contains("items") || s.contains("prefixItems")) return compile_typed(s, "array", path);
            if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength"))
                return compile_typed(s, "string", path);
            only(s, path, {});
            return ref(value_any());
        }
        if (type->is_string()) return compile_typed(s, type->as_string(), path);
        if (type->is_array() && type->size() > 0) {
            std::vector<ExprPtr> alts;
            for (const json::Value& t : type->as_array()) {
                if (!t.is_string()) fail("'type' at ", path, " must hold strings");
                alts.push_back(compile_typed(s, t.as_string(), path));
            }
            return alt(std::move(alts));
        }
        fail("'type' at ", path, " must be a string or a non-empty array of strings");
    }

    // Refuses keywords outside `allowed` and the annotations.
    void only(const json::Value& s, const std::string& path, std::initializer_list<std::string_view> allowed) {
        for (const auto& [k, v] : s.as_object()) {
            if (kAnnotations.count(k)) continue;
            bool ok = false;
            for (std::string_view a : allowed) ok = ok || a == k;
            if (!ok) fail("unsupported JSON Schema keyword '", k, "' at ", path);
        }
    }

    ExprPtr compile_typed(const json::Value& s, const std::string& type, const std::string& path) {
        if (type == "object") {
            only(s, path, {"type", "properties", "required", "additionalProperties"});
            return object(s, path);
        }
        if (type == "array") {
            only(s, path, {"type", "items", "prefixItems", "minItems", "maxItems"});
            return array(s, path);
        }
        if (type == "string") {
            only(s, path, {"type", "pattern", "format", "minLength", "maxLength"});
            return string(s, path);
        }
        if (type == "number") {
            only(s, path, {"type"});
            return ref(number_rule());
        }
        if (type == "integer") {
            only(s, path, {"type"});
            return ref(integer_rule());
        }
        if (type == "boolean") {
            only(s, path, {"type"});
            return alt({literal("true"), literal("false")});
        }
        if (type == "null") {
            only(s, path, {"type"});
            return literal("null");
        }
        fail("unknown type '", type, "' at ", path);
    }

    int count(const json::Value& s, const char* key, const std::string& path, int fallback) {
        const json::Value* v = s.find(key);
        if (!v) return fallback;
        if (!v->is_integer() || v->as_int() < 0 || v->as_int() > 4096)
            fail("'", key, "' at ", path, " must be an integer in [0, 4096]");
        return int(v->as_int());
    }

    ExprPtr object(const json::Value& s, const std::string& path) {
        struct Prop {
            std::string name;
            ExprPtr value;
            bool required = false;
        };
        std::vector<Prop> props;
        if (const json::Value* p = s.find("properties")) {
            if (!p->is_object()) fail("'properties' at ", path, " must be an object");
            for (const auto& [k, v] : p->as_object())
                props.push_back({k, compile(v, path + "/properties/" + k), false});
        }
        if (const json::Value* r = s.find("required")) {
            if (!r->is_array()) fail("'required' at ", path, " must be an array");
            for (const json::Value& n : r->as_array()) {
                if (!n.is_string()) fail("'required' at ", path, " must hold strings");
                bool found = false;
                for (Prop& p : props)
                    if (p.name == n.as_string()) p.required = found = true;
                if (!found) fail("required property '", n.as_string(), "' at ", path, " is not in 'properties'");
            }
        }
        // Extra members: additionalProperties true or a schema. Absent means false when properties
        // are listed (structured outputs' strict mode) and any members otherwise.
        ExprPtr extra;
        const json::Value* ap = s.find("additionalProperties");
        if (ap && !(ap->is_bool() && !ap->as_bool())) {
            extra = seq({ref(string_any()), colon(),
                         ap->is_bool() ? ref(value_any()) : compile(*ap, path + "/additionalProperties")});
        } else if (!ap && props.empty()) {
            return ref(object_any());
        }
        // tail(k, first): members from property k on; `first`: no member written yet (no comma).
        std::map<std::pair<size_t, bool>, ExprPtr> memo;
        std::function<ExprPtr(size_t, bool)> tail = [&](size_t k, bool first) -> ExprPtr {
            if (auto it = memo.find({k, first}); it != memo.end()) return it->second;
            ExprPtr out;
            if (k == props.size()) {
                if (!extra) {
                    out = empty();
                } else if (first) {
                    out = opt(seq({extra, star(seq({comma(), extra}))}));
                } else {
                    out = star(seq({comma(), extra}));
                }
            } else {
                const Prop& p = props[k];
                std::string key;
                json::append_quoted(key, p.name);
                ExprPtr member = seq({first ? empty() : comma(), literal(key), colon(), p.value, tail(k + 1, false)});
                out = p.required ? member : alt({member, tail(k + 1, first)});
            }
            const int r = b_.add("obj", out);  // a rule per tail keeps the grammar linear in size
            memo[{k, first}] = ref(r);
            return memo[{k, first}];
        };
        return seq({literal("{"), tail(0, true), literal("}")});
    }

    ExprPtr array(const json::Value& s, const std::string& path) {
        std::vector<ExprPtr> prefix;
        if (const json::Value* p = s.find("prefixItems")) {
            if (!p->is_array()) fail("'prefixItems' at ", path, " must be an array");
            for (size_t i = 0; i < p->size(); ++i)
                prefix.push_back(compile(p->as_array()[i], path + "/prefixItems/" + std::to_string(i)));
        }
        ExprPtr item;
        const json::Value* items = s.find("items");
        if (!items) {
            if (prefix.empty()) item = ref(value_any());
        } else if (!(items->is_bool() && !items->as_bool())) {
            item = compile(*items, path + "/items");
        }
        const int min_items = count(s, "minItems", path, 0);
        const int max_items = count(s, "maxItems", path, -1);
        if (max_items >= 0 && max_items < min_items) fail("maxItems < minItems at ", path);
        const int k = int(prefix.size());
        if (k > 0 && max_items >= 0 && max_items < k) fail("maxItems at ", path, " is smaller than prefixItems");
        std::vector<ExprPtr> parts{literal("[")};
        for (int i = 0; i < k; ++i) {
            if (i > 0) parts.push_back(comma());
            parts.push_back(prefix[size_t(i)]);
        }
        if (item) {
            const int lo = std::max(0, min_items - k);
            const int hi = max_items < 0 ? -1 : max_items - k;
            const int r = b_.add("item", item);
            ExprPtr comma_item = seq({comma(), ref(r)});
            if (k > 0) {
                parts.push_back(repeat(comma_item, lo, hi));
            } else if (hi != 0) {
                ExprPtr some = seq({ref(r), repeat(comma_item, std::max(0, lo - 1), hi < 0 ? -1 : hi - 1)});
                parts.push_back(lo == 0 ? opt(some) : some);
            }
        } else if (min_items > k) {
            fail("minItems at ", path, " needs more items than prefixItems allows");
        }
        parts.push_back(literal("]"));
        return seq(std::move(parts));
    }

    ExprPtr string(const json::Value& s, const std::string& path) {
        const json::Value* pattern = s.find("pattern");
        const json::Value* format = s.find("format");
        const bool lengths = s.contains("minLength") || s.contains("maxLength");
        if (int(pattern != nullptr) + int(format != nullptr) + int(lengths) > 1)
            fail("'pattern', 'format' and 'minLength'/'maxLength' cannot be combined at ", path);
        ExprPtr body;
        if (pattern) {
            if (!pattern->is_string()) fail("'pattern' at ", path, " must be a string");
            try {
                std::map<const Expr*, ExprPtr> memo;
                body = json_string_safe(parse_regex(pattern->as_string()), memo);
            } catch (const Error& e) {
                fail("'pattern' at ", path, ": ", e.what());
            }
        } else if (format) {
            if (!format->is_string()) fail("'format' at ", path, " must be a string");
            body = format_regex(format->as_string(), path);
        } else if (lengths) {
            const int lo = count(s, "minLength", path, 0);
            const int hi = count(s, "maxLength", path, -1);
            if (hi >= 0 && hi < lo) fail("maxLength < minLength at ", path);
            body = repeat(string_char(), lo, hi);
        } else {
            return ref(string_any());
        }
        return seq({literal("\""), body, literal("\"")});
    }

    ExprPtr format_regex(const std::string& f, const std::string& path) {
        static const std::string date = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
        static const std::string time =
            "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
        static const std::string octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
        static const std::map<std::string, std::string> formats = {
            {"date", date},
            {"time", time},
            {"date-time", date + "T" + time},
            {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
            {"email", "[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\\.[A-Za-z0-9-]{1,63}){1,8}"},
            {"ipv4", octet + "\\." + octet + "\\." + octet + "\\." + octet},
            {"hostname", "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?){0,8}"},
        };
        auto it = formats.find(f);
        if (it == formats.end())
            fail("unsupported string format '", f, "' at ", path,
                 " (supported: date, time, date-time, uuid, email, ipv4, hostname)");
        return parse_regex(it->second);
    }

    // A rule per distinct reference, so recursive schemas become recursive rules.
    int ref_rule(const std::string& r, const std::string& path) {
        if (auto it = refs_.find(r); it != refs_.end()) return it->second;
        if (r.empty() || r[0] != '#') fail("'$ref' at ", path, " must point into this schema (\"#...\"), got '", r, "'");
        const json::Value* target = &root_;
        size_t i = 1;
        while (i < r.size()) {
            if (r[i] != '/') fail("'$ref' '", r, "' at ", path, " is not a JSON pointer");
            size_t j = r.find('/', i + 1);
            if (j == std::string::npos) j = r.size();
            std::string key = r.substr(i + 1, j - i - 1);
            std::string unescaped;  // JSON pointer: ~1 is '/', ~0 is '~'
            for (size_t p = 0; p < key.size(); ++p) {
                if (key[p] == '~' && p + 1 < key.size() && (key[p + 1] == '0' || key[p + 1] == '1')) {
                    unescaped.push_back(key[p + 1] == '1' ? '/' : '~');
                    ++p;
                } else {
                    unescaped.push_back(key[p]);
                }
            }
            key = std::move(unescaped);
            target = target->is_object() ? target->find(key) : nullptr;
            if (!target) fail("'$ref' '", r, "' at ", path, " points to nothing");
            i = j;
        }
        const int rule = b_.declare("ref");
        refs_[r] = rule;
        b_.define(rule, compile(*target, r));
        return rule;
    }

    const json::Value& root_;
    GrammarBuilder b_;
    std::map<std::string, int> refs_;
    ExprPtr string_char_, comma_, colon_;
    int string_rule_ = -1, integer_rule_ = -1, number_rule_ = -1, value_rule_ = -1, object_rule_ = -1;
    int depth_ = 0;
};

}  // namespace

Grammar json_schema_grammar(const json::Value& schema) {
    return SchemaCompiler(schema).run();
}

Grammar json_object_grammar() {
    static const json::Value none;
    return SchemaCompiler(none).any_object();
}

}  // namespace osprey::grammar
