#include "kernels/cpu/routing.h"

#include <cmath>
#include <vector>

#include "core/check.h"

namespace osprey::cpu {

void route_topk_softmax(std::span<int32_t> expert_ids, std::span<float> expert_weights,
                        std::span<const float> logits, int n_tokens, int n_experts, int k) {
    OSPREY_CHECK(n_tokens >= 0 && n_experts > 0 && k > 0 && k <= n_experts, "routing: bad shape tokens=",
                 n_tokens, " experts=", n_experts, " k=", k);
    OSPREY_CHECK(logits.size() == size_t(n_tokens) * n_experts, "routing: logits have ", logits.size(),
                 " elements, expected ", size_t(n_tokens) * n_experts);
    OSPREY_CHECK(expert_ids.size() == size_t(n_tokens) * k && expert_weights.size() == expert_ids.size(),
                 "routing: outputs have ", expert_ids.size(), " and ", expert_weights.size(), " elements, expected ",
                 size_t(n_tokens) * k);
    std::vector<bool> taken(n_experts);  // [n_experts] already selected for this token
    for (int t = 0; t < n_tokens; ++t) {
        const float* r = logits.data() + size_t(t) * n_experts;  // [n_experts]
        int32_t* ids = expert_ids.data() + size_t(t) * k;        // [k]
        float* w = expert_weights.data() + size_t(t) * k;        // [k]
        // Top-k by selection: each round takes the largest remaining logit, the lowest id on ties.
        std::fill(taken.begin(), taken.end(), false);
        for (int i = 0; i < k; ++i) {
            int best = -1;
            for (int e = 0; e < n_experts; ++e)
                if (!taken[e] && (best < 0 || r[e] > r[best])) best = e;
            OSPREY_CHECK(!std::isnan(r[best]), "routing: router logit of token ", t, " is NaN");
            taken[best] = true;
            ids[i] = best;
        }
        // Softmax over the k selected logits; ids[0] holds the largest.
        double sum = 0.0;
        for (int i = 0; i < k; ++i) sum += std::exp(double(r[ids[i]]) - r[ids[0]]);
        for (int i = 0; i < k; ++i) w[i] = float(std::exp(double(r[ids[i]]) - r[ids[0]]) / sum);
    }
}

}  // namespace osprey::cpu
