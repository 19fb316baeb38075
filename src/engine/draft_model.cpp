// Draft-model proposer (see draft_model.h). The draft keeps a KV cache of its own on its runner:
// one ring (with k spare rows, like the target's) and a page list per sequence, keyed by the
// engine's sequence id. Each step it catches up on the tokens the target accepted since (chunked
// prefill, several sequences per forward), then decodes k - 1 more positions greedily, all
// sequences in one forward per position. The tokens its cache holds are remembered, so the next
// call rolls back to the longest prefix that still matches (the accepted proposals), exactly as
// the target's cache does. Greedy drafting makes q one-hot: the engine's acceptance is exact.
#include "engine/draft_model.h"

#include <algorithm>
#include <unordered_map>

#include "core/check.h"
#include "core/log.h"
#include "model/runner.h"

namespace osprey::engine {

namespace {

class DraftModelProposer : public Proposer {
public:
    explicit DraftModelProposer(const SpeculativeOptions& o) : runner_(*o.draft_runner), k_(o.num_tokens) {
        const int page_size = 32;
        model::KvSpec spec = runner_.kv_spec(page_size).with_ring_slack(k_);
        const int n_slots = std::max(1, o.draft_max_seqs);
        const double budget = double(runner_.kv_budget_bytes()) * 0.9 - double(spec.bytes_per_window_slot()) * n_slots;
        OSPREY_CHECK(budget >= double(spec.bytes_per_page()) * 4, "draft model: its KV budget cannot hold ", n_slots,
                     " window slots and a few pages; lower --max-num-seqs");
        const int n_pages = int(std::min<double>(budget / double(spec.bytes_per_page()), 1 << 30));
        layout_.spec = spec;
        layout_.n_pages = n_pages;
        layout_.n_window_slots = n_slots;
        runner_.allocate_kv(layout_);
        for (int p = n_pages - 1; p >= 0; --p) free_pages_.push_back(p);
        for (int s = n_slots - 1; s >= 0; --s) free_slots_.push_back(s);
        log::info("draft model: ", runner_.name(), ", KV cache of ", n_pages, " pages x ", page_size, " tokens, ",
                  n_slots, " sequences");
    }

    std::string name() const override { return "draft"; }

    void forget(uint64_t uid) override {
        auto it = seqs_.find(uid);
        if (it == seqs_.end()) return;
        release(it->second);
        seqs_.erase(it);
    }

    void propose(std::span<DraftRequest> requests) override {
        const int max_pos = runner_.config().max_position;
        // Per request: its state, rolled back to the tokens that still match.
        struct Work {
            DraftRequest* r;
            State* st;
            int n_target;  // tokens of the request
            int want;      // proposals still to make
        };
        std::vector<Work> work;
        for (DraftRequest& r : requests) {
            r.out->clear();
            auto it = seqs_.find(r.seq_uid);
            if (it == seqs_.end()) {
                if (free_slots_.empty()) continue;  // the draft cache is full: no proposal for this one
                State st;
                st.slot = free_slots_.back();
                free_slots_.pop_back();
                it = seqs_.emplace(r.seq_uid, std::move(st)).first;
            }
            State& st = it->second;
            const int n = int(r.tokens.size());
            int common = 0;
            const int limit = std::min(st.n_computed, n);
            while (common < limit && st.tokens[size_t(common)] == r.tokens[size_t(common)]) ++common;
            st.n_computed = common;  // rollback: later rows are garbage, overwritten before read
            st.tokens.assign(r.tokens.begin(), r.tokens.end());
            const int want = std::min(r.max_tokens, max_pos - n - 1);
            // Pages for every position this call writes: [0, n + want - 1).
            if (want <= 0 || !grow(st, n + want - 1)) {
                if (want > 0) forget(r.seq_uid);
                continue;
            }
            work.push_back({&r, &st, n, want});
        }
        if (work.empty()) return;

        // 1. Catch up: every sequence's uncomputed tokens, in chunks; the last chunk's logits give
        //    the first proposal.
        const int budget = 2048;
        for (;;) {
            model::ForwardBatch batch;
            std::vector<Work*> rows;
            int used = 0;
            for (Work& w : work) {
                State& st = *w.st;
                const int left = w.n_target - st.n_computed;
                if (left <= 0 || used >= budget) continue;
                const int n = std::min(left, budget - used);
                add_slice(batch, st, st.n_computed, n, n == left);
                if (n == left) rows.push_back(&w);
                used += n;
            }
            if (batch.slices.empty()) break;
            runner_.forward(batch);
            advance(batch, work);
            sample_into(rows);
        }
        // 2. Greedy decodes: one position per forward for every sequence that wants more.
        for (int j = 1; j < k_; ++j) {
            model::ForwardBatch batch;
            std::vector<Work*> rows;
            for (Work& w : work) {
                if (int(w.r->out->size()) >= w.want || w.r->out->empty()) continue;
                State& st = *w.st;
                st.tokens.push_back(w.r->out->back());
                add_slice(batch, st, st.n_computed, 1, true);
                rows.push_back(&w);
            }
            if (batch.slices.empty()) break;
            runner_.forward(batch);
            advance(batch, work);
            sample_into(rows);
        }
    }

private:
    struct State {
        int slot = -1;
        std::vector<int32_t> pages;
        std::vector<int32_t> tokens;  // the tokens whose K/V positions [0, n_computed) hold
        int n_computed = 0;
    };

    bool grow(State& st, int n_positions) {
        const int need = (n_positions + layout_.page_size() - 1) / layout_.page_size();
        while (int(st.pages.size()) < need) {
            if (free_pages_.empty()) return false;
            st.pages.push_back(free_pages_.back());
            free_pages_.pop_back();
        }
        return true;
    }

    void release(State& st) {
        free_pages_.insert(free_pages_.end(), st.pages.rbegin(), st.pages.rend());
        st.pages.clear();
        if (st.slot >= 0) free_slots_.push_back(st.slot);
        st.slot = -1;
    }

    void add_slice(model::ForwardBatch& batch, const State& st, int start, int n, bool logits) {
        model::SequenceSlice sl;
        sl.first_token = int32_t(batch.tokens.size());
        sl.n_tokens = n;
        sl.start_pos = start;
        sl.window_slot = st.slot;
        sl.window_first = 0;  // every sequence runs in its ring from position 0
        sl.pages = st.pages;
        sl.want_logits = logits;
        batch.tokens.insert(batch.tokens.end(), st.tokens.begin() + start, st.tokens.begin() + start + n);
        batch.slices.push_back(std::move(sl));
    }

    // Marks the batch's positions computed (slices are in `work` order, a subset of it).
    template <typename W>
    void advance(const model::ForwardBatch& batch, std::vector<W>& work) {
        size_t s = 0;
        for (W& w : work) {
            if (s == batch.slices.size()) break;
            const model::SequenceSlice& sl = batch.slices[s];
            if (sl.window_slot != w.st->slot) continue;
            w.st->n_computed = sl.start_pos + sl.n_tokens;
            ++s;
        }
    }

    template <typename W>
    void sample_into(const std::vector<W*>& rows) {
        if (rows.empty()) return;
        std::vector<SamplingParams> params(rows.size());  // greedy (temperature 0)
        for (auto& p : params) p.temperature = 0.0f;
        std::vector<SamplingState> states(rows.size());
        for (size_t i = 0; i < rows.size(); ++i) {
            const W& w = *rows[i];
            // The output index of the token this row proposes (what a seeded or scripted sampler keys on).
            states[i].prompt_tokens = w.r->tokens.data();
            states[i].n_prompt_tokens = w.r->n_prompt;
            states[i].step = uint64_t(w.n_target - w.r->n_prompt + int(w.r->out->size()));
        }
        std::vector<SampleResult> out(rows.size());
        runner_.sample(params, states, out);
        for (size_t i = 0; i < rows.size(); ++i) rows[i]->r->out->push_back(out[i].token);
    }

    model::ModelRunner& runner_;
    int k_;
    model::KvLayout layout_;
    std::vector<int32_t> free_pages_;
    std::vector<int> free_slots_;
    std::unordered_map<uint64_t, State> seqs_;
};

}  // namespace

std::unique_ptr<Proposer> make_draft_model_proposer(const SpeculativeOptions& options) {
    OSPREY_CHECK(options.draft_runner != nullptr, "--speculative draft needs a draft model");
    return std::make_unique<DraftModelProposer>(options);
}

}  // namespace osprey::engine
