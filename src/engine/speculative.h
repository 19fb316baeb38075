// Speculative decoding: a proposer guesses up to k next tokens of a decoding sequence, the target
// model checks all of them in one forward (the sequence's slice carries the pending token and the
// k guesses, with a logit row for each: model::SequenceSlice::n_logits), the engine keeps the
// longest prefix the target agrees with plus one token of the target's own, and rolls the KV cache
// back past the first rejection. See docs/speculative.md.
//
// Exactness. Every proposer here is deterministic (n-gram lookup, a draft model decoding greedily),
// so its proposal distribution q is one-hot. The standard rule (accept a draft d with probability
// min(1, p(d)/q(d)), on rejection draw from the normalised max(0, p − q), draw the bonus token from
// p when all are accepted) then reduces to: draw x ~ p with the target's ordinary sampler and
// accept the draft iff x == d; on a mismatch x itself is the corrected token. The engine does
// exactly that, with the seeded draw of the row's own output index (SamplingState::step), so a
// sequence's tokens are the ones non-speculative decoding would draw with the same seed: greedy and
// seeded sampling give identical output with and without speculation, and every sampling parameter
// (penalties over the accepted prefix, logit bias, top-k/p, logprobs) applies unchanged.
// accept_draft() below is the general rule for a non-degenerate q (a sampling draft), tested for
// exactness by a chi-square test (tests/engine/test_speculative.cpp).
//
// Rollback. A verify step writes K/V for positions [p, p + k]; after accepting a drafts, positions
// [p, p + a] stay. Pages past the new end go back to the allocator (they are private and were never
// offered to the prefix cache, which only takes pages full of computed positions); the rings have
// k spare rows (model::KvSpec::with_ring_slack), so the rows of [p + a + 1 − window, p + a] are
// never overwritten by the rejected positions, and moving the ring's end back is all a rollback does.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace osprey::model {
class ModelRunner;
struct ForwardBatch;
}

namespace osprey::engine {

enum class SpecMethod { none, ngram, draft, eagle3 };
const char* spec_method_name(SpecMethod m);
SpecMethod parse_spec_method(const std::string& name);  // throws osprey::Error on an unknown name

class Proposer;

struct SpeculativeOptions {
    SpecMethod method = SpecMethod::none;
    int num_tokens = 4;  // k: tokens proposed per sequence and step (at most)
    // n-gram prompt lookup: the longest suffix of n tokens (ngram_max down to ngram_min) that
    // occurred earlier in the sequence proposes the tokens that followed its latest earlier match.
    int ngram_min = 1;
    int ngram_max = 4;
    // Measuring on random weights (not exact: the output is no longer the target's). Forced
    // acceptance: the first min(forced_accept_len, k) proposals are accepted whatever the target
    // says (the proposal is padded to k tokens when the proposer has fewer). Fraction: each
    // proposal is accepted with this probability (a deterministic hash), the first refusal ends it.
    int forced_accept_len = -1;           // < 0: off
    double forced_accept_fraction = -1.0;  // < 0: off
    // Draft model: its runner (a gpt-oss checkpoint, any size, same vocabulary), owned elsewhere.
    model::ModelRunner* draft_runner = nullptr;
    int draft_max_seqs = 64;  // sequences the draft's KV cache holds at once
    // EAGLE-3: the head's directory and the target layers whose hidden states feed it.
    std::string eagle3_dir;
    // A proposer of the caller's, used instead of the method's own (tests: an oracle that proposes
    // the target's continuation with planted errors). Its name labels the metrics.
    std::shared_ptr<Proposer> custom;

    bool enabled() const { return method != SpecMethod::none; }
    bool forced() const { return forced_accept_len >= 0 || forced_accept_fraction >= 0.0; }
    void validate() const;  // throws osprey::Error naming a bad option
};

// One decoding sequence's request for proposals.
struct DraftRequest {
    uint64_t seq_uid = 0;                // the engine's sequence id (a draft model keys its cache by it)
    std::span<const int32_t> tokens;     // prompt and output so far; the last one is not computed yet
    int n_prompt = 0;                    // tokens[0, n_prompt) is the prompt
    int max_tokens = 0;                  // propose at most this many (>= 1)
    std::vector<int32_t>* out = nullptr;  // gets the proposal (0 .. max_tokens tokens)
};

class Proposer {
public:
    virtual ~Proposer() = default;
    virtual std::string name() const = 0;  // "ngram", "draft", "eagle3": the metrics label
    // Fills every request's proposal (deterministic proposers only: q is one-hot).
    virtual void propose(std::span<DraftRequest> requests) = 0;
    // After verification: the sequence's tokens [0, n_valid) are final (later proposals rejected),
    // so a proposer with state (a draft model's KV) rolls back to them.
    virtual void accepted(uint64_t seq_uid, int n_valid) {
        (void)seq_uid;
        (void)n_valid;
    }
    // The sequence finished or was preempted: forget its state.
    virtual void forget(uint64_t seq_uid) { (void)seq_uid; }
    // EAGLE-3: a proposer that reads the target's hidden states sees every target forward, with the
    // sequence id of each slice (0: not a sequence of its), right after ModelRunner::forward.
    virtual bool observes_forwards() const { return false; }
    virtual void observe_forward(const model::ForwardBatch& batch, std::span<const uint64_t> slice_seq_uids,
                                 model::ModelRunner& target) {
        (void)batch;
        (void)slice_seq_uids;
        (void)target;
    }
};

// n-gram lookup over `tokens` (the proposal: up to max_tokens tokens). Exposed for tests.
std::vector<int32_t> ngram_propose(std::span<const int32_t> tokens, int ngram_min, int ngram_max, int max_tokens);

// The proposer of `options` (none for SpecMethod::none).
std::shared_ptr<Proposer> make_proposer(const SpeculativeOptions& options);

// The general acceptance rule for one proposed token d drawn from q, target distribution p (both
// probability vectors over the same vocabulary): accept with probability min(1, p(d)/q(d)); on
// rejection the corrected token is drawn from max(0, p − q) normalised. u_accept and u_resample
// are independent uniforms in [0, 1). Returns the token to emit; *accepted says whether it is d.
// With all k proposals accepted, the caller draws the bonus token from the target's next p.
int32_t accept_draft(std::span<const float> p, std::span<const float> q, int32_t d, double u_accept,
                     double u_resample, bool* accepted);

// The forced-acceptance test modes: accept the proposal at index i (0-based) of a verify whose
// sequence has seed `seed` and output index `step`?
bool forced_accept(const SpeculativeOptions& options, int i, uint64_t seed, uint64_t step);

}  // namespace osprey::engine
