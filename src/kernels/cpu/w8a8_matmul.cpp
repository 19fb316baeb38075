#include "kernels/cpu/w8a8_matmul.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/fp8.h"
#include "kernels/cpu/w4a8_matmul.h"

namespace osprey::cpu::w8a8 {

void matmul(std::span<float> y, std::span<const uint8_t> xq, std::span<const float> xs, const Fp8Matrix& w,
            std::span<const float> bias, int n_rows, int n_in, int n_out, ThreadPool& pool) {
    const int nb = int(fp8::n_blocks(n_in));
    OSPREY_CHECK(n_in > 0 && n_out > 0 && n_rows >= 0, "w8a8::matmul: bad shape in=", n_in, " out=", n_out);
    OSPREY_CHECK(w.data && w.scale_inv && w.row0 >= 0 && w.col0 >= 0 && w.col0 + n_in <= w.ld,
                 "w8a8::matmul: window columns [", w.col0, ", ", w.col0 + n_in, ") outside a matrix of ", w.ld,
                 " columns, or no data/scales");
    OSPREY_CHECK(w.col0 % fp8::kBlock == 0, "w8a8::matmul: the window starts at column ", w.col0,
                 ", not a multiple of ", fp8::kBlock, ": its k-blocks would not be the activations'");
    OSPREY_CHECK(xq.size() == size_t(n_rows) * n_in && xs.size() == size_t(n_rows) * nb &&
                     y.size() == size_t(n_rows) * n_out && (bias.empty() || bias.size() == size_t(n_out)),
                 "w8a8::matmul: bad sizes");
    const std::array<float, 256>& e4m3 = fp8::e4m3_table();
    const int64_t scale_cols = fp8::n_blocks(w.ld), kb0 = w.col0 / fp8::kBlock;
    pool.parallel_for(
        n_out,
        [&](int64_t begin, int64_t end) {
            std::vector<float> wv(static_cast<size_t>(n_in));  // one weight row's codes as values, unscaled
            for (int64_t o = begin; o < end; ++o) {
                const uint8_t* codes = w.data + (w.row0 + o) * w.ld + w.col0;
                for (int k = 0; k < n_in; ++k) wv[size_t(k)] = e4m3[codes[k]];
                const float* ws = w.scale_inv + ((w.row0 + o) / fp8::kBlock) * scale_cols + kb0;
                for (int r = 0; r < n_rows; ++r) {
                    const uint8_t* x = xq.data() + size_t(r) * n_in;
                    float acc = bias.empty() ? 0.0f : bias[size_t(o)];
                    for (int b = 0; b < nb; ++b) {
                        double p = 0.0;  // exact: at most 128 products of 4-bit significands
                        for (int k = b * fp8::kBlock; k < std::min(n_in, (b + 1) * fp8::kBlock); ++k)
                            p += double(wv[size_t(k)]) * double(e4m3[x[k]]);
                        acc = std::fma(float(p) * ws[b], xs[size_t(r) * nb + b], acc);
                    }
                    y[size_t(r) * n_out + o] = acc;
                }
            }
        },
        std::max<int64_t>(1, 4096 / std::max(1, n_rows)));
}

void fp8_matmul(std::span<float> y, std::span<const float> x, const Fp8Matrix& w, std::span<const float> bias,
                int n_rows, int n_in, int n_out, ThreadPool& pool) {
    std::vector<uint8_t> q(size_t(n_rows) * n_in);
    std::vector<float> s(size_t(n_rows) * w4a8::n_blocks(n_in));
    w4a8::quantize_rows(q, s, x, n_rows, n_in);
    matmul(y, q, s, w, bias, n_rows, n_in, n_out, pool);
}

}  // namespace osprey::cpu::w8a8
