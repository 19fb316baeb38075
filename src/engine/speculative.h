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

#include <climits>
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
    // Adaptive proposing (SpecPolicy below): propose only while what the batch's recent verifies
    // accepted pays for the verify tokens at this batch size, else probe within a small share of the
    // step. Off: every decode with a proposal verifies it (the forced test modes always do).
    bool adaptive = true;
    double verify_token_cost = 0.1;  // r: one more token in a step costs r one-token decode steps
    double probe_share = 0.01;       // epsilon: share of step time probes may take while proposing does not pay

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

// When proposing pays, batch-wide (deterministic; tests/engine/test_speculative.cpp).
//
// Cost model. A step of T tokens costs 1 + T r one-token decode steps: a fixed part (reading the
// weights, launches) and r per token (attention over its context, the experts it routes to that no
// other token needed, its share of the GEMMs). r = 0.1 is conservative for gpt-oss on the H200: a
// 5-token verify at batch 1 cost 1.43x a one-token step on 120b (r ~ 0.11, eager), and 20b's
// batch-64 decode step is ~4.2x its batch-1 step (r ~ 0.05). A step of B decoding sequences emits
// B tokens; adding proposals of n tokens whose expected accepted tokens are g per proposed token
// (the yield) turns it into (B + g n) tokens for 1 + (B + n) r, which is better iff
//     g > B r / (1 + B r)   (the break-even yield: 0.09 at B = 1, 0.44 at 8, 0.86 at 64),
// whatever n, so with one batch-wide yield estimate the step proposes for every sequence or for
// none. This is also rule (3) of issue 16: past the decode-bound regime (B r >> 1) verify tokens
// cost almost their full share of the step, and only a yield close to 1 pays for them.
//
// The yield is an exponential moving average of accepted / proposed over the batch's verifies,
// decaying per proposed token (memory ~kMemoryTokens), starting optimistic (one proposal's worth
// of fully accepted tokens) so that a new engine tries. While proposing does not pay, probes keep
// the estimate alive: an allowance of verify tokens grows by epsilon (1 + B r) / r per step (what
// costs epsilon of the step) and is spent by whole proposals, in the order of the sequences'
// last proposal, so at batch 64 one 4-token probe runs about every 5 steps (1% of the time).
class SpecPolicy {
public:
    static constexpr double kMemoryTokens = 64.0;
    SpecPolicy(double verify_token_cost, double probe_share);

    double yield() const { return accepted_ / proposed_; }
    double break_even(int n_decodes) const;
    bool pays(int n_decodes) const { return yield() > break_even(n_decodes); }
    // Verify tokens this step may carry (call once per step, before proposing): unlimited (INT_MAX)
    // when proposing pays at n_decodes, else the probe allowance (which grows by this call).
    int step_budget(int n_decodes, int k);
    // The verify tokens the step actually carries (taken from the allowance when it was probing).
    void spend(int n_tokens);
    // After a verify: tokens proposed and accepted.
    void observe(int n_proposed, int n_accepted);

private:
    double r_, epsilon_;
    double accepted_, proposed_;  // decayed sums (yield = accepted_ / proposed_)
    double allowance_ = 0.0;      // probe tokens available
    bool probing_ = false;        // the last step_budget was an allowance
};

// The n-gram back-off's pause, in output tokens, after `misses` (>= 2) verifies in a row that
// accepted nothing: p = 2^(misses - 2) capped at 64, jittered by the sequence id to [p - p/2, p + p/2)
// so that sequences which started together spread their probes over the steps.
int spec_backoff_pause(uint64_t seq_uid, int misses);

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
