// FP8 E4M3 block-scaled matmul (kernels/cpu/fp8_matmul.h) against dequantise-then-matmul in double,
// at shapes from the 128-block constant (one block, several, a partial one, less than one, gpt-oss's
// 2880 = 22.5 blocks) and windows that start inside a block (tensor-parallel slices); and attention
// over an FP8 KV cache equal to attention over an FP32 cache holding the decoded rows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/fp8.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/fp8_matmul.h"

namespace osprey::cpu {
namespace {

struct Quantised {
    std::vector<uint8_t> q;    // [rows, cols]
    std::vector<float> scale;  // [nb(rows), nb(cols)]
    std::vector<float> dense;  // [rows, cols] the original values
};

Quantised quantise(int rows, int cols, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    Quantised m;
    m.dense.resize(size_t(rows) * cols);
    for (size_t i = 0; i < m.dense.size(); ++i) m.dense[i] = dist(rng) * (1.0f + float(i % 7));  // uneven blocks
    m.q.resize(m.dense.size());
    const int64_t cb = fp8::n_blocks(cols);
    m.scale.resize(size_t(fp8::n_blocks(rows) * cb));
    for (int r0 = 0; r0 < rows; r0 += fp8::kBlock)
        fp8::quantize_band(m.dense.data() + size_t(r0) * cols, std::min(fp8::kBlock, rows - r0), cols,
                           m.q.data() + size_t(r0) * cols, m.scale.data() + (r0 / fp8::kBlock) * cb);
    return m;
}

void check(int rows, int cols, int n_rows, int row0, int col0, int n_out, int n_in) {
    const Quantised m = quantise(rows, cols, uint32_t(rows * 7 + cols));
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> x(size_t(n_rows) * n_in), bias(static_cast<size_t>(n_out)), y(size_t(n_rows) * n_out);
    for (float& v : x) v = dist(rng);
    for (float& v : bias) v = dist(rng);
    const Fp8Matrix w{.data = m.q.data(), .scale_inv = m.scale.data(), .ld = cols, .row0 = row0, .col0 = col0};
    fp8_matmul(y, x, w, bias, n_rows, n_in, n_out);
    const int64_t cb = fp8::n_blocks(cols);
    double worst = 0, at = -1;
    for (int r = 0; r < n_rows; ++r)
        for (int o = 0; o < n_out; ++o) {
            double want = bias[size_t(o)], mag = std::fabs(bias[size_t(o)]);
            for (int c = 0; c < n_in; ++c) {
                const int R = row0 + o, C = col0 + c;
                const double wv = double(fp8::e4m3_to_float(m.q[size_t(R) * cols + C])) *
                                  m.scale[size_t((R / fp8::kBlock) * cb + C / fp8::kBlock)];
                want += wv * x[size_t(r) * n_in + c];
                mag += std::fabs(wv * x[size_t(r) * n_in + c]);
            }
            const double err = std::fabs(y[size_t(r) * n_out + o] - want) / (mag + 1e-30);
            if (err > worst) worst = err, at = r * n_out + o;
        }
    // FP32 accumulation of <= 2880 terms against double: a few ulps of the magnitude sum.
    EXPECT_LT(worst, 2e-6) << "worst relative error " << worst << " at output " << at << " (" << rows << "x" << cols
                           << ", window " << row0 << "," << col0 << " " << n_out << "x" << n_in << ")";
}

TEST(cpu_fp8_matmul, one_block) {
    check(128, 128, 3, 0, 0, 128, 128);
}
TEST(cpu_fp8_matmul, several_blocks) {
    check(384, 512, 2, 0, 0, 384, 512);
}
TEST(cpu_fp8_matmul, partial_block) {
    check(200, 2880, 2, 0, 0, 200, 2880);
}
TEST(cpu_fp8_matmul, less_than_one_block) {
    check(64, 100, 5, 0, 0, 64, 100);
}
TEST(cpu_fp8_matmul, window_inside_blocks) {
    check(300, 2880, 3, 96, 1440, 150, 1440);
}
TEST(cpu_fp8_matmul, gpt_oss_down_projection_columns) {
    check(2880, 2880, 1, 0, 1408, 2880, 1472);
}

TEST(cpu_fp8_quantise, partial_block_error_is_half_an_e4m3_step) {
    const Quantised m = quantise(130, 2880, 9);  // last row band of 2 rows, last column block of 64
    const int64_t cb = fp8::n_blocks(2880);
    for (int r = 0; r < 130; ++r)
        for (int c = 0; c < 2880; ++c) {
            const float s = m.scale[size_t((r / 128) * cb + c / 128)];
            const float w = m.dense[size_t(r) * 2880 + c], d = fp8::e4m3_to_float(m.q[size_t(r) * 2880 + c]) * s;
            // Normals: 2^-4 relative; subnormals: half of 2^-9, times the multiplier.
            ASSERT_LE(std::fabs(d - w), std::fmax(std::fabs(w) * 0x1p-4f, s * 0x1p-10f) * 1.0001f) << r << "," << c;
        }
}

TEST(cpu_attention, fp8_cache_equals_f32_cache_of_the_decoded_rows) {
    constexpr int heads = 4, kv_heads = 2, d = 64, rows = 8, pages = 3, n_cached = 19, n_fresh = 2;
    const int width = kv_heads * d;
    std::mt19937 rng(3);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<uint8_t> k8(size_t(pages * rows * width)), v8(k8.size());
    std::vector<float> ks(size_t(pages * rows * kv_heads)), vs(ks.size()), k32(k8.size()), v32(k8.size());
    for (size_t i = 0; i < k8.size(); ++i) {  // any finite code, sign included
        k8[i] = uint8_t(rng() % 256);
        v8[i] = uint8_t(rng() % 256);
        if ((k8[i] & 0x7F) == 0x7F) k8[i] = 0;
        if ((v8[i] & 0x7F) == 0x7F) v8[i] = 0;
    }
    for (size_t i = 0; i < ks.size(); ++i) ks[i] = 0.001f * (1 + i % 5), vs[i] = 0.002f * (1 + i % 3);
    for (size_t i = 0; i < k8.size(); ++i) {
        k32[i] = fp8::e4m3_to_float(k8[i]) * ks[i / d];
        v32[i] = fp8::e4m3_to_float(v8[i]) * vs[i / d];
    }
    std::vector<float> q(size_t(n_fresh) * heads * d), fresh(size_t(n_fresh) * width), sinks(heads, 0.3f);
    for (float& v : q) v = dist(rng);
    for (float& v : fresh) v = dist(rng);
    const std::vector<int32_t> page_table = {2, 0, 1}, positions = {19, 20};
    std::vector<float> out8(q.size()), out32(q.size());
    for (bool fp8 : {true, false}) {
        KvSource kv{.blocks = page_table,
                    .block_rows = rows,
                    .n_cached = n_cached,
                    .fresh_k = fresh.data(),
                    .fresh_v = fresh.data(),
                    .fresh_stride = width,
                    .n_fresh = n_fresh};
        if (fp8) {
            kv.cache_k8 = k8.data(), kv.cache_v8 = v8.data(), kv.cache_k_scale = ks.data(),
            kv.cache_v_scale = vs.data();
        } else {
            kv.cache_k = k32.data(), kv.cache_v = v32.data();
        }
        attention_sinks({.out = fp8 ? out8 : out32,
                         .q = q,
                         .positions = positions,
                         .sinks = sinks,
                         .kv = kv,
                         .n_heads = heads,
                         .n_kv_heads = kv_heads,
                         .head_dim = d,
                         .window = 0,
                         .scale = 0.125f});
    }
    EXPECT_EQ(out8, out32);
}

}  // namespace
}  // namespace osprey::cpu
