// safetensors reader/writer: round trips and one clear error per malformed input.
#include <cstring>

#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "io_test_util.h"

namespace osprey::io {
namespace {

using test::expect_error;
using test::raw_safetensors;
using test::ScratchDir;
using test::write_file;

// Byte i of tensor t: a pattern that differs between tensors and positions.
uint8_t pattern(size_t t, uint64_t i) { return uint8_t((i * 31 + t * 101 + (i >> 8)) & 0xff); }

std::vector<TensorSpec> sample_specs() {
    return {
        {"scales", DType::u8, {7}},
        {"w.bf16", DType::bf16, {3, 5}},
        {"w.f32", DType::f32, {2, 2}},
        {"empty", DType::bf16, {0, 4}},
    };
}

uint64_t write_sample(const std::filesystem::path& p, const WriteOptions& opt = {}) {
    return write_safetensors(p, sample_specs(), {{"format", "pt"}},
                             [](size_t t, uint64_t off, uint8_t* out, size_t n) {
                                 for (size_t i = 0; i < n; ++i) out[i] = pattern(t, off + i);
                             },
                             opt);
}

TEST(safetensors, round_trip_preserves_names_dtypes_shapes_and_bytes) {
    ScratchDir dir("st_round_trip");
    const uint64_t written = write_sample(dir / "a.safetensors");
    EXPECT_EQ(written, std::filesystem::file_size(dir / "a.safetensors"));
    auto f = SafetensorsFile::open(dir / "a.safetensors");
    const auto specs = sample_specs();
    ASSERT_EQ(f->tensors().size(), specs.size());
    for (size_t t = 0; t < specs.size(); ++t) {
        const TensorView* v = f->find(specs[t].name);
        ASSERT_NE(v, nullptr) << specs[t].name;
        EXPECT_EQ(v->dtype, specs[t].dtype);
        EXPECT_EQ(v->shape, specs[t].shape);
        const auto* bytes = static_cast<const uint8_t*>(v->data);
        for (size_t i = 0; i < v->nbytes(); ++i) ASSERT_EQ(bytes[i], pattern(t, i)) << specs[t].name << " byte " << i;
    }
    ASSERT_NE(f->metadata("format"), nullptr);
    EXPECT_EQ(*f->metadata("format"), "pt");
    EXPECT_EQ(f->find("missing"), nullptr);
}

TEST(safetensors, header_is_padded_to_8_bytes_and_data_is_aligned) {
    ScratchDir dir("st_align");
    write_sample(dir / "a.safetensors");
    auto f = SafetensorsFile::open(dir / "a.safetensors");
    EXPECT_EQ(f->header().data_start % 8, 0u);
    // Larger dtypes first, so each tensor is aligned to its element size within the file.
    for (const TensorEntry& e : f->header().tensors) EXPECT_EQ(e.begin % dtype_size(e.dtype), 0u) << e.name;
    const std::string h = make_header(sample_specs(), {});
    EXPECT_EQ(h.size() % 8, 0u);
    EXPECT_EQ(h.back(), ' ');  // padding with spaces, as the official writer
}

TEST(safetensors, chunked_multithreaded_write_matches_single_thread) {
    ScratchDir dir("st_chunks");
    std::vector<TensorSpec> specs = {{"a", DType::bf16, {1000, 1500}}, {"b", DType::u8, {3, 1 << 20}}};
    auto fill = [](size_t t, uint64_t off, uint8_t* out, size_t n) {
        for (size_t i = 0; i < n; ++i) out[i] = pattern(t, off + i);
    };
    write_safetensors(dir / "one.safetensors", specs, {}, fill, {.chunk_bytes = 1 << 20, .threads = 1});
    write_safetensors(dir / "many.safetensors", specs, {}, fill, {.chunk_bytes = 3 << 20, .threads = 4});
    EXPECT_EQ(test::read_file(dir / "one.safetensors"), test::read_file(dir / "many.safetensors"));
}

TEST(safetensors, empty_header_object_is_a_valid_file) {
    ScratchDir dir("st_empty");
    write_file(dir / "e.safetensors", raw_safetensors("{}      ", ""));
    EXPECT_TRUE(SafetensorsFile::open(dir / "e.safetensors")->tensors().empty());
}

// ---- malformed files: each gives one clear error naming the file (and tensor) -------------------

struct Malformed {
    ScratchDir dir{"st_bad"};
    std::string open_error(const std::string& bytes, const std::vector<std::string>& parts) {
        write_file(dir / "bad.safetensors", bytes);
        std::vector<std::string> all = parts;
        all.push_back("bad.safetensors");
        return expect_error([&] { SafetensorsFile::open(dir / "bad.safetensors"); }, all);
    }
};

TEST(safetensors_errors, missing_file) {
    ScratchDir dir("st_missing");
    expect_error([&] { SafetensorsFile::open(dir / "nope.safetensors"); }, {"nope.safetensors", "cannot open"});
}

TEST(safetensors_errors, file_too_short_for_length) {
    Malformed m;
    m.open_error("abc", {"too short for the 8-byte header length"});
}

TEST(safetensors_errors, truncated_header) {
    ScratchDir dir("st_trunc");
    write_sample(dir / "a.safetensors");
    const std::string full = test::read_file(dir / "a.safetensors");
    Malformed m;
    m.open_error(full.substr(0, 40), {"header length", "runs past the end of the file"});
}

TEST(safetensors_errors, truncated_data) {
    ScratchDir dir("st_trunc_data");
    write_sample(dir / "a.safetensors");
    const std::string full = test::read_file(dir / "a.safetensors");
    Malformed m;
    m.open_error(full.substr(0, full.size() - 3), {"run past the end of the data section"});
}

TEST(safetensors_errors, header_length_larger_than_file) {
    Malformed m;
    m.open_error(test::le64(5000) + "{}", {"header length 5000 runs past the end of the file (10 bytes)"});
}

TEST(safetensors_errors, oversized_header) {
    Malformed m;
    m.open_error(test::le64(200ull << 20) + "{}", {"header length 209715200 exceeds the limit"});
}

TEST(safetensors_errors, corrupt_header_json) {
    Malformed m;
    m.open_error(raw_safetensors(R"({"a": {"dtype": "U8", "shape": [1], )", ""), {"header is not valid JSON"});
    m.open_error(raw_safetensors(R"([1, 2])", ""), {"does not start with '{'"});
    m.open_error(raw_safetensors("{\"a\": \"\xff\"}", ""), {"not valid JSON"});
}

TEST(safetensors_errors, offsets_out_of_range) {
    Malformed m;
    m.open_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})", std::string(8, 'x')),
                 {"tensor 'w'", "data_offsets [0, 16] run past the end of the data section (8 bytes)"});
}

TEST(safetensors_errors, offsets_begin_after_end) {
    Malformed m;
    m.open_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[6,2]}})", std::string(8, 'x')),
                 {"tensor 'w'", "begin > end"});
}

TEST(safetensors_errors, overlapping_tensors) {
    Malformed m;
    m.open_error(raw_safetensors(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                                 R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[4,12]}})",
                                 std::string(16, 'x')),
                 {"'a' [0, 8)", "'b' [4, 12)", "overlap"});
}

TEST(safetensors_errors, size_does_not_match_shape) {
    Malformed m;
    m.open_error(raw_safetensors(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]}})", std::string(16, 'x')),
                 {"tensor 'w'", "hold 10 bytes but BF16 [2, 3] needs 12"});
}

TEST(safetensors_errors, unknown_dtype) {
    Malformed m;
    m.open_error(raw_safetensors(R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})", "xx"),
                 {"tensor 'w'", "unsupported dtype 'Q4_K'"});
}

TEST(safetensors_errors, bad_shapes) {
    Malformed m;
    m.open_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", ""),
                 {"tensor 'w'", "shape dimension must be a non-negative integer, got -1"});
    m.open_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,0]}})", ""),
                 {"shape dimension must be a non-negative integer"});
    m.open_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":"2","data_offsets":[0,2]}})", "xx"),
                 {"shape must be an array"});
    m.open_error(raw_safetensors(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296,4096],"data_offsets":[0,8]}})",
                                 std::string(8, 'x')),
                 {"overflows the byte count"});
}

TEST(safetensors_errors, missing_and_unknown_fields) {
    Malformed m;
    m.open_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[2]}})", "xx"), {"tensor 'w'", "missing field 'data_offsets'"});
    m.open_error(raw_safetensors(R"({"w":{"shape":[2],"data_offsets":[0,2]}})", "xx"), {"missing field 'dtype'"});
    m.open_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1}})", "xx"),
                 {"unknown field 'x'"});
    m.open_error(raw_safetensors(R"({"w":[1,2]})", ""), {"tensor 'w'", "entry must be an object"});
    m.open_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0]}})", "xx"),
                 {"data_offsets must be an array [begin, end]"});
}

TEST(safetensors_errors, metadata_must_be_strings) {
    Malformed m;
    m.open_error(raw_safetensors(R"({"__metadata__":{"format":1}})", ""), {"__metadata__ value of 'format'"});
    m.open_error(raw_safetensors(R"({"__metadata__":[]})", ""), {"__metadata__ must be an object"});
}

TEST(safetensors, parse_dtype_names) {
    EXPECT_EQ(parse_dtype("BF16"), DType::bf16);
    EXPECT_EQ(parse_dtype("U8"), DType::u8);
    EXPECT_EQ(parse_dtype("F8_E4M3"), DType::fp8_e4m3);
    expect_error([] { parse_dtype("bf16"); }, {"unsupported dtype 'bf16'"});
}

TEST(safetensors, writer_rejects_bad_specs) {
    expect_error([] { make_header({{"a", DType::u8, {1}}, {"a", DType::u8, {2}}}, {}); }, {"duplicate tensor 'a'"});
    expect_error([] { make_header({{"a", DType::u8, {-1}}}, {}); }, {"negative dimension"});
    expect_error([] { make_header({{"__metadata__", DType::u8, {1}}}, {}); }, {"bad tensor name"});
}

}  // namespace
}  // namespace osprey::io
