// Continuous batching over a paged KV cache. Each step, schedule() picks the work of one forward
// pass within a token budget: decode tokens of running sequences first (highest priority, then
// oldest), then prefill chunks of running sequences, then admission of waiting sequences (a long
// prompt is split into chunks over several steps). While sequences decode, the prefill part of a
// step has a budget of its own (SchedulerOptions::max_mixed_prefill_tokens), so that prompts
// arriving under load do not stretch every decode step. When a running sequence needs a page and none
// is available, the lowest-priority, newest running sequence is preempted: its pages and window
// slot are released and it waits to be recomputed (its full pages usually stay in the prefix
// cache, so recomputation is mostly a cache hit). A waiting request of higher priority than running
// ones preempts the lowest-ranked of them when it would not fit otherwise. Pure bookkeeping:
// tests/engine/test_scheduler.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/sampling.h"
#include "engine/kv_cache_manager.h"
#include "engine/speculative.h"
#include "engine/step_plan.h"

namespace osprey::engine {

// Prefill chunks split by a token budget (with the mixed-prefill limit on) are multiples of this
// many tokens: whole 64-row tiles for the prefill kernels. Also the least a waiting prefill gets in
// a step (while the step budget exceeds the decodes), so no prefill starves behind decodes.
inline constexpr int kPrefillChunkAlign = 64;

struct SchedulerOptions {
    int max_num_seqs = 64;        // running sequences (each holds one window slot)
    int max_batch_tokens = 2048;  // tokens per step
    // Tokens before a prefix-cache hit's end that are recomputed (window K/V only) to refill the
    // window slot exactly: n_sliding_layers * (sliding_window - 1) (model/forward_batch.h).
    int window_replay = 127;
    // Pages kept free when admitting a new sequence while others run, so running sequences can
    // grow without immediately preempting.
    int admission_reserve_pages = 0;
    // Prefill tokens per step (prompt chunks, recomputes, prefix-hit replays) while at least
    // mixed_prefill_min_decodes sequences decode in it; 0: off, prefill takes whatever the decodes
    // leave of max_batch_tokens. A step with fewer decodes (none: low load, a burst of arrivals)
    // gives prefill the whole budget, so time to first token there is unchanged. >= 64 when on.
    // 512: on the H200, 20b prefills ~30k tokens/s, so 512 tokens add ~17 ms to a step, about one
    // decode step at batch 128 (16 ms at 8k context), where 2048 would add ~70 ms.
    int max_mixed_prefill_tokens = 512;
    int mixed_prefill_min_decodes = 1;
};

// An event for a request's stream, produced by commit() or abort().
struct SeqOutput {
    std::shared_ptr<RequestStream> stream;
    Event event;
};

struct SchedulerCounters {
    uint64_t n_prefill_tokens = 0;
    uint64_t n_decode_tokens = 0;
    uint64_t n_prefix_hit_tokens = 0;
    uint64_t n_forked_tokens = 0;    // prompt positions samples took from their leader by copy
    uint64_t n_window_restores = 0;  // prefix hits that restored a saved window ring instead of replaying
    uint64_t n_preemptions = 0;
    uint64_t n_finished = 0;
    uint64_t n_generated_tokens = 0;
    // Speculative decoding: verify chunks (decodes that carried a proposal), tokens proposed in
    // them, and proposals accepted. Mean accepted length = (verifies + accepted) / verifies.
    uint64_t n_spec_verifies = 0;
    uint64_t n_spec_draft_tokens = 0;
    uint64_t n_spec_accepted_tokens = 0;
};

class Scheduler {
public:
    Scheduler(const SchedulerOptions& options, KvCacheManager& kv);
    ~Scheduler();

    // Queues the samples of a new request (one sequence each; `params` per sample).
    void add_request(std::shared_ptr<const RequestInfo> request, const std::vector<int32_t>& prompt,
                     const std::vector<SamplingParams>& params);

    StepPlan schedule();

    // Speculative decoding (engine/speculative.h): decodes ask `proposer` for up to
    // options.num_tokens proposals each and schedule them as verify chunks; commit accepts a prefix
    // and rolls the sequence's KV back past the first rejection. The proposer outlives the scheduler.
    void set_speculation(Proposer* proposer, const SpeculativeOptions& options, int max_position);

    // After the forward pass: `samples` holds one result per chunk with want_logits, in chunk
    // order. Advances the sequences, offers their full pages to the prefix cache, appends the
    // sampled tokens and finishes sequences at a stop token or max_new_tokens.
    std::vector<SeqOutput> commit(const StepPlan& plan, std::span<const SampleResult> samples);

    // Ends every unfinished sample of a request (reason abort), or of all requests (abort or error).
    std::vector<SeqOutput> abort_request(uint64_t request_uid);
    std::vector<SeqOutput> finish_all(FinishReason reason, const std::string& error);

    // Preempts the running samples of a request (its stream is paused: RequestStream::set_paused);
    // returns how many. They wait, and are not readmitted while the stream stays paused.
    int preempt_request(uint64_t request_uid);
    // Unfinished sequences whose request is paused (schedule() skips them).
    int n_paused() const;

    bool idle() const { return waiting_.empty() && running_.empty(); }
    int n_waiting() const { return int(waiting_.size()); }
    int n_running() const { return int(running_.size()); }
    // Tokens of every live sequence (prompt and output so far), running or waiting: the KV this
    // scheduler's cache holds or will hold for them. What routing between DP groups balances.
    int64_t load_tokens() const;
    const SchedulerCounters& counters() const { return counters_; }
    const KvCacheManager& kv() const { return kv_; }

    // Every bookkeeping invariant: each page's references match the sequences holding it plus the
    // cache; running sequences hold one distinct window slot and exactly the pages their computed
    // and scheduled positions need; pages that are shared or cached are full and never written
    // again; waiting sequences hold nothing. Throws osprey::Error naming the broken one.
    void check_invariants() const;

private:
    int pages_for(int n_positions) const;
    void sort_queues();
    void preempt(Sequence* seq);
    SeqOutput finish(Sequence* seq, FinishReason reason, int32_t stop_token, const std::string& error);
    Sequence* leader_of(const Sequence& seq) const;    // null when none (or finished)
    bool waits_for_leader(const Sequence& seq) const;  // the leader has not reached the fork point
    bool has_followers(const Sequence& seq) const;     // samples still waiting to fork from seq
    void stop_following(Sequence& seq);                // seq no longer waits to fork (keeps counts)
    // n, or less so that a chunk of a leader with followers, starting at position `from`, stops
    // after n_prompt - 1 positions.
    int cap_at_fork_point(const Sequence& seq, int from, int n) const;
    // Admits `seq` as a fork of its leader if the leader is at the fork point now (plan gets the
    // copy and seq's one-token chunk); false when it is not, or there is no room.
    bool try_fork(StepPlan& plan, Sequence* seq, int reserve);
    void remove_finished();
    void add_chunk(StepPlan& plan, Sequence* seq, int n_tokens, int n_draft = 0);
    // Fills seq->draft for the decoding sequences in `decodes` (the proposer's batch).
    void propose(const std::vector<Sequence*>& decodes);
    // The proposals commit keeps of a verify chunk's sampled rows; fills `emit` with the tokens to
    // append (accepted proposals, then the target's own token) and returns how many were accepted.
    int accept(const ScheduledChunk& c, std::span<const SampleResult> rows, std::vector<const SampleResult*>& src,
               std::vector<int32_t>& emit) const;

    SchedulerOptions options_;
    KvCacheManager& kv_;
    std::unordered_map<uint64_t, std::unique_ptr<Sequence>> seqs_;  // every unfinished sequence by uid
    std::vector<Sequence*> waiting_;                                // sorted by (priority desc, uid) when scheduling
    std::vector<Sequence*> running_;
    std::vector<model::KvCopy> pending_copies_;  // window snapshots taken at commit, run before the next step
    uint64_t next_uid_ = 1;
    uint64_t step_ = 0;  // schedule() calls, to mark the sequences of the current step
    SchedulerCounters counters_;
    Proposer* proposer_ = nullptr;
    SpeculativeOptions spec_;
    SpecPolicy policy_{0.1, 0.01};  // set_speculation sets the options' own
    int max_position_ = 0;
};

}  // namespace osprey::engine
