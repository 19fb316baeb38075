#include "kernels/cpu/mxfp4_matmul.h"

#include <cmath>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/matmul.h"
#include "core/mxfp4.h"

namespace osprey::cpu {

void mxfp4_dequantize_row(std::span<float> out, const uint8_t* blocks, const uint8_t* scales) {
    OSPREY_CHECK(out.size() % kMxfp4BlockElems == 0, "mxfp4: row length ", out.size(), " is not a multiple of ",
                 kMxfp4BlockElems);
    mxfp4::decode_row(blocks, scales, int(out.size()), out.data());
}

void mxfp4_matmul(std::span<float> y, std::span<const float> x, std::span<const uint8_t> blocks,
                  std::span<const uint8_t> scales, std::span<const float> bias, int n_rows, int n_in, int n_out,
                  ThreadPool& pool) {
    OSPREY_CHECK(n_rows >= 0 && n_in > 0 && n_out > 0 && n_in % kMxfp4BlockElems == 0,
                 "mxfp4_matmul: bad shape rows=", n_rows, " in=", n_in, " out=", n_out, " (in must be a multiple of ",
                 kMxfp4BlockElems, ")");
    const size_t blocks_per_row = size_t(n_in) / kMxfp4BlockElems;
    OSPREY_CHECK(x.size() == size_t(n_rows) * n_in, "mxfp4_matmul: x has ", x.size(), " elements, expected ",
                 size_t(n_rows) * n_in);
    OSPREY_CHECK(y.size() == size_t(n_rows) * n_out, "mxfp4_matmul: y has ", y.size(), " elements, expected ",
                 size_t(n_rows) * n_out);
    OSPREY_CHECK(blocks.size() == size_t(n_out) * blocks_per_row * kMxfp4BlockBytes, "mxfp4_matmul: blocks have ",
                 blocks.size(), " bytes, expected ", size_t(n_out) * blocks_per_row * kMxfp4BlockBytes);
    OSPREY_CHECK(scales.size() == size_t(n_out) * blocks_per_row, "mxfp4_matmul: scales have ", scales.size(),
                 " bytes, expected ", size_t(n_out) * blocks_per_row);
    OSPREY_CHECK(bias.empty() || bias.size() == size_t(n_out), "mxfp4_matmul: bias has ", bias.size(),
                 " elements, expected ", n_out);
    const int64_t grain = std::max<int64_t>(1, 16384 / n_in);
    pool.parallel_for(
        n_out,
        [&](int64_t begin, int64_t end) {
            std::vector<float> w(n_in);  // [n_in], one decoded weight row
            for (int64_t o = begin; o < end; ++o) {
                mxfp4_dequantize_row(w, blocks.data() + o * blocks_per_row * kMxfp4BlockBytes,
                                     scales.data() + o * blocks_per_row);
                const float b = bias.empty() ? 0.0f : bias[o];
                for (int r = 0; r < n_rows; ++r)
                    y[size_t(r) * n_out + o] = dot_f32(w.data(), x.data() + size_t(r) * n_in, n_in) + b;
            }
        },
        grain);
}

}  // namespace osprey::cpu
