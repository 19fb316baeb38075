// Prompt scoring helpers (see prompt_scores.h).
#include "model/prompt_scores.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace osprey::model {

std::vector<ScoredRow> scored_rows(const ForwardBatch& batch, int vocab_size) {
    std::vector<ScoredRow> rows;
    for (size_t s = 0; s < batch.slices.size(); ++s) {
        const SequenceSlice& sl = batch.slices[s];
        if (sl.score_targets.empty()) continue;
        OSPREY_CHECK(int(sl.score_targets.size()) == sl.n_tokens, "slice ", s, ": ", sl.score_targets.size(),
                     " score targets for ", sl.n_tokens, " tokens");
        OSPREY_CHECK(sl.score_top_k >= 0 && sl.score_top_k <= 20, "slice ", s, ": score_top_k ", sl.score_top_k,
                     " outside [0, 20]");
        OSPREY_CHECK(!sl.want_logits || sl.score_targets.back() < 0, "slice ", s,
                     ": its last position is sampled (want_logits), so it cannot be scored");
        for (int i = 0; i < sl.n_tokens; ++i) {
            const int32_t t = sl.score_targets[size_t(i)];
            if (t < 0) continue;
            OSPREY_CHECK(t < vocab_size, "slice ", s, ": score target ", t, " outside the vocabulary");
            rows.push_back({sl.first_token + i, t, sl.score_top_k});
        }
    }
    return rows;
}

void score_logit_rows(std::span<const float> logits, int vocab, std::span<const ScoredRow> rows,
                      std::vector<TokenScore>& out) {
    OSPREY_CHECK(logits.size() == rows.size() * size_t(vocab), "score_logit_rows: ", logits.size(),
                 " logits for ", rows.size(), " rows of ", vocab);
    for (size_t r = 0; r < rows.size(); ++r) {
        const float* x = logits.data() + r * size_t(vocab);
        auto value = [&](int t) { return std::isnan(x[t]) ? -INFINITY : x[t]; };
        float max = -INFINITY;
        for (int t = 0; t < vocab; ++t) max = std::max(max, value(t));
        double sum = 0.0;
        if (std::isfinite(max))
            for (int t = 0; t < vocab; ++t) sum += std::exp(double(value(t)) - double(max));
        const double log_z = std::isfinite(max) ? double(max) + std::log(sum) : 0.0;
        auto logprob = [&](int t) { return float(double(value(t)) - log_z); };

        TokenScore s;
        const int target = rows[r].target;
        const float tv = value(target);
        s.logprob = logprob(target);
        s.rank = 1;
        for (int t = 0; t < vocab; ++t) s.rank += value(t) > tv || (value(t) == tv && t < target);
        // The k largest (lower id first on ties), by insertion into a short sorted list.
        const int k = std::min(rows[r].top_k, vocab);
        std::vector<int32_t> best;
        auto better = [&](int32_t a, int32_t b) { return value(a) > value(b) || (value(a) == value(b) && a < b); };
        for (int t = 0; t < vocab && k > 0; ++t) {
            if (int(best.size()) == k && !better(t, best.back())) continue;
            auto at = std::upper_bound(best.begin(), best.end(), t, better);
            best.insert(at, t);
            if (int(best.size()) > k) best.pop_back();
        }
        for (int32_t t : best) s.top.emplace_back(t, logprob(t));
        out.push_back(std::move(s));
    }
}

}  // namespace osprey::model
