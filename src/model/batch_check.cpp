#include "model/batch_check.h"

#include "core/check.h"

namespace osprey::model {

void check_forward_batch(const ForwardBatch& batch, const Config& config, const KvLayout& layout) {
    OSPREY_CHECK(!batch.slices.empty() && batch.n_tokens() > 0, "forward: empty batch");
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
        OSPREY_CHECK(sl.window_slot >= 0 && sl.window_slot < layout.n_window_slots, "forward: slice ", s,
                     " window slot ", sl.window_slot, " outside [0, ", layout.n_window_slots,
                     ") (allocate_kv first)");
        const int64_t needed = (int64_t(sl.start_pos) + sl.n_tokens + layout.page_size - 1) / layout.page_size;
        OSPREY_CHECK(int64_t(sl.pages.size()) >= needed, "forward: slice ", s, " has ", sl.pages.size(),
                     " pages, needs ", needed, " for ", sl.start_pos + sl.n_tokens, " positions");
        for (int32_t page : sl.pages)
            OSPREY_CHECK(page >= 0 && page < layout.n_pages, "forward: slice ", s, " page ", page, " outside [0, ",
                         layout.n_pages, ")");
    }
    OSPREY_CHECK(next == batch.n_tokens(), "forward: slices cover ", next, " of ", batch.n_tokens(), " tokens");
    for (size_t s = 0; s < batch.slices.size(); ++s)
        for (size_t r = s + 1; r < batch.slices.size(); ++r)
            OSPREY_CHECK(batch.slices[s].window_slot != batch.slices[r].window_slot, "forward: slices ", s, " and ", r,
                         " share window slot ", batch.slices[s].window_slot);
    for (int t = 0; t < batch.n_tokens(); ++t)
        OSPREY_CHECK(batch.tokens[t] >= 0 && batch.tokens[t] < config.vocab_size, "forward: token id ",
                     batch.tokens[t], " at index ", t, " outside the vocabulary [0, ", config.vocab_size, ")");
}

std::vector<KvRowRun> plan_kv_copy(const KvCopy& copy, const KvLayout& layout, int sliding_window) {
    OSPREY_CHECK(copy.src_pages.size() == copy.dst_pages.size(), "copy_kv: ", copy.src_pages.size(),
                 " source pages but ", copy.dst_pages.size(), " destination pages");
    OSPREY_CHECK((copy.src_slot < 0) == (copy.dst_slot < 0), "copy_kv: window slots ", copy.src_slot, " -> ",
                 copy.dst_slot, ": give both or neither");
    if (copy.src_slot >= 0) {
        OSPREY_CHECK(copy.src_slot < layout.n_window_slots && copy.dst_slot < layout.n_window_slots,
                     "copy_kv: window slots ", copy.src_slot, " -> ", copy.dst_slot, " outside [0, ",
                     layout.n_window_slots, ")");
        OSPREY_CHECK(copy.src_slot != copy.dst_slot, "copy_kv: window slot ", copy.src_slot, " copied onto itself");
    }
    std::vector<uint8_t> role(size_t(layout.n_pages), 0);  // 1: source, 2: destination
    for (size_t i = 0; i < copy.src_pages.size(); ++i) {
        const int32_t s = copy.src_pages[i], d = copy.dst_pages[i];
        OSPREY_CHECK(s >= 0 && s < layout.n_pages && d >= 0 && d < layout.n_pages, "copy_kv: page ", s, " -> ", d,
                     " outside [0, ", layout.n_pages, ")");
        role[size_t(s)] = 1;
    }
    for (int32_t d : copy.dst_pages) {
        OSPREY_CHECK(role[size_t(d)] == 0, "copy_kv: page ", d,
                     role[size_t(d)] == 1 ? " is both a source and a destination" : " is a destination twice");
        role[size_t(d)] = 2;
    }
    const int64_t ps = layout.page_size;
    std::vector<KvRowRun> runs;
    for (size_t i = 0; i < copy.src_pages.size(); ++i) {
        const int64_t s = copy.src_pages[i] * ps, d = copy.dst_pages[i] * ps;
        if (!runs.empty() && runs.back().src + runs.back().n == s && runs.back().dst + runs.back().n == d)
            runs.back().n += ps;
        else
            runs.push_back({false, s, d, ps});
    }
    if (copy.src_slot >= 0)
        runs.push_back(
            {true, int64_t(copy.src_slot) * sliding_window, int64_t(copy.dst_slot) * sliding_window, sliding_window});
    return runs;
}

}  // namespace osprey::model
