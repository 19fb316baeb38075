// Prompt scoring (the log-probability of each prompt token given the ones before it, as
// lm-evaluation-harness's loglikelihood needs), shared by the backends: which rows of a forward
// batch are scored (SequenceSlice::score_targets), and the scores of those rows' logits. A backend
// computes the logits of the scored rows (the final norm and unembedding of those positions) and
// hands them here; scoring is a rare, prefill-only path, so it is done on the host, in double.
// Tests: tests/model/test_prompt_scores.cpp.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/sampling.h"
#include "model/forward_batch.h"

namespace osprey::model {

struct ScoredRow {
    int32_t row = 0;     // index into ForwardBatch::tokens (the position whose logits are scored)
    int32_t target = 0;  // the token that follows it
    int32_t top_k = 0;   // alternatives to report
};

// The scored rows of `batch`, in slice order (positions with score_targets[i] >= 0). Throws
// osprey::Error on a malformed request (score_targets of the wrong size, a target outside the
// vocabulary, top_k outside [0, 20]).
std::vector<ScoredRow> scored_rows(const ForwardBatch& batch, int vocab_size);

// Appends one TokenScore per row of `logits` [rows.size(), vocab] fp32 (log-softmax of the row: the
// target's log-probability and rank, the top_k most likely tokens, ties to the lower id).
void score_logit_rows(std::span<const float> logits, int vocab, std::span<const ScoredRow> rows,
                      std::vector<TokenScore>& out);

}  // namespace osprey::model
