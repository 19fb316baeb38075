// safetensors container: strict header parser and a memory-mapped single-file reader.
//
// Format: u64 little-endian N, then N bytes of UTF-8 JSON {name: {"dtype", "shape", "data_offsets":
// [begin, end)}, optional "__metadata__": {str: str}}, then the raw data; offsets are relative to
// the first byte after the header. The parser accepts only well-formed files: header size within
// limits and the file, known dtype strings, non-negative integer shapes, offsets in bounds, sizes
// equal to numel * dtype size, and tensors that do not overlap. Every error names the file and,
// where one is involved, the tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/mapped_file.h"

namespace osprey::io {

inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // 100 MB, as the reference implementation

// Parses a safetensors dtype string ("BF16", "F32", "U8", ...). Throws naming the string.
DType parse_dtype(std::string_view s);

struct TensorEntry {
    std::string name;
    DType dtype = DType::u8;
    std::vector<int64_t> shape;  // [outer, ..., inner]
    uint64_t begin = 0, end = 0;  // byte offsets relative to the data section
};

struct Header {
    std::vector<TensorEntry> tensors;                          // in header order
    std::vector<std::pair<std::string, std::string>> metadata;  // "__metadata__", in order
    uint64_t data_start = 0;                                   // 8 + N: first byte of the data section
};

// Parses and validates the header of a safetensors file whose first `size` bytes are `bytes`
// (normally the whole mapped file; the data section must fit in it). `what` names the file in errors.
// Throws osprey::Error for every malformed input, never crashes (fuzzed: tests/io).
Header parse_header(const uint8_t* bytes, size_t size, const std::string& what);

// One mapped .safetensors file with its validated header.
class SafetensorsFile {
public:
    static std::shared_ptr<const SafetensorsFile> open(const std::filesystem::path& path);

    const std::filesystem::path& path() const { return file_.path(); }
    const Header& header() const { return header_; }
    const std::vector<TensorView>& tensors() const { return views_; }  // in header order
    const TensorView* find(std::string_view name) const;               // nullptr when absent
    const std::string* metadata(std::string_view key) const;           // nullptr when absent
    size_t data_bytes() const;                                         // size of the data section

private:
    MappedFile file_;
    Header header_;
    std::vector<TensorView> views_;
    std::unordered_map<std::string_view, size_t> index_;  // name -> position in views_
};

}  // namespace osprey::io
