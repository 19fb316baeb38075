#include "core/tensor.h"

#include "core/check.h"

namespace osprey {

const char* dtype_name(DType t) {
    switch (t) {
        case DType::bf16: return "BF16";
        case DType::f16: return "F16";
        case DType::f32: return "F32";
        case DType::u8: return "U8";
        case DType::i32: return "I32";
        case DType::i64: return "I64";
        case DType::f64: return "F64";
        case DType::fp8_e4m3: return "F8_E4M3";
        case DType::boolean: return "BOOL";
    }
    return "?";
}

size_t dtype_size(DType t) {
    switch (t) {
        case DType::bf16:
        case DType::f16: return 2;
        case DType::f32:
        case DType::i32: return 4;
        case DType::i64:
        case DType::f64: return 8;
        case DType::u8:
        case DType::fp8_e4m3: return 1;
        case DType::boolean: return 1;
    }
    return 0;
}

int64_t TensorView::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

std::string format_shape(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

std::string TensorView::describe() const { return str(dtype_name(dtype), " ", format_shape(shape)); }

}  // namespace osprey
