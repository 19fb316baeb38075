// Structured-output request members (see format_fields.h).
#include "server/format_fields.h"

#include "server/api_error.h"

namespace osprey::server {

using frontend::OutputFormat;

namespace {

// A JSON schema given as an object, or as a string holding one (vLLM accepts both for guided_json).
json::Value schema_value(const json::Value& v, const std::string& path) {
    if (v.is_object() || v.is_bool()) return v;
    if (v.is_string()) {
        try {
            return json::parse(v.as_string());
        } catch (const Error& e) {
            bad_param(path, "is not valid JSON: " + std::string(e.what()));
        }
    }
    wrong_type(path, "a JSON schema object", v);
}

OutputFormat from_vllm(const std::string& kind, const json::Value& v, const std::string& path) {
    OutputFormat out;
    out.param = path;
    if (kind == "json") {
        out.kind = OutputFormat::Kind::json_schema;
        out.schema = schema_value(v, path);
    } else if (kind == "regex" || kind == "grammar") {
        if (!v.is_string()) wrong_type(path, "a string", v);
        out.kind = kind == "regex" ? OutputFormat::Kind::regex : OutputFormat::Kind::grammar;
        out.text = v.as_string();
    } else if (kind == "choice") {
        if (!v.is_array() || v.size() == 0) bad_param(path, "must be a non-empty array of strings");
        out.kind = OutputFormat::Kind::choice;
        for (const json::Value& c : v.as_array()) {
            if (!c.is_string()) bad_param(path, "must be a non-empty array of strings");
            out.choices.push_back(c.as_string());
        }
    } else if (kind == "json_object") {
        if (!v.is_bool()) wrong_type(path, "a boolean", v);
        if (v.as_bool()) out.kind = OutputFormat::Kind::json_object;
    }
    return out;
}

void set_once(OutputFormat& out, OutputFormat f) {
    if (!f.on()) return;
    if (out.on()) bad_param(f.param, "conflicts with " + out.param + ": give one structured-output constraint");
    out = std::move(f);
}

}  // namespace

OutputFormat parse_output_format(Fields& f) {
    OutputFormat out;
    if (const json::Value* format = f.object("response_format")) {
        Fields rf(*format, "response_format");
        auto type = rf.string("type");
        if (!type) bad_param("response_format.type", "required", "missing_required_parameter");
        if (*type == "json_object") {
            out.kind = OutputFormat::Kind::json_object;
            out.param = "response_format";
        } else if (*type == "json_schema") {
            const json::Value* js = rf.object("json_schema");
            if (!js) bad_param("response_format.json_schema", "required", "missing_required_parameter");
            Fields jf(*js, "response_format.json_schema");
            if (!jf.string("name")) bad_param("response_format.json_schema.name", "required", "missing_required_parameter");
            jf.string("description");
            jf.boolean("strict");
            const json::Value* schema = jf.get("schema");
            out.kind = OutputFormat::Kind::json_schema;
            out.param = "response_format.json_schema.schema";
            out.schema = schema ? schema_value(*schema, out.param) : json::Value(json::Object{});
            jf.finish();
        } else if (*type != "text") {
            bad_param("response_format.type", "must be 'text', 'json_object' or 'json_schema', got '" +
                                                  type->substr(0, 40) + "'");
        }
        rf.finish();
    }
    for (const char* kind : {"json", "regex", "choice", "grammar"})
        if (const json::Value* v = f.get(std::string("guided_") + kind)) set_once(out, from_vllm(kind, *v, std::string("guided_") + kind));
    if (const json::Value* so = f.object("structured_outputs")) {
        Fields sf(*so, "structured_outputs");
        for (const char* kind : {"json", "regex", "choice", "grammar", "json_object"})
            if (const json::Value* v = sf.get(kind)) set_once(out, from_vllm(kind, *v, sf.path(kind)));
        sf.ignore({"disable_fallback", "disable_any_whitespace", "disable_additional_properties", "whitespace_pattern",
                   "backend"});
        sf.finish();
    }
    // vLLM's choice of library and its whitespace option: one engine here, compact JSON.
    f.ignore({"guided_decoding_backend", "guided_whitespace_pattern"});
    return out;
}

OutputFormat parse_text_format(const json::Value& format, const std::string& path) {
    Fields ff(format, path);
    OutputFormat out;
    auto type = ff.string("type");
    if (!type) bad_param(ff.path("type"), "required", "missing_required_parameter");
    if (*type == "json_object") {
        out.kind = OutputFormat::Kind::json_object;
        out.param = path;
    } else if (*type == "json_schema") {
        if (!ff.string("name")) bad_param(ff.path("name"), "required", "missing_required_parameter");
        ff.string("description");
        ff.boolean("strict");
        const json::Value* schema = ff.get("schema");
        if (!schema) bad_param(ff.path("schema"), "required", "missing_required_parameter");
        out.kind = OutputFormat::Kind::json_schema;
        out.param = ff.path("schema");
        out.schema = schema_value(*schema, out.param);
    } else if (*type != "text") {
        bad_param(ff.path("type"), "must be 'text', 'json_object' or 'json_schema', got '" + type->substr(0, 40) + "'");
    }
    ff.finish();
    return out;
}

}  // namespace osprey::server
