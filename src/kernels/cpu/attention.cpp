#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/fp8.h"

namespace osprey::cpu {

namespace {

// KV head g of position p ([head_dim] values): from the fresh rows, the FP32 cache, or decoded from
// the FP8 cache into `tmp` [head_dim].
const float* kv_head(const KvSource& kv, bool value, int p, int g, int d, int n_kv_heads, float* tmp) {
    if (p >= kv.n_cached) return (value ? kv.fresh_v : kv.fresh_k) + int64_t(p - kv.n_cached) * kv.fresh_stride + g * d;
    const int64_t block = kv.ring ? kv.blocks[0] : kv.blocks[p / kv.block_rows];
    const int64_t row = block * kv.block_rows + p % kv.block_rows;
    const int64_t row_width = int64_t(n_kv_heads) * d;
    if (kv.cache_k8 == nullptr) return (value ? kv.cache_v : kv.cache_k) + row * row_width + g * d;
    const uint8_t* codes = (value ? kv.cache_v8 : kv.cache_k8) + row * row_width + g * d;
    const float scale = (value ? kv.cache_v_scale : kv.cache_k_scale)[row * n_kv_heads + g];
    const auto& table = fp8::e4m3_table();
    for (int c = 0; c < d; ++c) tmp[c] = table[codes[c]] * scale;
    return tmp;
}

// First key position query position p attends to: the window's start, or the first present key.
int first_key(const AttentionArgs& a, int p) {
    const int window_start = a.window > 0 ? std::max(0, p - a.window + 1) : 0;
    return std::max(window_start, std::min(a.kv.first_cached, a.kv.n_cached));
}

void check_args(const AttentionArgs& a) {
    OSPREY_CHECK(a.n_heads > 0 && a.n_kv_heads > 0 && a.head_dim > 0 && a.n_heads % a.n_kv_heads == 0,
                 "attention: bad heads ", a.n_heads, "/", a.n_kv_heads, "x", a.head_dim);
    const size_t n_q = a.positions.size();
    const size_t row = size_t(a.n_heads) * a.head_dim;
    OSPREY_CHECK(a.q.size() == n_q * row && a.out.size() == n_q * row, "attention: q has ", a.q.size(),
                 " and out ", a.out.size(), " elements, expected ", n_q * row);
    OSPREY_CHECK(a.sinks.size() == size_t(a.n_heads), "attention: ", a.sinks.size(), " sinks for ", a.n_heads,
                 " heads");
    OSPREY_CHECK(a.window >= 0, "attention: negative window ", a.window);
    const KvSource& kv = a.kv;
    OSPREY_CHECK(kv.n_cached >= 0 && kv.n_fresh >= 0 && kv.first_cached >= 0 && kv.first_cached <= kv.n_cached,
                 "attention: bad key ranges: cached [", kv.first_cached, ", ", kv.n_cached, "), ", kv.n_fresh, " fresh");
    OSPREY_CHECK(kv.n_fresh == 0 || (kv.fresh_k && kv.fresh_v && kv.fresh_stride >= a.n_kv_heads * a.head_dim),
                 "attention: fresh rows missing or stride ", kv.fresh_stride, " too small");
    if (kv.n_cached > 0) {
        const bool fp32 = kv.cache_k && kv.cache_v;
        const bool fp8 = kv.cache_k8 && kv.cache_v8 && kv.cache_k_scale && kv.cache_v_scale;
        OSPREY_CHECK((fp32 || fp8) && kv.block_rows > 0 && !kv.blocks.empty(),
                     "attention: ", kv.n_cached, " cached positions but no cache");
        OSPREY_CHECK(kv.ring || kv.blocks.size() * size_t(kv.block_rows) >= size_t(kv.n_cached),
                     "attention: page table of ", kv.blocks.size(), " pages cannot hold ", kv.n_cached,
                     " cached positions");
    }
    const int n_keys = kv.n_cached + kv.n_fresh;
    for (size_t i = 0; i < n_q; ++i) {
        const int p = a.positions[i];
        OSPREY_CHECK(p >= 0 && p < n_keys, "attention: query position ", p, " has no key (", n_keys,
                     " positions available)");
        const int first = first_key(a, p);
        OSPREY_CHECK(!kv.ring || first >= kv.n_cached - kv.block_rows,
                     "attention: query at ", p, " needs position ", first, " but the ring of ", kv.block_rows,
                     " rows only keeps positions from ", kv.n_cached - kv.block_rows);
    }
}

}  // namespace

void attention_sinks(const AttentionArgs& a, ThreadPool& pool) {
    check_args(a);
    const int d = a.head_dim;
    const int group = a.n_heads / a.n_kv_heads;
    const int64_t n_items = int64_t(a.positions.size()) * a.n_heads;
    pool.parallel_for(n_items, [&](int64_t begin, int64_t end) {
        std::vector<float> scores;  // [n allowed keys] scaled logits
        std::vector<double> acc(d);  // [head_dim] unnormalised output
        std::vector<float> tmp(d);   // [head_dim] one FP8 row's head, decoded
        for (int64_t item = begin; item < end; ++item) {
            const int64_t i = item / a.n_heads;
            const int h = int(item % a.n_heads);
            const int g = h / group;
            const int p = a.positions[i];
            const int first = first_key(a, p);
            const float* q = a.q.data() + item * d;  // [head_dim]

            // Scaled logits of the allowed keys, and their max together with the sink.
            scores.resize(p - first + 1);
            float max_logit = a.sinks[h];
            for (int j = first; j <= p; ++j) {
                const float* k = kv_head(a.kv, false, j, g, d, a.n_kv_heads, tmp.data());  // [head_dim]
                float s = 0.0f;
                for (int c = 0; c < d; ++c) s += q[c] * k[c];
                scores[j - first] = s * a.scale;
                max_logit = std::max(max_logit, scores[j - first]);
            }
            // Softmax with the sink in the denominator, then the weighted sum of values.
            double den = std::exp(double(a.sinks[h]) - max_logit);
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int j = first; j <= p; ++j) {
                const double e = std::exp(double(scores[j - first]) - max_logit);
                den += e;
                const float* v = kv_head(a.kv, true, j, g, d, a.n_kv_heads, tmp.data());  // [head_dim]
                for (int c = 0; c < d; ++c) acc[c] += e * v[c];
            }
            float* o = a.out.data() + item * d;  // [head_dim]
            for (int c = 0; c < d; ++c) o[c] = float(acc[c] / den);
        }
    });
}

}  // namespace osprey::cpu
