// The engine's step loop (see engine.h): submissions in, one forward + sample per step, events out.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/check.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/batch_builder.h"
#include "engine/dp_router.h"

namespace osprey::engine {

namespace {

double mib(double bytes) {
    return bytes / (1024.0 * 1024.0);
}

}  // namespace

KvPlan plan_kv_cache(const model::ModelRunner& runner, const EngineOptions& o) {
    model::check_page_size(o.page_size);
    OSPREY_CHECK(o.kv_memory_fraction > 0.0 && o.kv_memory_fraction <= 1.0,
                 "the KV memory fraction must be in (0, 1], got ", o.kv_memory_fraction);
    OSPREY_CHECK(o.max_num_seqs > 0, "max_num_seqs must be positive, got ", o.max_num_seqs);
    OSPREY_CHECK(o.window_snapshots >= 0 && o.window_snapshots <= 4096, "window_snapshots must be in [0, 4096], got ",
                 o.window_snapshots);
    o.speculative.validate();
    KvPlan plan;
    plan.layout.spec = runner.kv_spec(o.page_size);
    // A speculative verify writes 1 + k positions a rollback may take back: k spare ring rows keep
    // the rows the rolled-back sequence still needs (engine/speculative.h).
    if (o.speculative.enabled()) plan.layout.spec = plan.layout.spec.with_ring_slack(o.speculative.num_tokens);
    const model::KvSpec& spec = plan.layout.spec;
    plan.n_snapshot_slots = o.enable_prefix_caching ? o.window_snapshots : 0;
    OSPREY_CHECK(spec.bytes_per_page() > 0, "the KV spec gives 0 bytes per page");
    const double budget = double(runner.kv_budget_bytes()) * o.kv_memory_fraction;
    const int n_slots = o.max_num_seqs + plan.n_snapshot_slots;
    const double slots = double(spec.bytes_per_window_slot()) * n_slots;
    OSPREY_CHECK(budget >= slots + double(spec.bytes_per_page()), "KV budget of ", mib(budget), " MiB (",
                 o.kv_memory_fraction, " of ", mib(double(runner.kv_budget_bytes())), " MiB) cannot hold ", n_slots,
                 " window slots (", mib(slots), " MiB) and one page; lower max_num_seqs");
    int64_t n_pages = int64_t((budget - slots) / double(spec.bytes_per_page()));
    if (o.max_kv_tokens > 0) n_pages = std::min<int64_t>(n_pages, (o.max_kv_tokens + o.page_size - 1) / o.page_size);
    n_pages = std::min<int64_t>(n_pages, 1 << 30);
    plan.layout.n_pages = int(n_pages);
    plan.layout.n_window_slots = n_slots;
    // Paging the ring layers like the paged ones would cost bytes_per_window_slot per
    // sliding_window tokens for every cached token.
    const double paged_window =
        double(n_pages) * o.page_size * double(spec.bytes_per_window_slot()) / spec.sliding_window();
    plan.window_saved_bytes = int64_t(paged_window - slots);
    return plan;
}

Engine::Engine(model::ModelRunner& runner, EngineOptions options) : runner_(runner), options_(options) {
    const model::Config& c = runner.config();
    const int n_groups = runner.dp_groups();
    OSPREY_CHECK(n_groups >= 1, "engine: the backend reports ", n_groups, " data-parallel groups");
    kv_plan_ = plan_kv_cache(runner, options_);  // one group's cache; every group has the same
    // A sequence lives in one group: its length is bounded by one group's cache.
    const int64_t capacity = int64_t(kv_plan_.layout.n_pages) * options_.page_size;
    max_model_len_ = options_.max_model_len > 0 ? options_.max_model_len : c.max_position;
    OSPREY_CHECK(max_model_len_ <= c.max_position, "max_model_len ", max_model_len_, " exceeds the model's ",
                 c.max_position, " positions");
    if (max_model_len_ > capacity) {
        log::warn("engine: max_model_len ", max_model_len_, " lowered to ", capacity,
                  " tokens, all the KV cache holds; longer requests are refused");
        max_model_len_ = int(capacity);
    }
    runner_.allocate_kv(kv_plan_.layout);  // every group's cache
    const model::KvSpec& spec = kv_plan_.layout.spec;
    const std::string groups =
        n_groups > 1 ? std::to_string(n_groups) + " data-parallel groups, each with " : std::string();
    log::info("engine: KV cache (", model::kv_dtype_name(spec.dtype()), ") of ", groups, kv_plan_.layout.n_pages,
              " pages x ", options_.page_size, " tokens = ", capacity, " tokens (",
              mib(double(kv_plan_.layout.n_pages) * double(spec.bytes_per_page())), " MiB per rank) + ",
              options_.max_num_seqs, " window slots + ", kv_plan_.n_snapshot_slots, " for saved rings (",
              mib(double(spec.bytes_per_window_slot()) * kv_plan_.layout.n_window_slots), " MiB); ",
              n_groups > 1 ? std::to_string(capacity * n_groups) + " tokens in all; " : std::string(),
              "window slots save ", mib(double(kv_plan_.window_saved_bytes)),
              " MiB against paging the sliding layers; max_model_len ", max_model_len_);

    limits_.vocab_size = c.vocab_size;
    limits_.max_model_len = max_model_len_;
    limits_.max_n = options_.max_n;
    limits_.max_top_logprobs = options_.max_top_logprobs;

    SchedulerOptions so;
    so.max_num_seqs = options_.max_num_seqs;
    so.max_batch_tokens = options_.max_batch_tokens;
    so.max_mixed_prefill_tokens = options_.max_mixed_prefill_tokens;
    so.mixed_prefill_min_decodes = options_.mixed_prefill_min_decodes;
    if (so.max_mixed_prefill_tokens > 0)
        log::info("engine: up to ", so.max_batch_tokens, " tokens per step; while ", so.mixed_prefill_min_decodes,
                  " or more sequences decode, prefill takes at most ", so.max_mixed_prefill_tokens, " of them");
    else
        log::info("engine: up to ", so.max_batch_tokens, " tokens per step; prefill takes what the decodes leave");
    so.window_replay = spec.window_replay();
    so.admission_reserve_pages = kv_plan_.layout.n_pages / 100;
    for (int g = 0; g < n_groups; ++g) {
        kv_.push_back(std::make_unique<KvCacheManager>(kv_plan_.layout.n_pages, options_.page_size,
                                                       options_.max_num_seqs, options_.enable_prefix_caching,
                                                       kv_plan_.n_snapshot_slots));
        schedulers_.push_back(std::make_unique<Scheduler>(so, *kv_.back()));
        if (options_.speculative.enabled()) {
            const model::ModelRunner* draft = options_.speculative.draft_runner;
            OSPREY_CHECK(options_.speculative.method != SpecMethod::draft || options_.speculative.custom ||
                             (draft && draft->config().vocab_size == c.vocab_size),
                         "the draft model's vocabulary (", draft ? draft->config().vocab_size : 0,
                         ") differs from the target's (", c.vocab_size, ")");
            OSPREY_CHECK(n_groups == 1 || (options_.speculative.method == SpecMethod::ngram && !options_.speculative.custom),
                         "speculative decoding with data parallelism supports ngram only");
            SpeculativeOptions so = options_.speculative;
            so.draft_max_seqs = options_.max_num_seqs;
            proposers_.push_back(make_proposer(so));
            schedulers_.back()->set_speculation(proposers_.back().get(), options_.speculative, max_model_len_);
            stats_.spec_method = proposers_.back()->name();
        }
    }
    if (options_.speculative.enabled())
        log::info("engine: speculative decoding with ", stats_.spec_method, ", up to ", options_.speculative.num_tokens,
                  " proposed tokens per sequence and step",
                  options_.speculative.forced() ? " (forced-acceptance test mode: output is not the model's)" : "");
    stats_.n_pages = kv_plan_.layout.n_pages * n_groups;
    stats_.n_free_pages = stats_.n_pages;
    stats_.page_size = options_.page_size;
    stats_.max_model_len = max_model_len_;
    stats_.dp_groups = n_groups;
    stats_.kv_capacity_tokens = capacity * n_groups;
}

Engine::~Engine() {
    stop();
    std::lock_guard step(step_mu_);
    take_incoming();
    std::vector<SeqOutput> outputs = finish_all(FinishReason::abort, "");
    publish(outputs);
    for (auto& s : active_) s->set_cancel_hook(nullptr);
}

void Engine::Wakeup::notify() {
    {
        std::lock_guard lock(mu);
        wake = true;
    }
    cv.notify_all();
}

std::shared_ptr<RequestStream> Engine::submit(Request request) {
    validate_request(request, limits_);
    OSPREY_CHECK(request.prompt_logprobs < 0 || runner_.supports_prompt_scoring(),
                 "prompt scoring is not available on this backend (", runner_.name(), ")");
    std::lock_guard lock(mu_);
    OSPREY_CHECK(options_.max_queued_requests <= 0 || n_live_ < options_.max_queued_requests,
                 "the engine is at capacity (", n_live_, " requests queued or running); retry later");
    auto stream = std::make_shared<RequestStream>(next_uid_++, request.id, request.n);
    stream->set_cancel_hook([w = wakeup_] { w->notify(); });
    std::erase_if(live_, [](const auto& w) {
        auto s = w.lock();
        return !s || s->finished();
    });
    live_.push_back(stream);
    incoming_.emplace_back(stream, std::move(request));
    ++n_live_;
    wakeup_->notify();
    return stream;
}

bool Engine::cancel(const std::string& id) {
    std::vector<std::shared_ptr<RequestStream>> hits;
    {
        std::lock_guard lock(mu_);
        for (const auto& w : live_)
            if (auto s = w.lock(); s && s->id() == id && !s->finished()) hits.push_back(s);
    }
    for (auto& s : hits) s->cancel();
    return !hits.empty();
}

void Engine::take_incoming() {
    std::vector<std::pair<std::shared_ptr<RequestStream>, Request>> incoming;
    {
        std::lock_guard lock(mu_);
        incoming.swap(incoming_);
    }
    for (auto& [stream, r] : incoming) {
        auto info = std::make_shared<RequestInfo>();
        info->uid = stream->uid();
        info->stream = stream;
        info->stop_token_ids = r.stop_token_ids;
        info->max_new_tokens = r.max_new_tokens;
        info->priority = r.priority;
        info->min_tokens = r.min_tokens;
        info->prompt_logprobs = r.prompt_logprobs;
        info->n_prompt = int(r.prompt.size());
        info->constraint = r.constraint;
        std::vector<SamplingParams> params(size_t(r.n), r.sampling);
        for (int i = 0; i < r.n; ++i) params[size_t(i)].seed = sample_seed(r.sampling.seed, i);
        schedulers_[size_t(route(r.prompt))]->add_request(std::move(info), r.prompt, params);
        active_.push_back(stream);
    }
}

void Engine::apply_cancels() {
    std::vector<SeqOutput> outputs;
    for (auto& s : active_) {
        if (!s->cancel_requested() || s->finished()) continue;
        for (auto& scheduler : schedulers_) {
            std::vector<SeqOutput> aborted = scheduler->abort_request(s->uid());
            outputs.insert(outputs.end(), std::make_move_iterator(aborted.begin()),
                           std::make_move_iterator(aborted.end()));
        }
    }
    if (!outputs.empty()) publish(outputs);
}

void Engine::release_paused() {
    const auto now = std::chrono::steady_clock::now();
    for (auto& s : active_) {
        if (!s->paused() || std::chrono::duration<double>(now - s->paused_since()).count() < options_.paused_release_s)
            continue;
        for (auto& scheduler : schedulers_)
            if (const int n = scheduler->preempt_request(s->uid()); n > 0)
                log::debug("engine: request ", s->id(), " paused by its consumer; ", n, " sequences preempted");
    }
}

void Engine::publish(std::vector<SeqOutput>& outputs) {
    int n_done = 0;
    for (SeqOutput& o : outputs) {
        o.stream->push(std::move(o.event));
        if (o.stream->finished()) ++n_done;
    }
    std::erase_if(active_, [&](const auto& s) {
        if (!s->finished()) return false;
        s->set_cancel_hook(nullptr);
        return true;
    });
    std::lock_guard lock(mu_);
    n_live_ = int(active_.size() + incoming_.size());
}

int Engine::route(const std::vector<int32_t>& prompt) const {
    if (schedulers_.size() == 1) return 0;
    // A hit covers whole pages and leaves the last token to compute (as at admission).
    const int max_pages = (int(prompt.size()) - 1) / options_.page_size;
    std::vector<DpCandidate> groups(schedulers_.size());
    for (size_t g = 0; g < groups.size(); ++g)
        groups[g] = {kv_[g]->prefix_hit_tokens(prompt, max_pages), schedulers_[g]->load_tokens()};
    return pick_dp_group(groups);
}

std::vector<SeqOutput> Engine::finish_all(FinishReason reason, const std::string& error) {
    std::vector<SeqOutput> outputs;
    for (auto& scheduler : schedulers_) {
        std::vector<SeqOutput> done = scheduler->finish_all(reason, error);
        outputs.insert(outputs.end(), std::make_move_iterator(done.begin()), std::make_move_iterator(done.end()));
    }
    return outputs;
}

void Engine::update_stats() {
    std::lock_guard lock(mu_);
    EngineStats& s = stats_;
    s.n_waiting = s.n_running = s.n_paused = s.n_free_pages = s.n_cached_pages = 0;
    s.n_prefill_tokens = s.n_decode_tokens = s.n_prefix_hit_tokens = s.n_forked_tokens = 0;
    s.n_window_restores = s.n_preemptions = s.n_finished = s.n_generated_tokens = 0;
    s.n_spec_verifies = s.n_spec_draft_tokens = s.n_spec_accepted_tokens = 0;
    for (size_t g = 0; g < schedulers_.size(); ++g) {
        const Scheduler& sc = *schedulers_[g];
        const SchedulerCounters& k = sc.counters();
        s.n_waiting += sc.n_waiting();
        s.n_running += sc.n_running();
        s.n_paused += sc.n_paused();
        s.n_free_pages += kv_[g]->n_free_pages();
        s.n_cached_pages += kv_[g]->n_cached_pages();
        s.n_prefill_tokens += k.n_prefill_tokens;
        s.n_decode_tokens += k.n_decode_tokens;
        s.n_prefix_hit_tokens += k.n_prefix_hit_tokens;
        s.n_forked_tokens += k.n_forked_tokens;
        s.n_window_restores += k.n_window_restores;
        s.n_preemptions += k.n_preemptions;
        s.n_finished += k.n_finished;
        s.n_generated_tokens += k.n_generated_tokens;
        s.n_spec_verifies += k.n_spec_verifies;
        s.n_spec_draft_tokens += k.n_spec_draft_tokens;
        s.n_spec_accepted_tokens += k.n_spec_accepted_tokens;
    }
    s.n_steps = n_steps_;
}

void Engine::constrain_rows(std::span<const StepPlan> plans, std::vector<SamplingState>& states) {
    constrained_.clear();
    size_t row = 0;
    for (const StepPlan& plan : plans)
        for (const ScheduledChunk& c : plan.chunks) {
            if (!c.want_logits) continue;
            Sequence& seq = *c.seq;
            if (seq.request->constraint && !seq.constraint) seq.constraint = seq.request->constraint->clone();
            if (seq.constraint) constrained_.push_back({row, &seq});
            row += size_t(1 + c.n_draft);  // a verify chunk has a row per proposed token (never constrained)
        }
    if (constrained_.empty()) return;
    const size_t words = size_t(runner_.config().vocab_size + 31) / 32;
    masks_.assign(constrained_.size() * words, 0);
    auto fill = [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            auto [r, seq] = constrained_[size_t(i)];
            std::span<uint32_t> mask(masks_.data() + size_t(i) * words, words);
            if (!seq->constraint->fill_mask(mask)) continue;
            bool any = false;
            for (uint32_t w : mask) any = any || w != 0;
            if (!any) {  // a dead end (should not happen): let the sample stop
                for (int32_t t : seq->request->stop_token_ids) mask[size_t(t) / 32] |= uint32_t(1) << (t % 32);
                any = !seq->request->stop_token_ids.empty();
            }
            if (any) states[r].allowed = mask.data();
        }
    };
    if (constrained_.size() == 1) {
        fill(0, 1);
    } else {
        ThreadPool::global().parallel_for(int64_t(constrained_.size()), fill);
    }
}

void Engine::advance_constraints(std::span<SampleResult> results) {
    for (auto [row, seq] : constrained_) {
        SampleResult& r = results[row];
        if (seq->constraint->accept(r.token)) continue;
        // The sampler chose a token outside the mask: end the sample rather than emit it.
        log::error("engine: request ", seq->request->stream->id(), " sampled token ", r.token,
                   " that its constraint does not allow");
        if (!seq->request->stop_token_ids.empty()) r.token = seq->request->stop_token_ids[0];
    }
}

bool Engine::step_once() {
    take_incoming();
    apply_cancels();
    const bool idle = std::all_of(schedulers_.begin(), schedulers_.end(), [](const auto& s) { return s->idle(); });
    if (idle) {
        update_stats();
        return false;
    }

    release_paused();
    // Every group plans within its own budget and cache; one forward runs them all (the backend
    // splits the batch by dp_group).
    std::vector<StepPlan> plans(schedulers_.size());
    bool any = false;
    for (size_t g = 0; g < plans.size(); ++g) {
        plans[g] = schedulers_[g]->schedule();
        plans[g].dp_group = int(g);
        any = any || !plans[g].empty();
    }
    if (!any) {
        int n_waiting = 0, n_paused = 0;
        for (const auto& s : schedulers_) n_waiting += s->n_waiting(), n_paused += s->n_paused();
        if (n_paused > 0) {  // everything left is paused (or waits behind it)
            update_stats();
            return false;
        }
        OSPREY_FAIL("engine: ", n_waiting, " waiting requests cannot be scheduled");
    }
    std::vector<SeqOutput> outputs;
    try {
        // Forks and saved rings, before the step writes.
        for (const StepPlan& plan : plans)
            for (model::KvCopy copy : plan.copies) {
                copy.dp_group = plan.dp_group;
                runner_.copy_kv(model::plan_kv_copy(copy, kv_plan_.layout));
            }
        const model::ForwardBatch batch = build_forward_batch(plans);
        runner_.forward(batch);
        if (batch_scores_prompt(batch)) {
            std::vector<TokenScore> scores;
            runner_.take_prompt_scores(scores);
            store_prompt_scores(plans, scores);
        }
        for (const auto& proposer : proposers_)  // EAGLE-3 reads the target's hidden states of this step
            if (proposer && proposer->observes_forwards()) {
                std::vector<uint64_t> uids;
                for (const StepPlan& plan : plans)
                    for (const ScheduledChunk& c : plan.chunks) uids.push_back(c.seq->uid);
                proposer->observe_forward(batch, uids, runner_);
            }
        std::vector<SamplingParams> params;
        std::vector<SamplingState> states;
        build_sampling_rows(plans, params, states);
        constrain_rows(plans, states);  // on the CPU while an asynchronous backend runs the forward
        std::vector<SampleResult> results(params.size());
        if (!params.empty()) runner_.sample(params, states, results);
        for (const SampleResult& r : results)
            OSPREY_CHECK(r.token >= 0 && r.token < runner_.config().vocab_size, "sampler returned token ", r.token);
        advance_constraints(results);
        size_t row = 0;  // the groups' rows are back to back, in group order
        for (size_t g = 0; g < plans.size(); ++g) {
            const size_t n = size_t(plans[g].n_logit_rows());
            std::vector<SeqOutput> out = schedulers_[g]->commit(plans[g], std::span(results).subspan(row, n));
            row += n;
            outputs.insert(outputs.end(), std::make_move_iterator(out.begin()), std::make_move_iterator(out.end()));
        }
    } catch (const std::exception& e) {
        // A failed step leaves the backend's KV in an unknown state: end every request with the
        // error (the HTTP layer reports it) and keep serving new ones.
        log::error("engine: step failed: ", e.what());
        std::vector<SeqOutput> failed = finish_all(FinishReason::error, e.what());
        outputs.insert(outputs.end(), std::make_move_iterator(failed.begin()), std::make_move_iterator(failed.end()));
    }
    publish(outputs);
    ++n_steps_;
    if (options_.check_invariants)
        for (const auto& scheduler : schedulers_) scheduler->check_invariants();

    update_stats();
    return true;
}

bool Engine::step() {
    OSPREY_CHECK(!started_, "Engine::step() while the engine thread runs");
    std::lock_guard step(step_mu_);
    return step_once();
}

void Engine::run_until_idle() {
    while (step()) {
    }
}

void Engine::start() {
    OSPREY_CHECK(!started_, "engine already started");
    started_ = true;
    {
        std::lock_guard lock(wakeup_->mu);
        wakeup_->stop = false;
    }
    thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
    if (!started_) return;
    {
        std::lock_guard lock(wakeup_->mu);
        wakeup_->stop = true;
    }
    wakeup_->cv.notify_all();
    thread_.join();
    started_ = false;
}

void Engine::loop() {
    bool busy = false;
    for (;;) {
        // Paused requests are released after a timeout, so an idle engine with some looks again.
        const bool some_paused = !busy && stats().n_paused > 0;  // before wakeup_->mu (lock order)
        {
            std::unique_lock lock(wakeup_->mu);
            const auto woken = [&] { return wakeup_->stop || wakeup_->wake; };
            if (some_paused) {
                wakeup_->cv.wait_for(lock, std::chrono::milliseconds(100), woken);
            } else if (!busy) {
                wakeup_->cv.wait(lock, woken);
            }
            if (wakeup_->stop) return;
            wakeup_->wake = false;
        }
        std::lock_guard step(step_mu_);
        try {
            busy = step_once();
        } catch (const std::exception& e) {
            log::error("engine: ", e.what());
            std::vector<SeqOutput> outputs = finish_all(FinishReason::error, e.what());
            publish(outputs);
            busy = false;
        }
    }
}

EngineStats Engine::stats() const {
    std::lock_guard lock(mu_);
    return stats_;
}

}  // namespace osprey::engine
