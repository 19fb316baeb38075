#include "model/batch_check.h"

#include "core/check.h"

namespace osprey::model {

void check_forward_batch(const ForwardBatch& batch, const Config& config, const KvLayout& layout, int dp_groups) {
    OSPREY_CHECK(!batch.slices.empty() && batch.n_tokens() > 0, "forward: empty batch");
    OSPREY_CHECK(layout.page_size() > 0, "forward: no KV cache (allocate_kv first)");
    int next = 0;
    for (size_t s = 0; s < batch.slices.size(); ++s) {
        const SequenceSlice& sl = batch.slices[s];
        OSPREY_CHECK(sl.first_token == next && sl.n_tokens > 0, "forward: slice ", s, " covers tokens [",
                     sl.first_token, ", +", sl.n_tokens, ") but the next token is ", next);
        next += sl.n_tokens;
        OSPREY_CHECK(next <= batch.n_tokens(), "forward: slice ", s, " runs past the ", batch.n_tokens(), " tokens");
        OSPREY_CHECK(sl.start_pos >= 0 && int64_t(sl.start_pos) + sl.n_tokens <= config.max_position,
                     "forward: slice ", s, " positions [", sl.start_pos, ", ", int64_t(sl.start_pos) + sl.n_tokens,
                     ") outside [0, ", config.max_position, ")");
        OSPREY_CHECK(sl.n_full_kv_cached >= 0 && sl.n_full_kv_cached <= sl.n_tokens, "forward: slice ", s,
                     " has n_full_kv_cached ", sl.n_full_kv_cached, " of ", sl.n_tokens, " tokens");
        OSPREY_CHECK(!sl.want_logits || (sl.n_logits >= 1 && sl.n_logits <= sl.n_tokens), "forward: slice ", s,
                     " wants logits for ", sl.n_logits, " of its ", sl.n_tokens, " tokens");
        OSPREY_CHECK(sl.window_slot >= 0 && sl.window_slot < layout.n_window_slots, "forward: slice ", s,
                     " window slot ", sl.window_slot, " outside [0, ", layout.n_window_slots,
                     ") (allocate_kv first)");
        OSPREY_CHECK(sl.window_first >= 0 && sl.window_first <= sl.start_pos, "forward: slice ", s,
                     " says its ring holds positions from ", sl.window_first, " but starts at ", sl.start_pos);
        OSPREY_CHECK(sl.dp_group >= 0 && sl.dp_group < dp_groups, "forward: slice ", s, " names data-parallel group ",
                     sl.dp_group, " outside [0, ", dp_groups, ")");
        const int64_t ps = layout.page_size();
        const int64_t needed = (int64_t(sl.start_pos) + sl.n_tokens + ps - 1) / ps;
        OSPREY_CHECK(int64_t(sl.pages.size()) >= needed, "forward: slice ", s, " has ", sl.pages.size(),
                     " pages, needs ", needed, " for ", sl.start_pos + sl.n_tokens, " positions");
        for (int32_t page : sl.pages)
            OSPREY_CHECK(page >= 0 && page < layout.n_pages, "forward: slice ", s, " page ", page, " outside [0, ",
                         layout.n_pages, ")");
    }
    OSPREY_CHECK(next == batch.n_tokens(), "forward: slices cover ", next, " of ", batch.n_tokens(), " tokens");
    for (size_t s = 0; s < batch.slices.size(); ++s)
        for (size_t r = s + 1; r < batch.slices.size(); ++r)
            OSPREY_CHECK(batch.slices[s].window_slot != batch.slices[r].window_slot ||
                             batch.slices[s].dp_group != batch.slices[r].dp_group,
                         "forward: slices ", s, " and ", r, " share window slot ", batch.slices[s].window_slot);
    for (int t = 0; t < batch.n_tokens(); ++t)
        OSPREY_CHECK(batch.tokens[t] >= 0 && batch.tokens[t] < config.vocab_size, "forward: token id ",
                     batch.tokens[t], " at index ", t, " outside the vocabulary [0, ", config.vocab_size, ")");
}

}  // namespace osprey::model
