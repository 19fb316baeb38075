#include "kernels/cpu/fp8_matmul.h"

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/matmul.h"
#include "core/fp8.h"

namespace osprey::cpu {

namespace {

// Scale row of the window's row `row` (a pointer to the whole matrix's row of block multipliers).
const float* scale_row(const Fp8Matrix& w, int64_t row) {
    return w.scale_inv + ((w.row0 + row) / fp8::kBlock) * fp8::n_blocks(w.ld);
}

}  // namespace

void fp8_dequantize_row(std::span<float> out, const Fp8Matrix& w, int64_t row) {
    const auto& table = fp8::e4m3_table();
    const uint8_t* q = w.data + (w.row0 + row) * w.ld + w.col0;  // [n_in]
    const float* s = scale_row(w, row);
    for (size_t c = 0; c < out.size(); ++c) out[c] = table[q[c]] * s[(w.col0 + int64_t(c)) / fp8::kBlock];
}

void fp8_matmul(std::span<float> y, std::span<const float> x, const Fp8Matrix& w, std::span<const float> bias,
                int n_rows, int n_in, int n_out, ThreadPool& pool) {
    OSPREY_CHECK(n_rows >= 0 && n_in > 0 && n_out > 0, "fp8_matmul: bad shape rows=", n_rows, " in=", n_in,
                 " out=", n_out);
    OSPREY_CHECK(w.data && w.scale_inv && w.row0 >= 0 && w.col0 >= 0 && w.col0 + n_in <= w.ld,
                 "fp8_matmul: window columns [", w.col0, ", ", w.col0 + n_in, ") outside a matrix of ", w.ld,
                 " columns, or no data/scales");
    OSPREY_CHECK(x.size() == size_t(n_rows) * n_in, "fp8_matmul: x has ", x.size(), " elements, expected ",
                 size_t(n_rows) * n_in);
    OSPREY_CHECK(y.size() == size_t(n_rows) * n_out, "fp8_matmul: y has ", y.size(), " elements, expected ",
                 size_t(n_rows) * n_out);
    OSPREY_CHECK(bias.empty() || bias.size() == size_t(n_out), "fp8_matmul: bias has ", bias.size(),
                 " elements, expected ", n_out);
    const auto& table = fp8::e4m3_table();
    const int64_t grain = std::max<int64_t>(1, 16384 / n_in);
    pool.parallel_for(
        n_out,
        [&](int64_t begin, int64_t end) {
            std::vector<float> q(static_cast<size_t>(n_in));  // [n_in] one row's codes as values, unscaled
            for (int64_t o = begin; o < end; ++o) {
                const uint8_t* codes = w.data + (w.row0 + o) * w.ld + w.col0;
                for (int c = 0; c < n_in; ++c) q[size_t(c)] = table[codes[c]];
                const float* s = scale_row(w, o);
                const float b = bias.empty() ? 0.0f : bias[o];
                for (int r = 0; r < n_rows; ++r) {
                    const float* xr = x.data() + size_t(r) * n_in;
                    // Σ over the k-blocks the window crosses: block partial sum · block multiplier.
                    float acc = 0.0f;
                    for (int64_t c0 = 0; c0 < n_in;) {
                        const int64_t block = (w.col0 + c0) / fp8::kBlock;
                        const int64_t c1 = std::min<int64_t>(n_in, (block + 1) * fp8::kBlock - w.col0);
                        acc += dot_f32(q.data() + c0, xr + c0, c1 - c0) * s[block];
                        c0 = c1;
                    }
                    y[size_t(r) * n_out + o] = acc + b;
                }
            }
        },
        grain);
}

}  // namespace osprey::cpu
