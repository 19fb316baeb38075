#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/json.h"

namespace osprey::io {

namespace {

constexpr std::string_view kMetadataKey = "__metadata__";

// An integer JSON value that fits in [0, INT64_MAX], or an error naming `what`.
uint64_t non_negative(const json::Value& v, const std::string& what) {
    OSPREY_CHECK(v.is_integer() && v.as_int() >= 0, what, " must be a non-negative integer, got ", v.dump());
    return uint64_t(v.as_int());
}

TensorEntry parse_entry(const std::string& file, const std::string& name, const json::Value& v,
                        uint64_t data_size) {
    const std::string where = file + ": tensor '" + name + "'";
    OSPREY_CHECK(v.is_object(), where, ": entry must be an object, got ", json::type_name(v.type()));
    TensorEntry e;
    e.name = name;
    bool have_dtype = false, have_shape = false, have_offsets = false;
    for (const auto& [key, field] : v.as_object()) {
        if (key == "dtype") {
            OSPREY_CHECK(field.is_string(), where, ": dtype must be a string, got ", field.dump());
            try {
                e.dtype = parse_dtype(field.as_string());
            } catch (const Error& err) {
                OSPREY_FAIL(where, ": ", err.what());
            }
            have_dtype = true;
        } else if (key == "shape") {
            OSPREY_CHECK(field.is_array(), where, ": shape must be an array, got ", field.dump());
            OSPREY_CHECK(field.size() <= 64, where, ": shape has ", field.size(), " dimensions (limit 64)");
            for (const json::Value& d : field.as_array()) {
                const uint64_t n = non_negative(d, where + ": shape dimension");
                OSPREY_CHECK(n <= uint64_t(std::numeric_limits<int64_t>::max()), where, ": shape dimension too large");
                e.shape.push_back(int64_t(n));
            }
            have_shape = true;
        } else if (key == "data_offsets") {
            OSPREY_CHECK(field.is_array() && field.size() == 2, where,
                         ": data_offsets must be an array [begin, end], got ", field.dump());
            e.begin = non_negative(field.as_array()[0], where + ": data_offsets begin");
            e.end = non_negative(field.as_array()[1], where + ": data_offsets end");
            have_offsets = true;
        } else {
            OSPREY_FAIL(where, ": unknown field '", key, "' (expected dtype, shape, data_offsets)");
        }
    }
    OSPREY_CHECK(have_dtype, where, ": missing field 'dtype'");
    OSPREY_CHECK(have_shape, where, ": missing field 'shape'");
    OSPREY_CHECK(have_offsets, where, ": missing field 'data_offsets'");

    // numel * dtype size, with overflow detection.
    uint64_t bytes = dtype_size(e.dtype);
    for (int64_t d : e.shape) {
        OSPREY_CHECK(d == 0 || bytes <= std::numeric_limits<uint64_t>::max() / uint64_t(d), where, ": shape ",
                     format_shape(e.shape), " overflows the byte count");
        bytes *= uint64_t(d);
    }
    OSPREY_CHECK(e.begin <= e.end, where, ": data_offsets [", e.begin, ", ", e.end, "] has begin > end");
    OSPREY_CHECK(e.end <= data_size, where, ": data_offsets [", e.begin, ", ", e.end,
                 "] run past the end of the data section (", data_size, " bytes)");
    OSPREY_CHECK(e.end - e.begin == bytes, where, ": data_offsets [", e.begin, ", ", e.end, "] hold ",
                 e.end - e.begin, " bytes but ", dtype_name(e.dtype), " ", format_shape(e.shape), " needs ", bytes);
    return e;
}

}  // namespace

DType parse_dtype(std::string_view s) {
    static constexpr DType kAll[] = {DType::bf16, DType::f16, DType::f32, DType::u8,
                                     DType::i32,  DType::i64, DType::f64, DType::fp8_e4m3, DType::boolean};
    for (DType t : kAll)
        if (s == dtype_name(t)) return t;
    OSPREY_FAIL("unsupported dtype '", s, "' (supported: BF16 F16 F32 F64 U8 I32 I64 F8_E4M3 BOOL)");
}

Header parse_header(const uint8_t* bytes, size_t size, const std::string& what) {
    OSPREY_CHECK(size >= 8, what, ": file is ", size, " bytes, too short for the 8-byte header length");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian
    OSPREY_CHECK(n <= kMaxHeaderBytes, what, ": header length ", n, " exceeds the limit of ", kMaxHeaderBytes,
                 " bytes");
    OSPREY_CHECK(n <= size - 8, what, ": header length ", n, " runs past the end of the file (", size, " bytes)");
    OSPREY_CHECK(n >= 2, what, ": header length ", n, " is too short for a JSON object");

    const std::string_view text(reinterpret_cast<const char*>(bytes + 8), size_t(n));
    OSPREY_CHECK(text.front() == '{', what, ": header does not start with '{'");
    json::Value root;
    try {
        root = json::parse(text, {.max_depth = 8});
    } catch (const Error& e) {
        OSPREY_FAIL(what, ": header is not valid JSON: ", e.what());
    }
    OSPREY_CHECK(root.is_object(), what, ": header must be a JSON object");

    Header h;
    h.data_start = 8 + n;
    const uint64_t data_size = size - h.data_start;
    for (const auto& [name, v] : root.as_object()) {
        if (name == kMetadataKey) {
            OSPREY_CHECK(v.is_object(), what, ": __metadata__ must be an object of strings");
            for (const auto& [k, s] : v.as_object()) {
                OSPREY_CHECK(s.is_string(), what, ": __metadata__ value of '", k, "' must be a string, got ", s.dump());
                h.metadata.emplace_back(k, s.as_string());
            }
            continue;
        }
        OSPREY_CHECK(!name.empty(), what, ": tensor with an empty name");
        h.tensors.push_back(parse_entry(what, name, v, data_size));
    }

    // No two tensors may share bytes (zero-sized tensors occupy nothing).
    std::vector<const TensorEntry*> order;
    for (const TensorEntry& e : h.tensors)
        if (e.end > e.begin) order.push_back(&e);
    std::sort(order.begin(), order.end(), [](const TensorEntry* a, const TensorEntry* b) { return a->begin < b->begin; });
    for (size_t i = 1; i < order.size(); ++i) {
        OSPREY_CHECK(order[i]->begin >= order[i - 1]->end, what, ": tensors '", order[i - 1]->name, "' [",
                     order[i - 1]->begin, ", ", order[i - 1]->end, ") and '", order[i]->name, "' [", order[i]->begin,
                     ", ", order[i]->end, ") overlap");
    }
    return h;
}

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
    auto f = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
    f->file_ = MappedFile(path);
    f->header_ = parse_header(f->file_.data(), f->file_.size(), path.string());
    const uint8_t* data = f->file_.data() + f->header_.data_start;
    f->views_.reserve(f->header_.tensors.size());
    for (const TensorEntry& e : f->header_.tensors) {
        TensorView v;
        v.name = e.name;
        v.dtype = e.dtype;
        v.shape = e.shape;
        v.data = data + e.begin;
        f->views_.push_back(std::move(v));
    }
    for (size_t i = 0; i < f->views_.size(); ++i) f->index_.emplace(f->views_[i].name, i);
    return f;
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &views_[it->second];
}

const std::string* SafetensorsFile::metadata(std::string_view key) const {
    for (const auto& [k, v] : header_.metadata)
        if (k == key) return &v;
    return nullptr;
}

size_t SafetensorsFile::data_bytes() const { return file_.size() - header_.data_start; }

}  // namespace osprey::io
