// The contract between the engine and a model backend: one forward step over a ragged batch.
//
// A step carries a flat list of tokens from several sequences (prefill chunks and single decode
// tokens together). KV storage belongs to the backend (ModelRunner::allocate_kv) and is addressed
// by the engine's bookkeeping:
//   - full-attention layers (odd layers) keep K/V in fixed-size pages of `page_size` tokens; a
//     sequence's page table lists its pages in position order (position p lives in
//     pages[p / page_size], row p % page_size);
//   - sliding-window layers (even layers) only ever need the last `sliding_window` (128) positions,
//     so each running sequence owns one window slot, a ring of 128 rows indexed by p % 128.
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
    std::vector<int32_t> pages;    // page table covering positions [0, start_pos + n_tokens)
    bool want_logits = true;       // produce logits for the last token of the slice
};

struct ForwardBatch {
    std::vector<int32_t> tokens;         // [n_tokens] token ids, slices back to back
    std::vector<SequenceSlice> slices;   // in token order
    int n_tokens() const { return int(tokens.size()); }
    int n_logit_rows() const {
        int n = 0;
        for (const auto& s : slices) n += s.want_logits ? 1 : 0;
        return n;
    }
};

}  // namespace osprey::model
