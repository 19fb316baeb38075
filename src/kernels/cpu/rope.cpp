#include "kernels/cpu/rope.h"

#include "core/check.h"

namespace osprey::cpu {

void rope(std::span<float> x, std::span<const int32_t> positions, int n_heads, int head_dim,
          std::span<const float> cos, std::span<const float> sin) {
    OSPREY_CHECK(n_heads > 0 && head_dim > 0 && head_dim % 2 == 0, "rope: bad head shape ", n_heads, "x",
                 head_dim);
    const size_t n_tokens = positions.size();
    const int half = head_dim / 2;
    OSPREY_CHECK(x.size() == n_tokens * n_heads * head_dim, "rope: x has ", x.size(), " elements, expected ",
                 n_tokens * n_heads * head_dim);
    OSPREY_CHECK(cos.size() == sin.size() && cos.size() % half == 0, "rope: cos/sin tables of ", cos.size(),
                 " and ", sin.size(), " elements for half dim ", half);
    const int64_t n_positions = int64_t(cos.size() / half);
    for (size_t t = 0; t < n_tokens; ++t) {
        const int32_t p = positions[t];
        OSPREY_CHECK(p >= 0 && p < n_positions, "rope: position ", p, " outside the table [0, ", n_positions, ")");
        const float* c = cos.data() + size_t(p) * half;  // [half]
        const float* s = sin.data() + size_t(p) * half;  // [half]
        for (int h = 0; h < n_heads; ++h) {
            float* v = x.data() + (t * n_heads + h) * head_dim;  // [head_dim]
            for (int d = 0; d < half; ++d) {
                const float a = v[d], b = v[d + half];
                v[d] = a * c[d] - b * s[d];
                v[d + half] = b * c[d] + a * s[d];
            }
        }
    }
}

}  // namespace osprey::cpu
