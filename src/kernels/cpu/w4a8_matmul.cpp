#include "kernels/cpu/w4a8_matmul.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/fp8.h"
#include "core/mxfp4.h"

namespace osprey::cpu::w4a8 {

void quantize_rows(std::span<uint8_t> q, std::span<float> scales, std::span<const float> x, int n_rows, int n) {
    const int nb = n_blocks(n);
    OSPREY_CHECK(n > 0 && n_rows >= 0 && x.size() == size_t(n_rows) * n && q.size() == x.size() &&
                     scales.size() == size_t(n_rows) * nb,
                 "w4a8::quantize_rows: bad sizes");
    for (int r = 0; r < n_rows; ++r)
        for (int b = 0; b < nb; ++b) {
            const int k0 = b * kBlock, k1 = std::min(n, k0 + kBlock);
            const float* xr = x.data() + size_t(r) * n;
            float amax = 0.0f;
            for (int k = k0; k < k1; ++k) amax = std::fmax(amax, std::fabs(xr[k]));
            const float s = fp8::block_scale_inv(amax);
            scales[size_t(r) * nb + b] = s;
            for (int k = k0; k < k1; ++k) q[size_t(r) * n + k] = fp8::quantize(xr[k], s);
        }
}

uint8_t weight_code(uint8_t nibble, int spread) {
    const float v = mxfp4::kFp4Values[nibble & 0xF];
    return fp8::float_to_e4m3(std::ldexp(v, kWeightShift - spread));  // exact for spread <= 14, else RN
}

float weight_multiplier(uint8_t block_max_scale) {
    return std::ldexp(1.0f, int(block_max_scale) - 127 - kWeightShift);
}

void decode_weight_row(uint8_t* codes, uint8_t* block_max, const uint8_t* blocks, const uint8_t* scales, int n_in) {
    const int n_groups = n_in / mxfp4::kBlockElements, groups_per_block = kBlock / mxfp4::kBlockElements;
    for (int b = 0; b < n_blocks(n_in); ++b) {
        const int g0 = b * groups_per_block, g1 = std::min(n_groups, g0 + groups_per_block);
        uint8_t S = 0;
        for (int g = g0; g < g1; ++g) S = std::max(S, scales[g]);
        block_max[b] = S;
        for (int g = g0; g < g1; ++g)
            for (int j = 0; j < mxfp4::kBlockBytes; ++j) {
                const uint8_t byte = blocks[g * mxfp4::kBlockBytes + j];
                codes[g * 32 + 2 * j] = weight_code(byte & 0xF, S - scales[g]);
                codes[g * 32 + 2 * j + 1] = weight_code(byte >> 4, S - scales[g]);
            }
    }
}

void matmul(std::span<float> y, std::span<const uint8_t> xq, std::span<const float> xs,
            std::span<const uint8_t> blocks, std::span<const uint8_t> scales, std::span<const float> bias, int n_rows,
            int n_in, int n_out, ThreadPool& pool) {
    const int nb = n_blocks(n_in);
    OSPREY_CHECK(n_in > 0 && n_out > 0 && n_rows >= 0 && n_in % mxfp4::kBlockElements == 0,
                 "w4a8::matmul: bad shape in=", n_in, " out=", n_out);
    OSPREY_CHECK(xq.size() == size_t(n_rows) * n_in && xs.size() == size_t(n_rows) * nb &&
                     y.size() == size_t(n_rows) * n_out && blocks.size() == size_t(n_out) * n_in / 2 &&
                     scales.size() == size_t(n_out) * n_in / 32 && (bias.empty() || bias.size() == size_t(n_out)),
                 "w4a8::matmul: bad sizes");
    const std::array<float, 256>& e4m3 = fp8::e4m3_table();
    pool.parallel_for(
        n_out,
        [&](int64_t begin, int64_t end) {
            std::vector<uint8_t> codes(n_in), block_max(nb);
            std::vector<float> w(n_in);
            for (int64_t o = begin; o < end; ++o) {
                decode_weight_row(codes.data(), block_max.data(), blocks.data() + o * (n_in / 2),
                                  scales.data() + o * (n_in / 32), n_in);
                for (int k = 0; k < n_in; ++k) w[k] = e4m3[codes[k]];
                for (int r = 0; r < n_rows; ++r) {
                    const uint8_t* x = xq.data() + size_t(r) * n_in;
                    float acc = bias.empty() ? 0.0f : bias[o];
                    for (int b = 0; b < nb; ++b) {
                        double p = 0.0;  // exact: at most 128 products of 4-bit significands
                        for (int k = b * kBlock; k < std::min(n_in, (b + 1) * kBlock); ++k)
                            p += double(w[k]) * double(e4m3[x[k]]);
                        acc = std::fma(float(p) * weight_multiplier(block_max[b]), xs[size_t(r) * nb + b], acc);
                    }
                    y[size_t(r) * n_out + o] = acc;
                }
            }
        },
        std::max<int64_t>(1, 4096 / std::max(1, n_rows)));
}

void mxfp4_matmul(std::span<float> y, std::span<const float> x, std::span<const uint8_t> blocks,
                  std::span<const uint8_t> scales, std::span<const float> bias, int n_rows, int n_in, int n_out,
                  ThreadPool& pool) {
    std::vector<uint8_t> q(size_t(n_rows) * n_in);
    std::vector<float> s(size_t(n_rows) * n_blocks(n_in));
    quantize_rows(q, s, x, n_rows, n_in);
    matmul(y, q, s, blocks, scales, bias, n_rows, n_in, n_out, pool);
}

}  // namespace osprey::cpu::w4a8
