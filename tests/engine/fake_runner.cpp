// Deterministic fake backend (see fake_runner.h).
#include "fake_runner.h"

#include <algorithm>

#include "core/check.h"
#include "kernels/cpu/sampling.h"
#include "model/batch_check.h"

namespace osprey::test {

namespace {

uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// The hash both the cache read-back and the reference compute: every position's token from the
// full layers, then the window's last `sliding_window` positions again (as the sliding layers see them).
struct HistoryHash {
    uint64_t h = 0x1234;
    void full(int32_t pos, int32_t token) { h = mix(h ^ (uint64_t(uint32_t(token)) << 32 | uint32_t(pos))); }
    void window(int32_t pos, int32_t token) { h = mix(h + 0x5555 + (uint64_t(uint32_t(token)) << 32 | uint32_t(pos))); }
};

void fill_logits(uint64_t h, float* row, int vocab_size) {
    for (int v = 0; v < vocab_size; ++v) {
        const uint64_t r = mix(h ^ (uint64_t(v) * 0xD6E8FEB86659FD93ull));
        row[v] = float(double(r >> 11) * 0x1.0p-53 * 8.0 - 4.0);  // uniform in [-4, 4)
    }
}

}  // namespace

FakeRunner::FakeRunner(FakeRunnerOptions options) : options_(options) {
    config_.n_layers = 4;  // two sliding layers: prefix hits replay 2 * (window - 1) tokens
    config_.n_kv_heads = 1;
    config_.head_dim = 4;
    config_.vocab_size = options.vocab_size;
    config_.sliding_window = options.sliding_window;
    config_.max_position = options.max_position;
    config_.eos_token_id = options.vocab_size - 1;
    OSPREY_CHECK(options.dp_groups >= 1, "fake runner: ", options.dp_groups, " data-parallel groups");
    n_group_tokens_.assign(size_t(options.dp_groups), 0);
}

void FakeRunner::allocate_kv(const model::KvLayout& layout) {
    layout.check("fake runner");
    OSPREY_CHECK(layout.bytes() <= options_.kv_budget_bytes, "fake runner: KV layout needs ", layout.bytes(),
                 " bytes, budget is ", options_.kv_budget_bytes);
    layout_ = layout;
    pages_.assign(size_t(options_.dp_groups), std::vector<Row>(size_t(layout.n_pages) * size_t(layout.page_size())));
    window_.assign(size_t(options_.dp_groups),
                   std::vector<Row>(size_t(layout.n_window_slots) * size_t(layout.spec.ring().rows_per_block)));
}

void FakeRunner::copy_kv(const model::KvCopyPlan& plan) {
    model::check_kv_copy_plan(plan, layout_, options_.dp_groups);
    for (const model::KvRowRun& r : plan.runs) {
        const size_t g = size_t(plan.dp_group);
        std::vector<Row>& rows = r.group == model::KvGroupKind::ring ? window_[g] : pages_[g];
        std::copy_n(rows.begin() + r.src, r.n, rows.begin() + r.dst);
    }
}

std::vector<float> FakeRunner::reference_logits(std::span<const int32_t> history, int vocab_size, int sliding_window) {
    HistoryHash hh;
    const int n = int(history.size());
    for (int p = 0; p < n; ++p) hh.full(p, history[size_t(p)]);
    for (int p = std::max(0, n - sliding_window); p < n; ++p) hh.window(p, history[size_t(p)]);
    std::vector<float> logits(static_cast<size_t>(vocab_size));
    fill_logits(hh.h, logits.data(), vocab_size);
    return logits;
}

void FakeRunner::forward(const model::ForwardBatch& batch) {
    if (fail_next_forward) {
        fail_next_forward = false;
        OSPREY_FAIL("fake runner: injected failure");
    }
    const int ps = layout_.page_size(), w = config_.sliding_window, vocab = config_.vocab_size;
    const int ring_rows = layout_.spec.ring().rows_per_block;  // w plus the speculative slack
    OSPREY_CHECK(ps > 0, "fake runner: forward before allocate_kv");
    ++n_forward_;
    n_tokens_ += batch.n_tokens();
    max_batch_ = std::max(max_batch_, batch.n_tokens());
    logits_.assign(size_t(batch.n_logit_rows()) * size_t(vocab), 0.0f);
    std::vector<std::pair<int, int>> slots_seen;  // (group, slot)
    int32_t next_first = 0;
    int row = 0;
    for (const model::SequenceSlice& s : batch.slices) {
        OSPREY_CHECK(s.first_token == next_first && s.n_tokens > 0, "fake runner: slices are not back to back");
        next_first += s.n_tokens;
        OSPREY_CHECK(next_first <= batch.n_tokens(), "fake runner: slice past the batch's tokens");
        OSPREY_CHECK(s.window_slot >= 0 && s.window_slot < layout_.n_window_slots, "fake runner: window slot ",
                     s.window_slot, " out of range");
        OSPREY_CHECK(s.dp_group >= 0 && s.dp_group < options_.dp_groups, "fake runner: group ", s.dp_group);
        const std::pair<int, int> slot_id{s.dp_group, s.window_slot};
        OSPREY_CHECK(std::find(slots_seen.begin(), slots_seen.end(), slot_id) == slots_seen.end(),
                     "fake runner: window slot ", s.window_slot, " used twice in one batch");
        slots_seen.push_back(slot_id);
        n_group_tokens_[size_t(s.dp_group)] += s.n_tokens;
        std::vector<Row>& pages = pages_[size_t(s.dp_group)];
        const int end = s.start_pos + s.n_tokens;
        OSPREY_CHECK(int64_t(s.pages.size()) * ps >= end, "fake runner: page table of ", s.pages.size(),
                     " pages does not cover position ", end - 1);
        OSPREY_CHECK(s.n_full_kv_cached >= 0 && s.n_full_kv_cached <= s.n_tokens, "fake runner: bad n_full_kv_cached");
        OSPREY_CHECK(s.window_first >= 0 && s.window_first <= s.start_pos, "fake runner: ring starts at ",
                     s.window_first, " after the slice's start ", s.start_pos);
        for (int32_t p : s.pages) OSPREY_CHECK(p >= 0 && p < layout_.n_pages, "fake runner: page ", p, " out of range");
        Row* slot = window_[size_t(s.dp_group)].data() + size_t(s.window_slot) * size_t(ring_rows);
        for (int j = 0; j < s.n_tokens; ++j) {
            const int pos = s.start_pos + j;
            const int32_t token = batch.tokens[size_t(s.first_token + j)];
            Row& page_row = pages[size_t(s.pages[size_t(pos / ps)]) * size_t(ps) + size_t(pos % ps)];
            if (j < s.n_full_kv_cached) {
                OSPREY_CHECK(page_row.pos == pos && page_row.token == token, "fake runner: position ", pos,
                             " claimed cached holds (token ", page_row.token, ", pos ", page_row.pos, ")");
                ++n_window_only_;
            } else {
                page_row = Row{token, pos};
            }
            slot[pos % ring_rows] = Row{token, pos};
        }
        if (!s.want_logits) continue;
        OSPREY_CHECK(s.n_logits >= 1 && s.n_logits <= s.n_tokens, "fake runner: ", s.n_logits, " logit rows for ",
                     s.n_tokens, " tokens");
        // Read the history back the way attention would: full layers through the page table,
        // sliding layers through the ring (every logit row of a verify slice sees its own prefix).
        for (int last = end - s.n_logits; last < end; ++last) {
        HistoryHash hh;
        for (int p = 0; p <= last; ++p) {
            const Row& r = pages[size_t(s.pages[size_t(p / ps)]) * size_t(ps) + size_t(p % ps)];
            OSPREY_CHECK(r.pos == p, "fake runner: page row of position ", p, " holds position ", r.pos);
            hh.full(p, r.token);
        }
        for (int p = std::max(0, last - w + 1); p <= last; ++p) {
            // The engine says which positions the ring holds: a position it has not said is there
            // must not be needed (a replay is long enough to refill the whole window first).
            OSPREY_CHECK(p >= s.window_first, "fake runner: position ", p, " is in the window but the ring holds only ",
                         s.window_first, " and later");
            const Row& r = slot[p % ring_rows];
            OSPREY_CHECK(r.pos == p, "fake runner: window row of position ", p, " holds position ", r.pos);
            hh.window(p, r.token);
        }
        fill_logits(hh.h, logits_.data() + size_t(row) * size_t(vocab), vocab);
        ++row;
        }
    }
    OSPREY_CHECK(next_first == batch.n_tokens(), "fake runner: tokens not covered by slices");
}

void FakeRunner::sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                        std::span<SampleResult> out) {
    cpu::sample_rows(logits_, config_.vocab_size, params, state, out);
}

}  // namespace osprey::test
