// Continuous batching with chunked prefill, prefix reuse and preemption (see scheduler.h).
#include "engine/scheduler.h"

#include <algorithm>
#include <climits>
#include <limits>

#include "core/check.h"

namespace osprey::engine {

namespace {
// Queue order: higher priority first, then first come first served.
bool is_paused(const Sequence* s) {
    return s->request->stream && s->request->stream->held();
}

bool before(const Sequence* a, const Sequence* b) {
    if (a->request->priority != b->request->priority) return a->request->priority > b->request->priority;
    return a->uid < b->uid;
}
}  // namespace

Scheduler::Scheduler(const SchedulerOptions& options, KvCacheManager& kv) : options_(options), kv_(kv) {
    OSPREY_CHECK(options.max_num_seqs > 0, "max_num_seqs must be positive, got ", options.max_num_seqs);
    OSPREY_CHECK(options.max_batch_tokens > 0, "max_batch_tokens must be positive, got ", options.max_batch_tokens);
    OSPREY_CHECK(options.window_replay >= 0, "window_replay must be >= 0, got ", options.window_replay);
    OSPREY_CHECK(options.max_mixed_prefill_tokens == 0 || options.max_mixed_prefill_tokens >= kPrefillChunkAlign,
                 "max_mixed_prefill_tokens must be 0 (off) or >= ", kPrefillChunkAlign, ", got ",
                 options.max_mixed_prefill_tokens);
    OSPREY_CHECK(options.mixed_prefill_min_decodes >= 1, "mixed_prefill_min_decodes must be >= 1, got ",
                 options.mixed_prefill_min_decodes);
}

Scheduler::~Scheduler() = default;

int Scheduler::pages_for(int n_positions) const {
    return (n_positions + kv_.page_size() - 1) / kv_.page_size();
}

void Scheduler::add_request(std::shared_ptr<const RequestInfo> request, const std::vector<int32_t>& prompt,
                            const std::vector<SamplingParams>& params) {
    OSPREY_CHECK(!prompt.empty() && int(prompt.size()) == request->n_prompt, "request prompt has ", prompt.size(),
                 " tokens, expected ", request->n_prompt);
    uint64_t leader = 0;
    for (size_t i = 0; i < params.size(); ++i) {
        auto seq = std::make_unique<Sequence>();
        seq->request = request;
        seq->sample = int(i);
        seq->uid = next_uid_++;
        seq->params = params[i];
        seq->tokens = prompt;
        // A fork needs at least one prompt position before the last.
        seq->leader_uid = i == 0 || request->n_prompt < 2 ? 0 : leader;
        if (i == 0) leader = seq->uid;
        if (seq->leader_uid != 0) ++seqs_.at(leader)->n_followers;
        waiting_.push_back(seq.get());
        seqs_.emplace(seq->uid, std::move(seq));
    }
}

int64_t Scheduler::load_tokens() const {
    int64_t n = 0;
    for (const auto& [uid, seq] : seqs_) n += seq->n_tokens();
    return n;
}

Sequence* Scheduler::leader_of(const Sequence& seq) const {
    if (seq.leader_uid == 0) return nullptr;
    const auto it = seqs_.find(seq.leader_uid);
    return it == seqs_.end() ? nullptr : it->second.get();
}

bool Scheduler::waits_for_leader(const Sequence& seq) const {
    const Sequence* leader = leader_of(seq);
    return leader && leader->n_computed < leader->n_prompt() - 1;
}

bool Scheduler::has_followers(const Sequence& seq) const {
    return seq.n_followers > 0;
}

void Scheduler::stop_following(Sequence& seq) {
    if (Sequence* leader = leader_of(seq)) --leader->n_followers;
    seq.leader_uid = 0;
}

int Scheduler::cap_at_fork_point(const Sequence& seq, int from, int n) const {
    const int fork_point = seq.n_prompt() - 1;
    if (from < fork_point && from + n > fork_point && has_followers(seq)) return fork_point - from;
    return n;
}

bool Scheduler::try_fork(StepPlan& plan, Sequence* seq, int reserve) {
    Sequence* leader = leader_of(*seq);
    const int fork_point = seq->n_prompt() - 1;
    if (!leader || leader->status != SeqStatus::running || leader->n_computed != fork_point) return false;
    // The leader's ring is exact only outside a prefix-hit replay (mid-replay, its first rows were
    // computed over a truncated window; found by the stress test after a preempted leader's recompute).
    if (leader->n_full_cached > leader->n_computed) return false;
    // Full pages are shared; the page holding position fork_point is private (a copy of the
    // leader's partial page, or a fresh page when fork_point starts one).
    const int ps = kv_.page_size();
    const int n_shared = fork_point / ps;
    if (kv_.n_available_pages() - reserve < 1) return false;
    model::KvCopy copy;
    seq->pages.assign(leader->pages.begin(), leader->pages.begin() + n_shared);
    for (PageId page : seq->pages) kv_.share_page(page);
    seq->page_keys.assign(leader->page_keys.begin(), leader->page_keys.begin() + n_shared);
    const PageId own = kv_.allocate_page();
    if (fork_point % ps != 0) {
        copy.src_pages.push_back(leader->pages[size_t(n_shared)]);
        copy.dst_pages.push_back(own);
    }
    seq->pages.push_back(own);
    seq->window_slot = kv_.allocate_slot();
    kv_.copy_ring(leader->window_slot, seq->window_slot);
    copy.src_slot = leader->window_slot;
    copy.dst_slot = seq->window_slot;
    plan.copies.push_back(std::move(copy));
    seq->n_computed = fork_point;
    seq->n_full_cached = fork_point;
    stop_following(*seq);
    seq->status = SeqStatus::running;
    if (seq->cached_tokens < 0) seq->cached_tokens = fork_point;
    counters_.n_forked_tokens += uint64_t(fork_point);
    running_.push_back(seq);
    add_chunk(plan, seq, 1);
    return true;
}

void Scheduler::sort_queues() {
    std::sort(running_.begin(), running_.end(), before);
    std::sort(waiting_.begin(), waiting_.end(), before);
}

void Scheduler::preempt(Sequence* seq) {
    if (proposer_) proposer_->forget(seq->uid);
    seq->draft.clear();
    kv_.release_pages(seq->pages);
    seq->page_keys.clear();
    kv_.release_slot(seq->window_slot);
    seq->window_slot = -1;
    seq->n_computed = 0;
    seq->n_full_cached = 0;
    seq->snapshot_at = -1;
    seq->status = SeqStatus::waiting;
    ++seq->n_preemptions;
    ++counters_.n_preemptions;
    running_.erase(std::find(running_.begin(), running_.end(), seq));
    waiting_.push_back(seq);
}

void Scheduler::set_speculation(Proposer* proposer, const SpeculativeOptions& options, int max_position) {
    options.validate();
    proposer_ = options.enabled() ? proposer : nullptr;
    spec_ = options;
    policy_ = SpecPolicy(options.verify_token_cost, options.probe_share);
    max_position_ = max_position;
}

void Scheduler::propose(const std::vector<Sequence*>& decodes) {
    std::vector<DraftRequest> requests;
    requests.reserve(decodes.size());
    for (Sequence* seq : decodes) {
        seq->draft.clear();
        // Structured output advances its automaton one sampled token at a time: no proposals.
        if (seq->request->constraint) continue;
        if (seq->n_output() < seq->spec_resume_at) continue;  // backing off (see commit)
        // Never past max_new_tokens (a verify emits up to k + 1 tokens) or the model's positions.
        const int room = std::min(seq->request->max_new_tokens - seq->n_output() - 1,
                                  max_position_ - seq->n_tokens() - 1);
        const int k = std::min(spec_.num_tokens, room);
        if (k <= 0) continue;
        DraftRequest r;
        r.seq_uid = seq->uid;
        r.tokens = seq->tokens;
        r.n_prompt = seq->n_prompt();
        r.max_tokens = k;
        r.out = &seq->draft;
        requests.push_back(r);
    }
    // Adaptive proposing (SpecPolicy): when the batch's recent acceptance does not pay for verify
    // tokens at this batch size, only probes within the allowance, given to the sequences whose
    // last proposal is oldest. The forced test modes propose every step.
    if (spec_.adaptive && !spec_.forced()) {
        int budget = policy_.step_budget(int(decodes.size()), spec_.num_tokens);
        if (budget < INT_MAX) {
            auto last = [&](const DraftRequest& r) { return seqs_.at(r.seq_uid)->spec_last_step; };
            std::stable_sort(requests.begin(), requests.end(), [&](const DraftRequest& a, const DraftRequest& b) {
                return std::make_pair(last(a), a.seq_uid) < std::make_pair(last(b), b.seq_uid);
            });
            std::erase_if(requests, [&](const DraftRequest& r) {
                if (r.max_tokens > budget) return true;
                budget -= r.max_tokens;
                return false;
            });
        }
    }
    for (const DraftRequest& r : requests) seqs_.at(r.seq_uid)->spec_last_step = step_;
    if (requests.empty()) return;
    proposer_->propose(requests);
    for (const DraftRequest& r : requests) {
        std::vector<int32_t>& d = *r.out;
        if (int(d.size()) > r.max_tokens) d.resize(size_t(r.max_tokens));
        // The forced-acceptance test modes measure k proposals whatever the proposer found.
        if (spec_.forced()) d.resize(size_t(r.max_tokens), r.tokens.back());
    }
}

void Scheduler::add_chunk(StepPlan& plan, Sequence* seq, int n_tokens, int n_draft) {
    ScheduledChunk c;
    c.seq = seq;
    c.start_pos = seq->n_computed;
    c.n_tokens = n_tokens;
    c.n_draft = n_draft;
    c.n_full_kv_cached = std::clamp(seq->n_full_cached - seq->n_computed, 0, n_tokens);
    const RingSpan ring = kv_.ring(seq->window_slot);
    OSPREY_CHECK(ring.end == c.start_pos, "sequence ", seq->uid, " continues at ", c.start_pos, " but its ring holds [",
                 ring.first, ", ", ring.end, ")");
    c.window_first = ring.first;
    c.want_logits = c.start_pos + n_tokens - n_draft == seq->n_tokens();
    plan.chunks.push_back(c);
    seq->scheduled_step = step_;  // in this step's plan: never a preemption victim in it
}

StepPlan Scheduler::schedule() {
    StepPlan plan;
    plan.copies = std::move(pending_copies_);  // snapshots of rings the last step completed
    pending_copies_.clear();
    sort_queues();
    int budget = options_.max_batch_tokens;
    ++step_;
    std::vector<Sequence*> preempted;  // not readmitted in the step that preempted them
    auto is_scheduled = [&](const Sequence* s) { return s->scheduled_step == step_; };

    // Frees pages until `need` are available by preempting the lowest-ranked running sequences
    // not yet in this step. The scan from the bottom reaches `seq` before anything ranked above
    // it; returns false, preempting nothing more, when `seq` itself is next in line.
    auto make_room = [&](Sequence* seq, int need) {
        while (need > kv_.n_available_pages()) {
            Sequence* victim = nullptr;
            for (auto it = running_.rbegin(); it != running_.rend() && victim == nullptr; ++it)
                if (!is_scheduled(*it)) victim = *it;
            if (victim == seq) return false;
            preempt(victim);
            preempted.push_back(victim);
            ++plan.n_preempted;
        }
        return true;
    };
    auto preempt_self = [&](Sequence* seq) {
        preempt(seq);
        preempted.push_back(seq);
        ++plan.n_preempted;
    };

    // 0. A waiting sequence of higher priority than running ones takes the place of the lowest-ranked
    //    of them when it could not be admitted otherwise (no window slot, or not the pages of its
    //    first chunk, counted without prefix hits). Equal priorities never preempt: first come, first
    //    served. The preempted ones wait behind it and recompute later.
    const auto unpaused = std::find_if(waiting_.begin(), waiting_.end(), [](Sequence* s) { return !is_paused(s); });
    if (unpaused != waiting_.end()) {
        Sequence* head = *unpaused;
        const int first_chunk = std::min(head->n_tokens(), options_.max_batch_tokens);
        auto fits = [&] {
            return int(running_.size()) < options_.max_num_seqs && kv_.n_free_slots() > 0 &&
                   pages_for(first_chunk) <= kv_.n_available_pages();
        };
        while (!waits_for_leader(*head) && !fits() && !running_.empty() &&
               running_.back()->request->priority < head->request->priority)
            preempt_self(running_.back());
    }

    // 1. One decode token for every running sequence that has finished its prefill.
    const std::vector<Sequence*> ranked = running_;
    auto is_decode = [&](const Sequence* seq) {
        return seq->status == SeqStatus::running && seq->n_tokens() - seq->n_computed == 1 && !is_paused(seq);
    };
    // With the mixed-prefill limit on, speculative proposals take only the tokens no decode needs and,
    // while a prefill waits (running mid-prompt, or queued), leave it kPrefillChunkAlign of them (half
    // when fewer than twice that are left, so small budgets still verify): the prefill advances every
    // step as long as the step budget exceeds the decodes.
    const bool mixed_limit = options_.max_mixed_prefill_tokens > 0;
    int prefill_reserve = 0;
    int draft_room = 0;  // with the limit on: tokens left for proposals
    if (mixed_limit) {
        int n_decodes = 0;
        bool prefill_waits = std::any_of(waiting_.begin(), waiting_.end(), [](Sequence* s) { return !is_paused(s); });
        for (const Sequence* seq : ranked) {
            if (is_decode(seq))
                ++n_decodes;
            else if (seq->status == SeqStatus::running && !is_paused(seq))
                prefill_waits = true;
        }
        const int left = std::max(0, budget - n_decodes);
        if (prefill_waits) prefill_reserve = std::min(kPrefillChunkAlign, left - left / 2);
        draft_room = std::max(0, budget - n_decodes - prefill_reserve);
    }
    if (proposer_) {  // proposals for every decode (a speculative verify; no replay in flight)
        std::vector<Sequence*> decodes;
        for (Sequence* seq : ranked) {
            seq->draft.clear();
            if (is_decode(seq) && seq->n_full_cached <= seq->n_computed && seq->n_output() >= 1) decodes.push_back(seq);
        }
        propose(decodes);
    }
    int n_verify_tokens = 0;
    int n_decoding = 0;  // decode chunks in this step
    for (Sequence* seq : ranked) {
        if (budget - prefill_reserve <= 0) break;
        if (!is_decode(seq)) continue;
        const int need = pages_for(seq->n_computed + 1) - int(seq->pages.size());
        if (!make_room(seq, need)) {
            seq->draft.clear();
            preempt_self(seq);
            continue;
        }
        for (int i = 0; i < need; ++i) seq->pages.push_back(kv_.allocate_page());
        // The proposal rides along where the budget and the free pages allow (it never preempts).
        int n_draft = std::min(int(seq->draft.size()), mixed_limit ? draft_room : budget - 1);
        while (n_draft > 0 &&
               pages_for(seq->n_computed + 1 + n_draft) - int(seq->pages.size()) > kv_.n_available_pages())
            --n_draft;
        seq->draft.resize(size_t(n_draft));
        for (int i = pages_for(seq->n_computed + 1 + n_draft) - int(seq->pages.size()); i > 0; --i)
            seq->pages.push_back(kv_.allocate_page());
        if (n_draft > 0) {
            seq->verify_tokens = seq->tokens;
            seq->verify_tokens.insert(seq->verify_tokens.end(), seq->draft.begin(), seq->draft.end());
        }
        add_chunk(plan, seq, 1 + n_draft, n_draft);
        budget -= 1 + n_draft;
        n_verify_tokens += n_draft;
        draft_room -= n_draft;
        ++n_decoding;
    }
    if (proposer_) policy_.spend(n_verify_tokens);

    // The prefill part of the step: what the decodes left, capped while enough sequences decode.
    if (mixed_limit && n_decoding >= options_.mixed_prefill_min_decodes)
        budget = std::min(budget, options_.max_mixed_prefill_tokens);
    // Up to `want` prefill tokens of one sequence: all of them when they fit; a chunk the budget
    // splits is a whole number of kPrefillChunkAlign tiles (with the limit on), or what is left
    // when that is less than one tile.
    auto fit = [&](int want) {
        if (want <= budget || !mixed_limit || budget < kPrefillChunkAlign) return std::min(want, budget);
        return budget / kPrefillChunkAlign * kPrefillChunkAlign;
    };

    // 2. The next prefill chunk of running sequences, as large as the budget allows; pages come
    //    from lower-ranked sequences, else the chunk shrinks to the pages available. A sequence
    //    that cannot advance at all gives its pages back (so higher-ranked ones never wait on it).
    //    With the mixed-prefill limit on, running prompts of lower priority than the head of the
    //    queue go after its admission (step 4), so a small prefill budget serves priorities first.
    int outranked_below = std::numeric_limits<int>::min();
    if (mixed_limit) {
        const Sequence* head = nullptr;
        for (const Sequence* s : waiting_)
            if (!is_paused(s) && !waits_for_leader(*s) && (!head || before(s, head))) head = s;
        if (head) outranked_below = head->request->priority;
    }
    auto prefill_running = [&](bool outranked) {
        for (Sequence* seq : ranked) {
            if (budget == 0) break;
            if (seq->status != SeqStatus::running || is_scheduled(seq) || is_paused(seq)) continue;
            if ((seq->request->priority < outranked_below) != outranked) continue;
            int n = cap_at_fork_point(*seq, seq->n_computed, fit(seq->n_tokens() - seq->n_computed));
            if (seq->snapshot_at > seq->n_computed) n = std::min(n, seq->snapshot_at - seq->n_computed);
            if (!make_room(seq, pages_for(seq->n_computed + n) - int(seq->pages.size()))) {
                const int room = (int(seq->pages.size()) + kv_.n_available_pages()) * kv_.page_size() - seq->n_computed;
                n = std::min(n, room);
                if (n <= 0) {
                    preempt_self(seq);
                    continue;
                }
            }
            const int need = pages_for(seq->n_computed + n) - int(seq->pages.size());
            for (int i = 0; i < need; ++i) seq->pages.push_back(kv_.allocate_page());
            add_chunk(plan, seq, n);
            budget -= n;
        }
    };
    prefill_running(false);

    // 3. Admission, in queue order; the head of the queue waits until it fits (no overtaking),
    //    except samples waiting for their first sibling's prompt.
    std::sort(waiting_.begin(), waiting_.end(), before);
    for (Sequence* seq : waiting_) {
        if (budget == 0 || int(running_.size()) >= options_.max_num_seqs || kv_.n_free_slots() == 0) break;
        if (std::find(preempted.begin(), preempted.end(), seq) != preempted.end()) break;
        if (is_paused(seq)) continue;  // its client reads nothing: it does not hold the queue either
        const int reserve = running_.empty() ? 0 : options_.admission_reserve_pages;
        if (try_fork(plan, seq, reserve)) {
            budget -= 1;
            continue;
        }
        if (waits_for_leader(*seq)) continue;
        stop_following(*seq);  // the fork point has passed: an ordinary admission
        // A prefix hit covers whole pages and leaves at least the last token to compute (its
        // logits are needed). The window layers replay up to window_replay cached tokens.
        std::vector<uint64_t> keys;
        // A sequence scoring its prompt computes every position (the cache holds K/V, not scores).
        const int max_hit_pages = seq->scores_prompt() ? 0 : (seq->n_tokens() - 1) / kv_.page_size();
        std::vector<PageId> hit = kv_.match_prefix(seq->tokens, max_hit_pages, keys);
        const int n_hit = int(hit.size()) * kv_.page_size();
        // A saved ring for this prefix replaces the replay; without one, the replay's result is saved.
        const uint64_t prefix_key = n_hit > 0 ? keys.back() : 0;
        const int snapshot = n_hit > 0 ? kv_.snapshots().find(prefix_key) : -1;
        const int start = snapshot >= 0 ? n_hit : std::max(0, n_hit - options_.window_replay);
        const bool save = snapshot < 0 && start < n_hit && kv_.snapshots().n_slots() > 0;
        int n = cap_at_fork_point(*seq, start, fit(seq->n_tokens() - start));
        if (save) n = std::min(n, n_hit - start);
        const int need = pages_for(start + n) - int(hit.size());
        if (need > kv_.n_available_pages() - reserve) {
            kv_.release_pages(hit);
            break;
        }
        seq->pages = std::move(hit);
        seq->page_keys = std::move(keys);
        for (int i = 0; i < need; ++i) seq->pages.push_back(kv_.allocate_page());
        seq->window_slot = kv_.allocate_slot();
        if (snapshot >= 0) {
            plan.copies.push_back({{}, {}, snapshot, seq->window_slot});
            kv_.copy_ring(snapshot, seq->window_slot);
            ++counters_.n_window_restores;
        } else {
            kv_.start_ring(seq->window_slot, start);  // a new sequence, or a replay refilling the ring
        }
        seq->snapshot_at = save ? n_hit : -1;
        seq->snapshot_key = save ? prefix_key : 0;
        seq->n_computed = start;
        seq->n_full_cached = n_hit;
        seq->status = SeqStatus::running;
        if (seq->cached_tokens < 0) seq->cached_tokens = std::min(n_hit, seq->n_prompt());
        counters_.n_prefix_hit_tokens += uint64_t(n_hit);
        running_.push_back(seq);
        add_chunk(plan, seq, n);
        budget -= n;
    }
    std::erase_if(waiting_, [&](Sequence* s) { return s->status == SeqStatus::running; });

    // 4. What is left goes to the running prompts the queue's head outranked.
    prefill_running(true);

    // A plan with no chunks is not run: keep its (snapshot) copies for the next one, since their
    // snapshots are already registered and must be written before any restore reads them.
    if (plan.chunks.empty()) {
        pending_copies_ = std::move(plan.copies);
        plan.copies.clear();
    }
    return plan;
}

int Scheduler::preempt_request(uint64_t request_uid) {
    std::vector<Sequence*> victims;
    for (Sequence* s : running_)
        if (s->request->uid == request_uid) victims.push_back(s);
    for (Sequence* s : victims) preempt(s);
    return int(victims.size());
}

int Scheduler::n_paused() const {
    int n = 0;
    for (const auto& [uid, s] : seqs_) n += is_paused(s.get()) ? 1 : 0;
    return n;
}

SeqOutput Scheduler::finish(Sequence* seq, FinishReason reason, int32_t stop_token, const std::string& error) {
    stop_following(*seq);
    if (proposer_) proposer_->forget(seq->uid);
    if (seq->status == SeqStatus::running) {
        kv_.release_pages(seq->pages);
        kv_.release_slot(seq->window_slot);
        seq->window_slot = -1;
    }
    seq->page_keys.clear();
    seq->status = SeqStatus::finished;
    ++counters_.n_finished;
    SeqOutput out;
    out.stream = seq->request->stream;
    out.event.kind = Event::Kind::finish;
    out.event.sample = seq->sample;
    out.event.reason = reason;
    out.event.stop_token = stop_token;
    out.event.error = error;
    out.event.usage.prompt_tokens = seq->n_prompt();
    out.event.usage.completion_tokens = seq->n_output();
    out.event.usage.cached_tokens = std::max(seq->cached_tokens, 0);
    return out;
}

void Scheduler::remove_finished() {
    std::erase_if(running_, [](Sequence* s) { return s->status == SeqStatus::finished; });
    std::erase_if(waiting_, [](Sequence* s) { return s->status == SeqStatus::finished; });
    std::erase_if(seqs_, [](const auto& kv) { return kv.second->status == SeqStatus::finished; });
}

int Scheduler::accept(const ScheduledChunk& c, std::span<const SampleResult> rows,
                      std::vector<const SampleResult*>& src, std::vector<int32_t>& emit) const {
    const Sequence& seq = *c.seq;
    src.clear();
    emit.clear();
    int n_accepted = 0;
    for (int i = 0; i <= c.n_draft; ++i) {
        const SampleResult& r = rows[size_t(i)];
        src.push_back(&r);
        if (i < c.n_draft) {
            // The target's own draw for this position (seeded by its output index) decides: a
            // one-hot proposal is accepted iff it equals the draw (speculative.h). The forced test
            // modes accept by rule instead.
            const int32_t d = seq.draft[size_t(i)];
            const bool ok = spec_.forced() ? forced_accept(spec_, i, seq.params.seed, uint64_t(seq.n_output() + i))
                                           : r.token == d;
            if (ok) {
                emit.push_back(d);
                ++n_accepted;
                continue;
            }
        }
        emit.push_back(r.token);  // the correction, or the bonus token when everything was accepted
        break;
    }
    return n_accepted;
}

std::vector<SeqOutput> Scheduler::commit(const StepPlan& plan, std::span<const SampleResult> samples) {
    std::vector<SeqOutput> out;
    size_t row = 0;
    const int ps = kv_.page_size();
    std::vector<const SampleResult*> src;
    std::vector<int32_t> emit;
    for (const ScheduledChunk& c : plan.chunks) {
        Sequence* seq = c.seq;
        OSPREY_CHECK(seq->status == SeqStatus::running && seq->n_computed == c.start_pos,
                     "commit of a plan that no longer matches sequence ", seq->uid);
        const int n_rows = c.want_logits ? 1 + c.n_draft : 0;
        OSPREY_CHECK(row + size_t(n_rows) <= samples.size(), "commit got ", samples.size(), " samples for more rows");
        int n_accepted = 0;
        emit.clear();
        src.clear();
        if (c.want_logits) n_accepted = accept(c, samples.subspan(row, size_t(n_rows)), src, emit);
        row += size_t(n_rows);
        // Positions [start_pos, start_pos + n_tokens - rejected) keep their K/V: the pending token
        // and the accepted proposals. The rejected ones are taken back (rollback).
        const int n_rejected = c.n_draft - n_accepted;
        if (c.n_draft > 0 && !spec_.forced()) policy_.observe(c.n_draft, n_accepted);
        // n-gram back-off: lookups that keep proposing what the target refuses cost a wasted
        // verify each (random weights repeat tokens, so they match and miss): after 2 misses in a
        // row, pause proposing for about 1, 2, 4, ... 64 tokens; an accepted proposal resets it.
        // The pause is jittered by the sequence's id to between half and 1.5 times that, so that
        // sequences which started together do not all probe on the same steps. Exact: only which
        // steps verify changes. Off in the forced measuring modes.
        if (c.n_draft > 0 && spec_.method == SpecMethod::ngram && !spec_.forced() && !spec_.custom) {
            if (n_accepted > 0) {
                seq->spec_misses = 0;
            } else if (++seq->spec_misses >= 2) {
                seq->spec_resume_at = seq->n_output() + 1 + spec_backoff_pause(seq->uid, seq->spec_misses);
            }
        }
        const size_t n_before = seq->tokens.size();
        // The accepted proposals are tokens of computed positions: in the sequence before its pages
        // are offered to the prefix cache.
        seq->tokens.insert(seq->tokens.end(), emit.begin(), emit.end());
        seq->n_computed += c.n_tokens - n_rejected;
        seq->n_full_cached = std::max(seq->n_full_cached, seq->n_computed);
        kv_.advance_ring(seq->window_slot, c.start_pos, seq->n_computed);
        if (c.n_draft > 0) {
            // Pages that held only rejected positions go back (private, never offered); the ring
            // keeps its rows: the slack guarantees the ones still needed were not overwritten.
            std::vector<PageId> tail;
            while (int(seq->pages.size()) > pages_for(seq->n_full_cached)) {
                tail.push_back(seq->pages.back());
                seq->pages.pop_back();
            }
            std::reverse(tail.begin(), tail.end());
            kv_.release_pages(tail);
            ++counters_.n_spec_verifies;
            counters_.n_spec_draft_tokens += uint64_t(c.n_draft);
            counters_.n_spec_accepted_tokens += uint64_t(n_accepted);
            seq->draft.clear();
            seq->verify_tokens.clear();
        }
        if (seq->snapshot_at == seq->n_computed) {  // the replay rebuilt the ring at the hit's end: keep it
            const int slot = kv_.snapshots().store(seq->snapshot_key);
            if (slot >= 0) {
                pending_copies_.push_back({{}, {}, seq->window_slot, slot});
                kv_.copy_ring(seq->window_slot, slot);
            }
            seq->snapshot_at = -1;
        }
        const bool decode = c.want_logits && c.start_pos + 1 == int(n_before) && c.start_pos >= seq->n_prompt();
        (decode ? counters_.n_decode_tokens : counters_.n_prefill_tokens) += uint64_t(c.n_tokens);
        // Offer every page that is now full to the prefix cache.
        while (int(seq->page_keys.size()) < seq->n_computed / ps) {
            const size_t i = seq->page_keys.size();
            const uint64_t parent = i == 0 ? PrefixCache::kRootHash : seq->page_keys[i - 1];
            const std::span<const int32_t> page_tokens(seq->tokens.data() + i * size_t(ps), size_t(ps));
            seq->page_keys.push_back(kv_.offer_page(seq->pages[i], parent, page_tokens));
        }
        if (!c.want_logits) continue;
        // Prompt scores go out with the sample's first event.
        std::vector<TokenScore> scores;
        if (seq->scores_prompt()) {
            scores = std::move(seq->prompt_scores);
            seq->prompt_scores.clear();
            seq->scores_sent = true;
        }
        // The new tokens one by one: the first stop token or the length limit ends the sample and
        // drops what follows it (never more than max_new_tokens: proposals are capped to fit).
        seq->tokens.resize(n_before);
        for (size_t j = 0; j < emit.size(); ++j) {
            const int32_t token = emit[j];
            const SampleResult& r = *src[j];
            seq->tokens.push_back(token);
            ++counters_.n_generated_tokens;
            const auto& stops = seq->request->stop_token_ids;
            if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
                out.push_back(finish(seq, FinishReason::stop, token, ""));
                if (j == 0) out.back().event.prompt_logprobs = std::move(scores);
                break;
            }
            SeqOutput tok;
            tok.stream = seq->request->stream;
            tok.event.kind = Event::Kind::token;
            tok.event.sample = seq->sample;
            tok.event.token = token;
            if (seq->params.logprobs) tok.event.logprob = r.logprob;
            if (seq->params.top_logprobs > 0) tok.event.top = r.top;
            if (j == 0) tok.event.prompt_logprobs = std::move(scores);
            out.push_back(std::move(tok));
            if (seq->n_output() >= seq->request->max_new_tokens) {
                out.push_back(finish(seq, FinishReason::length, -1, ""));
                break;
            }
        }
    }
    OSPREY_CHECK(row == samples.size(), "commit got ", samples.size(), " samples for ", row, " rows");
    remove_finished();
    return out;
}

std::vector<SeqOutput> Scheduler::abort_request(uint64_t request_uid) {
    std::vector<SeqOutput> out;
    std::vector<Sequence*> victims;
    for (auto& [uid, seq] : seqs_)
        if (seq->request->uid == request_uid) victims.push_back(seq.get());
    std::sort(victims.begin(), victims.end(), [](auto* a, auto* b) { return a->uid < b->uid; });
    for (Sequence* s : victims) out.push_back(finish(s, FinishReason::abort, -1, ""));
    remove_finished();
    return out;
}

std::vector<SeqOutput> Scheduler::finish_all(FinishReason reason, const std::string& error) {
    // After a failed step the backend's rings are in an unknown state: saved ones are forgotten.
    pending_copies_.clear();
    kv_.snapshots().clear();
    std::vector<SeqOutput> out;
    std::vector<Sequence*> all;
    for (auto& [uid, seq] : seqs_) all.push_back(seq.get());
    std::sort(all.begin(), all.end(), [](auto* a, auto* b) { return a->uid < b->uid; });
    for (Sequence* s : all) out.push_back(finish(s, reason, -1, error));
    remove_finished();
    return out;
}

void Scheduler::check_invariants() const {
    const int ps = kv_.page_size();
    std::vector<int> holders(size_t(kv_.n_pages()), 0);
    std::vector<int> slots;
    OSPREY_CHECK(running_.size() + waiting_.size() == seqs_.size(), "running (", running_.size(), ") + waiting (",
                 waiting_.size(), ") != live sequences (", seqs_.size(), ")");
    OSPREY_CHECK(int(running_.size()) <= options_.max_num_seqs, "more running sequences than max_num_seqs");
    std::unordered_map<uint64_t, int> followers;
    for (const auto& [uid, seq] : seqs_)
        if (seq->leader_uid != 0) {
            ++followers[seq->leader_uid];
            OSPREY_CHECK(seq->status == SeqStatus::waiting, "sequence ", uid, " follows a leader but is not waiting");
        }
    for (const auto& [uid, seq] : seqs_)
        OSPREY_CHECK(seq->n_followers == followers[uid], "sequence ", uid, " counts ", seq->n_followers, " followers, ",
                     followers[uid], " follow it");
    for (const Sequence* s : waiting_) {
        OSPREY_CHECK(s->status == SeqStatus::waiting && s->pages.empty() && s->window_slot < 0 && s->n_computed == 0,
                     "waiting sequence ", s->uid, " holds cache resources");
        OSPREY_CHECK(seqs_.count(s->uid), "waiting sequence ", s->uid, " is not owned");
    }
    for (const Sequence* s : running_) {
        OSPREY_CHECK(s->status == SeqStatus::running && seqs_.count(s->uid), "running sequence ", s->uid,
                     " has a wrong state");
        OSPREY_CHECK(s->n_computed >= 0 && s->n_computed < s->n_tokens(), "running sequence ", s->uid, " computed ",
                     s->n_computed, " of ", s->n_tokens(), " tokens");
        OSPREY_CHECK(s->n_output() < s->request->max_new_tokens, "sequence ", s->uid, " is past max_new_tokens");
        OSPREY_CHECK(s->n_full_cached >= s->n_computed && s->n_full_cached <= int(s->pages.size()) * ps, "sequence ",
                     s->uid, " has full KV for ", s->n_full_cached, " positions but pages for ",
                     s->pages.size() * size_t(ps));
        // Between steps a sequence holds exactly the pages of what it has computed or cached.
        OSPREY_CHECK(int(s->pages.size()) == pages_for(s->n_full_cached), "sequence ", s->uid, " holds ",
                     s->pages.size(), " pages for ", s->n_full_cached, " positions");
        OSPREY_CHECK(s->window_slot >= 0 && kv_.slot_in_use(s->window_slot), "running sequence ", s->uid,
                     " has no window slot");
        OSPREY_CHECK(std::find(slots.begin(), slots.end(), s->window_slot) == slots.end(), "window slot ",
                     s->window_slot, " is held twice");
        const RingSpan ring = kv_.ring(s->window_slot);
        OSPREY_CHECK(ring.end == s->n_computed && ring.first >= 0 && ring.first <= ring.end, "sequence ", s->uid,
                     " computed ", s->n_computed, " positions but its ring holds [", ring.first, ", ", ring.end, ")");
        slots.push_back(s->window_slot);
        OSPREY_CHECK(int(s->page_keys.size()) <= int(s->pages.size()), "sequence ", s->uid,
                     " has more keys than pages");
        for (size_t i = 0; i < s->pages.size(); ++i) {
            const PageId p = s->pages[i];
            OSPREY_CHECK(std::count(s->pages.begin(), s->pages.end(), p) == 1, "sequence ", s->uid, " lists page ", p,
                         " twice");
            ++holders[size_t(p)];
            // A page still being written (not yet full of computed positions) is private.
            const bool full = int(i + 1) * ps <= s->n_full_cached;
            if (!full)
                OSPREY_CHECK(kv_.ref_count(p) == 1 && !kv_.is_cached(p), "sequence ", s->uid,
                             " writes into shared or cached page ", p);
            if (kv_.is_cached(p))
                OSPREY_CHECK(full && i < s->page_keys.size() && kv_.cache_key(p) == s->page_keys[i], "cached page ", p,
                             " of sequence ", s->uid, " is not full or has another key");
        }
    }
    kv_.check_invariants(holders);
}

}  // namespace osprey::engine
