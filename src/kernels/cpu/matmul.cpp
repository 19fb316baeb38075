#include "kernels/cpu/matmul.h"

#include <bit>
#include <cstdint>

#include "core/check.h"

namespace osprey::cpu {

namespace {

constexpr int kLanes = 16;  // independent partial sums: lets the compiler vectorise the inner loop

inline float widen(bf16 v) { return std::bit_cast<float>(uint32_t(v.bits) << 16); }

}  // namespace

float dot_bf16(const bf16* w, const float* x, int n) {
    float lane[kLanes] = {};
    int i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; ++j) lane[j] += widen(w[i + j]) * x[i + j];
    for (int j = 0; i < n; ++i, ++j) lane[j] += widen(w[i]) * x[i];
    // Pairwise fold of the lanes: fixed order.
    for (int width = kLanes / 2; width > 0; width /= 2)
        for (int j = 0; j < width; ++j) lane[j] += lane[j + width];
    return lane[0];
}

float dot_f32(const float* a, const float* b, int64_t n) {
    float lane[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; ++j) lane[j] += a[i + j] * b[i + j];
    for (int j = 0; i < n; ++i, ++j) lane[j] += a[i] * b[i];
    for (int width = kLanes / 2; width > 0; width /= 2)
        for (int j = 0; j < width; ++j) lane[j] += lane[j + width];
    return lane[0];
}

void matmul_bf16w(std::span<float> y, std::span<const float> x, std::span<const bf16> w,
                  std::span<const float> bias, int n_rows, int n_in, int n_out, ThreadPool& pool) {
    OSPREY_CHECK(n_rows >= 0 && n_in > 0 && n_out > 0, "matmul: bad shape rows=", n_rows, " in=", n_in,
                 " out=", n_out);
    OSPREY_CHECK(x.size() == size_t(n_rows) * n_in, "matmul: x has ", x.size(), " elements, expected ",
                 size_t(n_rows) * n_in);
    OSPREY_CHECK(y.size() == size_t(n_rows) * n_out, "matmul: y has ", y.size(), " elements, expected ",
                 size_t(n_rows) * n_out);
    OSPREY_CHECK(w.size() == size_t(n_out) * n_in, "matmul: w has ", w.size(), " elements, expected ",
                 size_t(n_out) * n_in);
    OSPREY_CHECK(bias.empty() || bias.size() == size_t(n_out), "matmul: bias has ", bias.size(),
                 " elements, expected ", n_out);
    const int64_t grain = std::max<int64_t>(1, 65536 / n_in);
    pool.parallel_for(
        n_out,
        [&](int64_t begin, int64_t end) {
            for (int64_t o = begin; o < end; ++o) {
                const bf16* wo = w.data() + o * n_in;  // [n_in]
                const float b = bias.empty() ? 0.0f : bias[o];
                for (int r = 0; r < n_rows; ++r)
                    y[size_t(r) * n_out + o] = dot_bf16(wo, x.data() + size_t(r) * n_in, n_in) + b;
            }
        },
        grain);
}

}  // namespace osprey::cpu
