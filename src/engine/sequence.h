// One sample of a request as the scheduler tracks it: its tokens, how far its KV is computed, the
// pages and window slot it holds. A request with n samples becomes n sequences.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/sampling.h"
#include "engine/page_allocator.h"
#include "engine/request_stream.h"
#include "engine/token_constraint.h"

namespace osprey::engine {

enum class SeqStatus { waiting, running, finished };

// What all samples of one request share (immutable after submission).
struct RequestInfo {
    uint64_t uid = 0;                       // engine-wide, in submission order
    std::shared_ptr<RequestStream> stream;  // where events go
    std::vector<int32_t> stop_token_ids;
    int max_new_tokens = 0;
    int priority = 0;
    int n_prompt = 0;
    std::shared_ptr<const TokenConstraint> constraint;  // each sample clones it (Sequence::constraint)
    int min_tokens = 0;        // stop tokens are masked before this many output tokens
    int prompt_logprobs = -1;  // >= 0: sample 0 scores the prompt (Request::prompt_logprobs)
};

struct Sequence {
    std::shared_ptr<const RequestInfo> request;
    int sample = 0;               // index among the request's samples
    uint64_t uid = 0;             // engine-wide, unique; (priority, uid) orders the queue
    SamplingParams params;        // the request's, with this sample's seed
    std::vector<int32_t> tokens;  // [n_prompt + n_output] prompt, then generated tokens
    SeqStatus status = SeqStatus::waiting;

    // KV state. Positions [0, n_computed) have full-layer and window K/V written. After a
    // prefix-cache hit, positions [n_computed, n_full_cached) have full-layer K/V in shared pages
    // but still need their window K/V (the replay, n_full_kv_cached in the slice).
    int n_computed = 0;
    int n_full_cached = 0;
    std::vector<PageId> pages;        // page table: position p is in pages[p / page_size]
    std::vector<uint64_t> page_keys;  // prefix-cache chain keys of the first full pages
    int window_slot = -1;

    // Samples after the first wait until the first (the leader) has computed all but the last
    // prompt token, then fork: they share its full pages, get copies of its partial page and
    // window slot, and compute only the last prompt token themselves (Scheduler::schedule). A
    // sample that misses that moment (no room in the step) is admitted like any other request,
    // through the prefix cache. 0 when not waiting for anyone.
    uint64_t leader_uid = 0;
    int n_followers = 0;  // samples whose leader_uid is this sequence's uid

    // After a prefix hit whose window ring is being rebuilt by a replay: the position where the
    // rebuilt ring is saved as a window snapshot (chunks stop there once), and the prefix's key.
    int snapshot_at = -1;
    uint64_t snapshot_key = 0;

    // Speculative decoding: this step's proposal (tokens after the pending last one, checked by the
    // verify forward) and tokens + draft back to back, what the sampler's penalties read for the
    // verify rows. Empty outside a verify step.
    std::vector<int32_t> draft;
    std::vector<int32_t> verify_tokens;
    // n-gram back-off: verifies in a row that accepted nothing, and the output length before which
    // no more proposals are made (each further miss doubles the pause, up to kMaxSpecPause tokens).
    int spec_misses = 0;
    int spec_resume_at = 0;
    uint64_t spec_last_step = 0;  // the scheduler's step of its last proposal (probes go to the oldest)

    uint64_t scheduled_step = 0;  // the scheduler's step that last gave this sequence a chunk
    int cached_tokens = -1;       // prefix hit at first admission (usage), -1 before admission
    // This sample's copy of the request's constraint, made before its first token is sampled;
    // advanced with every token it generates (null when unconstrained).
    std::shared_ptr<TokenConstraint> constraint;
    int n_preemptions = 0;

    // Prompt scoring (sample 0 of a request with prompt_logprobs >= 0): the score of prompt position
    // p + 1 given [0, p] at prompt_scores[p], filled as the prefill computes them (never from the
    // prefix cache), sent with the sample's first event.
    std::vector<TokenScore> prompt_scores;
    bool scores_sent = false;
    bool scores_prompt() const { return sample == 0 && request->prompt_logprobs >= 0 && !scores_sent; }

    int n_prompt() const { return request->n_prompt; }
    int n_tokens() const { return int(tokens.size()); }
    int n_output() const { return n_tokens() - n_prompt(); }
};

}  // namespace osprey::engine
