// The contract between the engine and a model backend: one forward step over a ragged batch.
//
// A step carries a flat list of tokens from several sequences (prefill chunks and single decode
// tokens together). The KV storage is the backend's, laid out by the KvSpec (model/kv_spec.h), and
// every slice says where its sequence's K/V is: the page table of the paged (full-attention)
// layers, the window slot of the ring (sliding-window) layers and which positions that ring holds.
// The engine decides all of it; the backend only follows.
#pragma once

#include <cstdint>
#include <vector>

namespace osprey::model {

struct SequenceSlice {
    int32_t first_token = 0;  // index of this slice's first token in ForwardBatch::tokens
    int32_t n_tokens = 0;     // tokens of this sequence in this step (a prefill chunk, or 1 to decode)
    int32_t start_pos = 0;    // position of the first token; positions [0, start_pos) are in the cache
    // Leading tokens of this slice whose full-layer K/V is already in the pages (a prefix-cache hit
    // replays them to refill the window slot): for them only window K/V is written. NOTE: a
    // sliding layer's K/V at position p depends on the sliding attention of every earlier layer
    // over [p - 127, p], so an exact refill replays n_sliding_layers * (sliding_window - 1) tokens
    // (the engine does; the first replayed tokens see a truncated window and are corrected by the
    // later ones). Any length from 0 to n_tokens is valid here.
    int32_t n_full_kv_cached = 0;
    int32_t window_slot = 0;       // sliding-window ring for this sequence
    // First position whose K/V the ring holds: it holds [window_first, start_pos) (the last
    // sliding_window of them), so attention on ring layers skips keys before it. start_pos when the
    // ring starts empty (a new sequence, or a prefix-cache replay refilling it); 0 for a sequence
    // that has run in this ring from its first position.
    int32_t window_first = 0;
    std::vector<int32_t> pages;    // page table covering positions [0, start_pos + n_tokens)
    bool want_logits = true;       // produce logits for the last n_logits tokens of the slice
    // With want_logits: how many trailing tokens of the slice get a logit row, in token order (1: the
    // last one only). A speculative verify step (engine/speculative.h) asks for 1 + k: the pending
    // token and the k proposed ones, so that every proposal can be checked against the target.
    int32_t n_logits = 1;
    // Data-parallel group whose KV cache (and ranks) this sequence uses, in [0, ModelRunner::dp_groups()).
    // Page and window-slot ids are that group's own: every group has the whole KvLayout.
    int32_t dp_group = 0;
    // Prompt scoring (model/prompt_scores.h), only where ModelRunner::supports_prompt_scoring():
    // empty, or [n_tokens] the token that follows each position (-1: not scored). The backend then
    // computes log p(target | the tokens up to that position) and the score_top_k most likely
    // tokens for every scored position (ModelRunner::take_prompt_scores).
    std::vector<int32_t> score_targets = {};  // (initialised: designated initialisers may leave it out)
    int32_t score_top_k = 0;

    int32_t logit_rows() const { return want_logits ? n_logits : 0; }
    // Index in ForwardBatch::tokens of the first token that gets a logit row.
    int32_t first_logit_token() const { return first_token + n_tokens - n_logits; }
};

struct ForwardBatch {
    std::vector<int32_t> tokens;         // [n_tokens] token ids, slices back to back
    std::vector<SequenceSlice> slices;   // in token order
    int n_tokens() const { return int(tokens.size()); }
    int n_logit_rows() const {
        int n = 0;
        for (const auto& s : slices) n += s.logit_rows();
        return n;
    }
};

}  // namespace osprey::model
