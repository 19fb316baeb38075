// What one engine step runs, as decided by Scheduler::schedule(): plain data, no device memory.
// The engine turns it into a model::ForwardBatch (engine/batch_builder.h).
#pragma once

#include <vector>

#include "engine/sequence.h"
#include "model/kv_spec.h"

namespace osprey::engine {

struct ScheduledChunk {
    Sequence* seq = nullptr;
    int start_pos = 0;         // first position computed (== seq->n_computed)
    int n_tokens = 0;          // tokens of seq->tokens from start_pos: a prefill chunk, or 1 to decode
    // Speculative verify: the last n_draft of the n_tokens are seq->draft (after the one pending token),
    // and each of the 1 + n_draft tokens gets a logit row. 0 otherwise.
    int n_draft = 0;
    int n_full_kv_cached = 0;  // leading tokens whose full-layer K/V is already in the pages (replay)
    int window_first = 0;      // first position the sequence's ring holds (KvCacheManager::ring)
    bool want_logits = false;  // the chunk ends at the last known token: a new token is sampled
};

struct StepPlan {
    std::vector<ScheduledChunk> chunks;  // decodes first, then prefill chunks
    // K/V copies to run before the forward: samples forked from their leader's prompt state.
    std::vector<model::KvCopy> copies;
    int n_preempted = 0;  // sequences preempted while planning this step
    int dp_group = 0;     // the data-parallel group whose scheduler planned it (its cache's ids)
    int n_tokens() const {
        int n = 0;
        for (const auto& c : chunks) n += c.n_tokens;
        return n;
    }
    int n_logit_rows() const {
        int n = 0;
        for (const auto& c : chunks) n += c.want_logits ? 1 + c.n_draft : 0;
        return n;
    }
    bool empty() const { return chunks.empty(); }
};

}  // namespace osprey::engine
