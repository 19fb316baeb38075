// EAGLE-3 proposer (see eagle3_proposer.h). Per sequence it keeps the target's hidden states of
// positions the head has not consumed yet, and the head's own K/V for positions [first, end) that
// it computed from target hidden states. Each proposal first catches up on the newly verified
// positions, then drafts k tokens from its own hiddens; those speculative positions are dropped
// afterwards, and a later call rolls back to the prefix of tokens that still matches.
#include "backends/eagle3_proposer.h"

#include <map>
#include <unordered_map>

#include "core/check.h"
#include "core/log.h"
#include "model/eagle3.h"
#include "model/forward_batch.h"

namespace osprey::backends {

namespace {

class Eagle3Proposer : public engine::Proposer {
public:
    Eagle3Proposer(const std::filesystem::path& dir, model::ModelRunner& target, const TensorView* embedding)
        : head_(dir, embedding) {
        const model::Eagle3Config& c = head_.config();
        OSPREY_CHECK(c.vocab == target.config().vocab_size && c.target_hidden == target.config().d_model,
                     "EAGLE-3 head ", dir.string(), " is for vocabulary ", c.vocab, " and hidden ", c.target_hidden,
                     ", the target has ", target.config().vocab_size, " and ", target.config().d_model);
        target.set_capture_layers(c.aux_layers);
        width_ = 3 * size_t(c.target_hidden);
        log::info("EAGLE-3 head ", dir.string(), ": hidden ", c.hidden, ", draft vocabulary ", c.draft_vocab,
                  ", target layers ", c.aux_layers[0], ", ", c.aux_layers[1], ", ", c.aux_layers[2]);
    }

    std::string name() const override { return "eagle3"; }
    bool observes_forwards() const override { return true; }
    void forget(uint64_t uid) override { seqs_.erase(uid); }

    void observe_forward(const model::ForwardBatch& batch, std::span<const uint64_t> uids,
                         model::ModelRunner& target) override {
        target.captured_to_host(captured_);
        OSPREY_CHECK(captured_.size() == size_t(batch.n_tokens()) * width_, "EAGLE-3: the target captured ",
                     captured_.size(), " values for ", batch.n_tokens(), " tokens");
        for (size_t s = 0; s < batch.slices.size() && s < uids.size(); ++s) {
            const model::SequenceSlice& sl = batch.slices[s];
            Seq& st = seqs_[uids[s]];
            for (int i = 0; i < sl.n_tokens; ++i) {
                const float* row = captured_.data() + size_t(sl.first_token + i) * width_;
                st.hidden[sl.start_pos + i].assign(row, row + width_);
            }
        }
    }

    void propose(std::span<engine::DraftRequest> requests) override {
        std::vector<float> aux, g, out, hid;
        std::vector<int32_t> next, pred;
        const int H = head_.config().hidden;
        for (engine::DraftRequest& r : requests) {
            r.out->clear();
            auto it = seqs_.find(r.seq_uid);
            if (it == seqs_.end()) continue;
            Seq& st = it->second;
            const int n = int(r.tokens.size());
            // Roll back: draft position p is valid while tokens [0, p + 1] are unchanged.
            int common = 0;
            const int limit = std::min(int(st.tokens.size()), n);
            while (common < limit && st.tokens[size_t(common)] == r.tokens[size_t(common)]) ++common;
            st.cache.truncate(common - 1);
            st.tokens.assign(r.tokens.begin(), r.tokens.end());
            // Catch up on [cache.end(), n - 1) from the target's hidden states; where some are
            // missing (positions from a prefix-cache hit), the head starts after them.
            int from = st.cache.end();
            for (int p = n - 2; p >= from; --p)
                if (!st.hidden.count(p)) {
                    st.cache.reset(p + 1);
                    from = p + 1;
                    break;
                }
            const int m = n - 1 - from;
            if (m <= 0) continue;  // nothing new to condition on (should not happen after a step)
            aux.resize(size_t(m) * width_);
            next.resize(size_t(m));
            for (int i = 0; i < m; ++i) {
                const std::vector<float>& h = st.hidden.at(from + i);
                std::copy(h.begin(), h.end(), aux.begin() + ptrdiff_t(size_t(i) * width_));
                next[size_t(i)] = r.tokens[size_t(from + i + 1)];
            }
            head_.project(aux, m, g);
            head_.step(st.cache, next, g, out, pred);
            st.hidden.erase(st.hidden.begin(), st.hidden.lower_bound(n - 1));  // consumed
            const int valid_end = st.cache.end();
            r.out->push_back(pred.back());
            hid.assign(out.end() - H, out.end());
            // Draft further from the head's own hidden states (speculative positions, dropped after).
            while (int(r.out->size()) < r.max_tokens) {
                const int32_t tok = r.out->back();
                head_.step(st.cache, std::span(&tok, 1), hid, out, pred);
                r.out->push_back(pred[0]);
                hid = out;
            }
            st.cache.truncate(valid_end);
        }
    }

private:
    struct Seq {
        std::vector<int32_t> tokens;
        std::map<int, std::vector<float>> hidden;  // target hidden states by position, not yet consumed
        model::Eagle3Cache cache;
    };
    model::Eagle3Head head_;
    size_t width_ = 0;
    std::vector<float> captured_;
    std::unordered_map<uint64_t, Seq> seqs_;
};

}  // namespace

std::shared_ptr<engine::Proposer> make_eagle3_proposer(const std::filesystem::path& head_dir,
                                                       model::ModelRunner& target, const TensorView* embedding) {
    return std::make_shared<Eagle3Proposer>(head_dir, target, embedding);
}

}  // namespace osprey::backends
