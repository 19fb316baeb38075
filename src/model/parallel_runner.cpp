// One runner over the ranks of a parallel layout (see parallel_runner.h).
#include "model/parallel_runner.h"

#include <algorithm>

#include "comm/in_process.h"
#include "core/check.h"
#include "model/batch_check.h"

namespace osprey::model {

ParallelRunner::ParallelRunner(const Weights& weights, ParallelRunnerOptions o)
    : config_(weights.config), layout_(o.layout) {
    layout_.check(config_);
    const int n = layout_.world();
    world_ = o.make_device_group ? o.make_device_group(n) : comm::make_in_process_group(n);
    OSPREY_CHECK(int(world_.size()) == n, "parallel runner: ", world_.size(), " communicators for ", n, " ranks");
    if (world_.front()->on_device()) host_world_ = comm::make_in_process_group(n);
    comms_.resize(size_t(n));
    ranks_.resize(size_t(n));
    const int cores = o.n_threads > 0 ? o.n_threads : int(std::max(1u, std::thread::hardware_concurrency()));
    const int threads_per_rank = std::max(1, cores / n);
    for (int r = 0; r < n; ++r) threads_.emplace_back([this, r] { worker(r); });

    // Each rank builds its communicators (split is collective) and cuts its shard on its own thread.
    const int G = layout_.group_size(), tp = layout_.tp;
    try {
        run([&](int r) {
            if (o.on_rank_thread) o.on_rank_thread(r);
            comm::Communicator& world = *world_[size_t(r)];
            RankComms& c = comms_[size_t(r)];
            c.attn = world.split(r / tp, r);  // the attention TP group: same DP group and replica
            c.vocab = world.split(r / G, r);  // the DP group
            c.dp = world.split(r % G, r);     // this place in every DP group: the MoE's token gather
            if (!host_world_.empty()) {
                c.host_vocab = host_world_[size_t(r)]->split(r / G, r);
                c.host_dp = host_world_[size_t(r)]->split(r % G, r);
            }
            const RankContext ctx{.rank = r,
                                  .piece = model_shard(config_, layout_, r),
                                  .attn = c.attn.get(),
                                  .moe = &world,  // every rank, every group's tokens
                                  .vocab = c.vocab.get(),
                                  .dp = c.dp.get(),
                                  .host_vocab = c.host_vocab ? c.host_vocab.get() : c.vocab.get(),
                                  .host_dp = c.host_dp ? c.host_dp.get() : c.dp.get(),
                                  .n_threads = threads_per_rank};
            if (o.make_rank) {
                ranks_[size_t(r)] = o.make_rank(ctx);
                return;
            }
            CpuReferenceOptions ro;
            ro.kv_dtype = o.kv_dtype;
            ro.kv_budget_bytes = o.kv_budget_bytes;
            ro.n_threads = ctx.n_threads;
            ro.shard = CpuReferenceOptions::Shard{
                .piece = ctx.piece, .attn = ctx.attn, .moe = ctx.moe, .vocab = ctx.vocab, .dp = ctx.dp};
            ranks_[size_t(r)] = std::make_unique<CpuReference>(weights, ro);
        });
    } catch (...) {
        stop_threads();
        throw;
    }
}

ParallelRunner::~ParallelRunner() {
    // Each rank's runner and communicators are released on its own thread (a GPU rank's resources
    // belong to its device), runners first: they use the communicators.
    if (!broken_) {
        try {
            run([&](int r) {
                ranks_[size_t(r)].reset();
                comms_[size_t(r)] = RankComms{};
                world_[size_t(r)].reset();
            });
        } catch (...) {
        }
    }
    stop_threads();
}

CpuReference& ParallelRunner::rank(int r) {
    auto* cpu = dynamic_cast<CpuReference*>(ranks_[size_t(r)].get());
    OSPREY_CHECK(cpu, "parallel runner: rank ", r, " is not a CPU reference rank");
    return *cpu;
}

void ParallelRunner::stop_threads() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_job_.notify_all();
    for (auto& t : threads_) t.join();
}

void ParallelRunner::worker(int rank) {
    uint64_t seen = 0;
    for (;;) {
        const std::function<void(int)>* job = nullptr;
        {
            std::unique_lock lock(mu_);
            cv_job_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            job = job_;
        }
        std::exception_ptr error;
        try {
            (*job)(rank);
        } catch (...) {
            error = std::current_exception();
            world_[size_t(rank)]->abort();  // peers blocked in a collective with this rank fail too
            if (!host_world_.empty()) host_world_[size_t(rank)]->abort();
        }
        std::lock_guard lock(mu_);
        if (error && !error_) error_ = error;  // the first in time: the failing rank, not an abort
        if (--pending_ == 0) cv_done_.notify_all();
    }
}

void ParallelRunner::run(const std::function<void(int)>& fn) {
    OSPREY_CHECK(!broken_, "parallel runner ", layout_.label(),
                 ": a rank failed in an earlier call, the ranks' state is unknown; restart the server");
    std::unique_lock lock(mu_);
    job_ = &fn;
    pending_ = int(threads_.size());
    error_ = nullptr;
    ++generation_;
    cv_job_.notify_all();
    cv_done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (error_) {
        broken_ = true;
        std::rethrow_exception(error_);
    }
}

std::string ParallelRunner::name() const {
    return ranks_.front()->name() + " " + layout_.label() + " (" + std::to_string(layout_.world()) + " ranks)";
}

KvSpec ParallelRunner::kv_spec(int page_size) const {
    return ranks_.front()->kv_spec(page_size);
}

size_t ParallelRunner::kv_budget_bytes() const {
    return ranks_.front()->kv_budget_bytes();
}

int ParallelRunner::group_of(int rank) const {
    return rank / layout_.group_size();
}

void ParallelRunner::allocate_kv(const KvLayout& layout) {
    // The ranks' own checks, here first: a refused layout leaves the runner usable.
    layout.check("parallel runner");
    const KvSpec mine = kv_spec(std::max(layout.spec.page_size(), 1));
    OSPREY_CHECK(layout.spec.dtype() == mine.dtype() && layout.spec.kv_dim() == mine.kv_dim() &&
                     layout.spec.n_layers() == mine.n_layers(),
                 "parallel runner ", layout_.label(), ": KV spec with rows of ", layout.spec.kv_dim(),
                 ", each rank keeps rows of ", mine.kv_dim(), " (kv_spec())");
    OSPREY_CHECK(layout.bytes() <= kv_budget_bytes(), "parallel runner ", layout_.label(), ": KV layout needs ",
                 layout.bytes(), " bytes per rank, budget is ", kv_budget_bytes());
    run([&](int r) { ranks_[size_t(r)]->allocate_kv(layout); });
    kv_layout_ = layout;
}

void ParallelRunner::forward(const ForwardBatch& batch) {
    check_forward_batch(batch, config_, kv_layout_, layout_.dp);  // here, so no rank fails alone
    // Each DP group gets its own slices, tokens renumbered; a group without any runs an empty step
    // (its ranks still join the MoE's gather and all-reduce). Logit rows keep slice order overall:
    // row_group_ says whose each row is.
    std::vector<ForwardBatch> parts(size_t(layout_.dp));
    row_group_.clear();
    for (const SequenceSlice& sl : batch.slices) {
        ForwardBatch& part = parts[size_t(sl.dp_group)];
        SequenceSlice local = sl;
        local.first_token = int32_t(part.tokens.size());
        local.dp_group = 0;
        part.tokens.insert(part.tokens.end(), batch.tokens.begin() + sl.first_token,
                           batch.tokens.begin() + sl.first_token + sl.n_tokens);
        part.slices.push_back(std::move(local));
        for (int i = 0; i < sl.logit_rows(); ++i) row_group_.push_back(sl.dp_group);
    }
    n_logit_rows_ = -1;
    run([&](int r) { ranks_[size_t(r)]->forward(parts[size_t(group_of(r))]); });
    n_logit_rows_ = batch.n_logit_rows();
}

void ParallelRunner::copy_kv(const KvCopyPlan& plan) {
    check_kv_copy_plan(plan, kv_layout_, layout_.dp);
    KvCopyPlan local = plan;  // each rank holds one group's cache
    local.dp_group = 0;
    run([&](int r) {
        if (group_of(r) == plan.dp_group) ranks_[size_t(r)]->copy_kv(local);
    });
}

void ParallelRunner::logits_to_host(std::vector<float>& out) {
    // Each group's first rank gathers its rows (vocabulary split over the group); merged in slice order.
    std::vector<std::vector<float>> rows(ranks_.size());
    run([&](int r) { ranks_[size_t(r)]->logits_to_host(rows[size_t(r)]); });
    const size_t V = size_t(config_.vocab_size), G = size_t(layout_.group_size());
    out.resize(row_group_.size() * V);
    std::vector<size_t> next(size_t(layout_.dp), 0);
    for (size_t i = 0; i < row_group_.size(); ++i) {
        const size_t g = size_t(row_group_[i]);
        std::copy_n(rows[g * G].begin() + ptrdiff_t(next[g]++ * V), V, out.begin() + ptrdiff_t(i * V));
    }
}

void ParallelRunner::sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                            std::span<SampleResult> out) {
    OSPREY_CHECK(int(params.size()) == n_logit_rows_ && state.size() == params.size() && out.size() == params.size(),
                 "sample: ", params.size(), " parameter sets, ", state.size(), " states and ", out.size(),
                 " results for ", n_logit_rows_, " logit rows");
    // Every group samples its own rows on its vocabulary ranks; the group's first rank has the results.
    const int dp = layout_.dp;
    std::vector<std::vector<SamplingParams>> p(static_cast<size_t>(dp));
    std::vector<std::vector<SamplingState>> st(static_cast<size_t>(dp));
    for (size_t i = 0; i < params.size(); ++i) {
        p[size_t(row_group_[i])].push_back(params[i]);
        st[size_t(row_group_[i])].push_back(state[i]);
    }
    std::vector<std::vector<SampleResult>> results(ranks_.size());
    run([&](int r) {
        const size_t g = size_t(group_of(r));
        results[size_t(r)].resize(p[g].size());
        ranks_[size_t(r)]->sample(p[g], st[g], results[size_t(r)]);
    });
    const size_t G = size_t(layout_.group_size());
    std::vector<size_t> next(size_t(dp), 0);
    for (size_t i = 0; i < params.size(); ++i) {
        const size_t g = size_t(row_group_[i]);
        out[i] = std::move(results[g * G][next[g]++]);
    }
}

}  // namespace osprey::model
