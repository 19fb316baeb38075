// The engine: turns requests (token ids + sampling parameters) into streams of generated tokens,
// running one model backend (ModelRunner) from one engine thread. It owns admission, the scheduler
// (continuous batching, chunked prefill, preemption), the paged KV cache with prefix caching, and
// sampling. With attention data parallelism (ModelRunner::dp_groups() > 1) it keeps one KV cache
// manager and one scheduler per group, routes each request to a group on arrival (longest prefix
// hit, then least load: engine/dp_router.h) and runs every group's plan in one forward step. Tests:
// tests/engine/test_engine*.cpp (fake runner) and test_engine_cpu_reference.cpp.
//
// Use:
//   Engine engine(runner, EngineOptions{});
//   engine.start();                                  // the engine thread; or call step() yourself
//   auto stream = engine.submit(request);            // throws osprey::Error on a bad request
//   while (!stream->done()) { Event e = stream->pop(); ... }
//   stream->cancel();                                // any time, from any thread
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/request.h"
#include "engine/request_limits.h"
#include "engine/request_stream.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "model/runner.h"

namespace osprey::engine {

struct EngineOptions {
    int page_size = 32;                 // tokens per KV page of the full-attention layers (model/kv_spec.h bounds)
    double kv_memory_fraction = 0.9;    // share of ModelRunner::kv_budget_bytes() given to the KV cache
    int64_t max_kv_tokens = 0;          // > 0: cap the cache at this many tokens (tests, small hosts)
    int max_num_seqs = 64;              // running sequences at once (= window slots)
    int max_batch_tokens = 2048;        // tokens per forward step (prefill chunks + decodes)
    // Prefill tokens per step while at least mixed_prefill_min_decodes sequences decode (0: off, the
    // prefill takes what the decodes leave of max_batch_tokens); see SchedulerOptions.
    int max_mixed_prefill_tokens = 512;
    int mixed_prefill_min_decodes = 1;
    int max_model_len = 0;              // 0: the model's max_position (capped by what the cache holds)
    bool enable_prefix_caching = true;  // share full pages between requests with a common prefix
    // Extra window slots that keep rebuilt sliding-window rings of prefix-cache hits, so later hits
    // on the same prefix copy the ring instead of replaying (window_snapshots.h). Prefix caching only.
    int window_snapshots = 16;
    int max_top_logprobs = 20;      // largest SamplingParams::top_logprobs accepted
    int max_n = 16;                 // largest Request::n accepted
    int max_queued_requests = 0;    // > 0: submit() refuses new requests beyond this many live ones
    bool check_invariants = false;  // check every bookkeeping invariant after each step (tests)
    // A request paused by its consumer (RequestStream::set_paused: the client does not read) longer
    // than this is preempted: its pages and batch slot go to others until it is unpaused.
    double paused_release_s = 5.0;
    // Speculative decoding (engine/speculative.h, docs/speculative.md); method none: off. The rings
    // get num_tokens spare rows for the rollback.
    SpeculativeOptions speculative;
};

// With data parallelism (ModelRunner::dp_groups() > 1) the cache options hold per group: every
// group gets the cache they size (max_kv_tokens, max_num_seqs slots) and plans up to max_batch_tokens
// of its own per step, so a step's forward carries up to dp_groups · max_batch_tokens tokens.

// Counters for logs, /metrics and tests; a consistent snapshot taken between steps.
struct EngineStats {
    int n_waiting = 0;       // sequences waiting (new or preempted)
    int n_running = 0;       // sequences holding a window slot and pages
    int n_paused = 0;        // sequences (running or waiting) whose consumer paused them
    int n_pages = 0;         // pages in the KV cache (all groups)
    int n_free_pages = 0;    // pages with no reference
    int n_cached_pages = 0;  // pages indexed by the prefix cache (some may also be in use)
    int page_size = 0;
    int max_model_len = 0;
    int dp_groups = 1;               // data-parallel groups, each with its own cache of n_pages / dp_groups
    int64_t kv_capacity_tokens = 0;  // n_pages * page_size (summed over the groups)
    uint64_t n_steps = 0;
    uint64_t n_prefill_tokens = 0;  // tokens run through forward as prefill (replays included)
    uint64_t n_decode_tokens = 0;
    uint64_t n_prefix_hit_tokens = 0;
    uint64_t n_forked_tokens = 0;    // prompt positions n > 1 samples took from their first by copy
    uint64_t n_window_restores = 0;  // prefix hits that copied a saved window ring instead of replaying
    uint64_t n_preemptions = 0;
    uint64_t n_finished = 0;  // samples finished, any reason
    uint64_t n_generated_tokens = 0;
    // Speculative decoding (all zero when off): the proposer's name ("ngram", "draft", ...), verify
    // chunks, tokens proposed in them and proposals accepted.
    std::string spec_method;
    uint64_t n_spec_verifies = 0;
    uint64_t n_spec_draft_tokens = 0;
    uint64_t n_spec_accepted_tokens = 0;
};

// How the KV budget was split; logged at start-up. Sizes come from layout.spec (model/kv_spec.h).
struct KvPlan {
    model::KvLayout layout;
    int n_snapshot_slots = 0;  // window slots after the running sequences' ones, for saved rings
    // Bytes the sliding layers would need for the same token capacity if they were paged like the
    // full layers, minus what their window slots take: the saving of the window slots.
    int64_t window_saved_bytes = 0;
};
KvPlan plan_kv_cache(const model::ModelRunner& runner, const EngineOptions& options);

class Engine {
public:
    // Sizes and allocates the KV cache on `runner` (which must outlive the engine).
    Engine(model::ModelRunner& runner, EngineOptions options);
    ~Engine();  // stops the thread; unfinished requests end with reason abort
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Validates and queues a request; thread-safe. Throws osprey::Error naming the problem (empty
    // prompt, token id outside the vocabulary, prompt + max_new_tokens over max_model_len, bad
    // sampling parameter, ...). Nothing is truncated silently.
    std::shared_ptr<RequestStream> submit(Request request);
    // Cancels every live request with this id (same as RequestStream::cancel); false if none.
    bool cancel(const std::string& id);

    // Runs the step loop on a thread of the engine's own until stop() or destruction.
    void start();
    void stop();
    // Without start(): runs one step on the calling thread. Returns false when there was nothing
    // to do (no live request).
    bool step();
    // Without start(): steps until no request is live.
    void run_until_idle();

    EngineStats stats() const;
    int max_model_len() const { return max_model_len_; }
    const KvPlan& kv_plan() const { return kv_plan_; }  // of one data-parallel group (each has the same)
    int dp_groups() const { return int(schedulers_.size()); }
    const model::ModelRunner& runner() const { return runner_; }

private:
    void loop();
    bool step_once();  // one step; the caller holds step_mu_
    void publish(std::vector<SeqOutput>& outputs);
    void take_incoming();
    void apply_cancels();
    void release_paused();
    void update_stats();
    // Constrained decoding: clones each constrained sample's constraint on its first step, fills the
    // masks of this step's constrained rows (states[row].allowed), and after sampling advances them.
    void constrain_rows(std::span<const StepPlan> plans, std::vector<SamplingState>& states);
    void advance_constraints(std::span<SampleResult> results);
    int route(const std::vector<int32_t>& prompt) const;  // the DP group for a new request
    std::vector<SeqOutput> finish_all(FinishReason reason, const std::string& error);

    model::ModelRunner& runner_;
    const EngineOptions options_;
    KvPlan kv_plan_;
    int max_model_len_ = 0;
    RequestLimits limits_;

    // One per data-parallel group; touched only by the stepping thread (under step_mu_).
    std::vector<std::unique_ptr<KvCacheManager>> kv_;
    std::vector<std::unique_ptr<Scheduler>> schedulers_;
    std::vector<std::shared_ptr<Proposer>> proposers_;  // one per group (null: no speculation)
    std::mutex step_mu_;
    std::vector<std::shared_ptr<RequestStream>> active_;  // streams with unfinished samples (stepping thread)
    std::vector<std::pair<size_t, Sequence*>> constrained_;  // this step's constrained (row, sequence)
    std::vector<uint32_t> masks_;                            // [constrained_.size(), vocab words]

    // Wakes the engine thread; shared with the streams' cancel hooks so that a stream outliving
    // the engine never touches freed memory.
    struct Wakeup {
        std::mutex mu;
        std::condition_variable cv;
        bool wake = false;
        bool stop = false;
        void notify();
    };
    std::shared_ptr<Wakeup> wakeup_ = std::make_shared<Wakeup>();

    // Submissions and cancellations cross threads here.
    mutable std::mutex mu_;
    std::vector<std::pair<std::shared_ptr<RequestStream>, Request>> incoming_;
    std::vector<std::weak_ptr<RequestStream>> live_;  // for cancel(id); pruned on submit
    uint64_t next_uid_ = 1;
    int n_live_ = 0;     // submitted requests not yet finished
    EngineStats stats_;  // published after each step

    std::thread thread_;
    bool started_ = false;
    uint64_t n_steps_ = 0;
};

}  // namespace osprey::engine
