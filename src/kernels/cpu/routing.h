// Mixture-of-experts routing (spec §3.6 step 3): the top-k experts by raw router logit (bias included,
// ties go to the lower expert id), then a softmax over only those k logits.
#pragma once

#include <cstdint>
#include <span>

namespace osprey::cpu {

// logits: [n_tokens, n_experts]; expert_ids, expert_weights: [n_tokens, k], ids sorted by descending logit.
void route_topk_softmax(std::span<int32_t> expert_ids, std::span<float> expert_weights,
                        std::span<const float> logits, int n_tokens, int n_experts, int k);

}  // namespace osprey::cpu
