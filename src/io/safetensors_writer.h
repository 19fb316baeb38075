// Streams tensors into a .safetensors file with large sequential writes, never holding more than a
// couple of chunks in memory. The header is computed up front from the tensor specs (so the data can
// be produced afterwards in order) and padded with spaces to a multiple of 8 bytes, as the official
// writer does. Like the official writer, data is laid out by dtype size (largest first; the given
// order otherwise), so every tensor's data is aligned to its element size within the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace osprey::io {

struct TensorSpec {
    std::string name;
    DType dtype = DType::bf16;
    std::vector<int64_t> shape;  // [outer, ..., inner]
    size_t nbytes() const;
};

// Fills out[0, n) with bytes [offset, offset + n) of tensor `index`'s data. Called with chunks in
// increasing offset order per tensor, possibly from several threads for different chunks.
using FillFn = std::function<void(size_t index, uint64_t offset, uint8_t* out, size_t n)>;

struct WriteOptions {
    size_t chunk_bytes = 64u << 20;  // bytes generated per fill round (split over `threads`)
    int threads = 0;                 // fill threads; 0 = hardware concurrency
};

// The serialised header (8-byte length + padded JSON) for these specs, and each tensor's offsets.
std::string make_header(const std::vector<TensorSpec>& specs,
                        const std::vector<std::pair<std::string, std::string>>& metadata);

// Writes `path` (via a temporary file renamed at the end, so a crash never leaves a valid-looking
// partial file). Returns the number of bytes written. Throws naming the path on I/O errors.
// The file name of shard k (0-based) of a checkpoint whose last shard is `last`, as Hugging Face names
// them: model-0000k-of-0000last.safetensors.
std::string shard_file_name(size_t k, size_t last);
// Tensors (by their byte sizes, in order) grouped into shards of at most max_bytes each (a larger
// tensor gets a shard of its own): the indices of each shard's tensors.
std::vector<std::vector<size_t>> group_into_shards(const std::vector<uint64_t>& sizes, uint64_t max_bytes);

uint64_t write_safetensors(const std::filesystem::path& path, const std::vector<TensorSpec>& specs,
                           const std::vector<std::pair<std::string, std::string>>& metadata,
                           const FillFn& fill, const WriteOptions& options = {});

}  // namespace osprey::io
