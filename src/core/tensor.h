// A non-owning view of a tensor in host memory (typically a memory-mapped checkpoint).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace osprey {

enum class DType : uint8_t { bf16, f16, f32, u8, i32, i64, f64, fp8_e4m3, boolean };  // boolean: one byte (BOOL)

const char* dtype_name(DType t);  // safetensors spelling: "BF16", "F32", "U8", ...
size_t dtype_size(DType t);

struct TensorView {
    std::string name;
    DType dtype = DType::u8;
    std::vector<int64_t> shape;  // [outer, ..., inner], row-major
    const void* data = nullptr;

    int64_t numel() const;
    size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
    std::string describe() const;  // e.g. "bf16 [32, 5760]" (used in error messages)
    template <typename T>
    const T* as() const {
        return static_cast<const T*>(data);
    }
};

std::string format_shape(const std::vector<int64_t>& shape);  // "[32, 5760]"

}  // namespace osprey
