// Helpers for engine tests: draining a stream, and the greedy oracle of the fake runner.
#pragma once

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "engine/engine.h"
#include "engine/speculative.h"
#include "fake_runner.h"

namespace osprey::test {

struct SampleOutcome {
    std::vector<int32_t> tokens;  // token events, in order
    std::vector<float> logprobs;  // their log-probabilities (collect() only; 0 unless requested)
    bool finished = false;
    engine::Event finish;
    std::vector<TokenScore> prompt_logprobs;  // collect() only: Event::prompt_logprobs, when sent
};

// Pops every queued event (non-blocking) into `out` (sized to the stream's samples).
inline void drain(engine::RequestStream& s, std::vector<SampleOutcome>& out) {
    if (out.size() < size_t(s.n_samples())) out.resize(size_t(s.n_samples()));
    while (auto e = s.try_pop()) {
        SampleOutcome& o = out[size_t(e->sample)];
        if (o.finished) throw Error("event after the finish event");
        if (e->kind == engine::Event::Kind::token) {
            o.tokens.push_back(e->token);
        } else {
            o.finished = true;
            o.finish = *e;
        }
    }
}

// Blocking: every event until the stream is done.
inline std::vector<SampleOutcome> collect(engine::RequestStream& s) {
    std::vector<SampleOutcome> out(size_t(s.n_samples()));
    while (!s.done()) {
        const engine::Event e = s.pop();
        SampleOutcome& o = out[size_t(e.sample)];
        if (!e.prompt_logprobs.empty()) o.prompt_logprobs = e.prompt_logprobs;
        if (e.kind == engine::Event::Kind::token) {
            o.tokens.push_back(e.token);
            o.logprobs.push_back(e.logprob);
        } else {
            o.finished = true;
            o.finish = e;
        }
    }
    return out;
}

// What greedy decoding on the fake model must produce for `prompt` (stop tokens excluded from
// the returned tokens; `stopped_by` gets the stop token or -1).
inline std::vector<int32_t> greedy_oracle(const std::vector<int32_t>& prompt, int max_new_tokens,
                                          const std::vector<int32_t>& stop_ids, int vocab_size, int window,
                                          int32_t* stopped_by = nullptr) {
    std::vector<int32_t> history = prompt, out;
    if (stopped_by) *stopped_by = -1;
    for (int i = 0; i < max_new_tokens; ++i) {
        const std::vector<float> l = FakeRunner::reference_logits(history, vocab_size, window);
        const int32_t t = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
        if (std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end()) {
            if (stopped_by) *stopped_by = t;
            break;
        }
        out.push_back(t);
        history.push_back(t);
    }
    return out;
}

// Proposes the fake model's greedy continuation, with an error planted at a pseudo-random index
// (or none), so verify steps accept every possible prefix length: an oracle that exercises
// acceptance and rollback far more than a real proposer does on hash logits.
class OracleProposer : public engine::Proposer {
public:
    OracleProposer(int vocab, int window) : vocab_(vocab), window_(window) {}
    std::string name() const override { return "oracle"; }
    void propose(std::span<engine::DraftRequest> requests) override {
        for (engine::DraftRequest& r : requests) {
            std::vector<int32_t> history(r.tokens.begin(), r.tokens.end());
            r.out->clear();
            const int wrong_at = int(rng_() % uint32_t(r.max_tokens + 2));  // past the end: none
            for (int i = 0; i < r.max_tokens; ++i) {
                const auto l = FakeRunner::reference_logits(history, vocab_, window_);
                int32_t t = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
                if (i == wrong_at) t = (t + 1) % (vocab_ - 1);
                r.out->push_back(t);
                history.push_back(t);
            }
        }
    }
    void forget(uint64_t) override { ++n_forgotten; }
    int n_forgotten = 0;

private:
    int vocab_, window_;
    std::mt19937 rng_{7};
};

}  // namespace osprey::test
