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
    OSPREY_CHECK(layout_.dp == 1, "--dp ", layout_.dp,
                 ": attention data parallelism is designed (docs/architecture.md, \"Parallelism\") but not built "
                 "yet; only --dp 1 runs");
    const int n = layout_.world();
    world_ = comm::make_in_process_group(n);
    comms_.resize(size_t(n));
    ranks_.resize(size_t(n));
    const int cores = o.n_threads > 0 ? o.n_threads : int(std::max(1u, std::thread::hardware_concurrency()));
    const int threads_per_rank = std::max(1, cores / n);
    for (int r = 0; r < n; ++r) threads_.emplace_back([this, r] { worker(r); });

    // Each rank builds its communicators (split is collective) and cuts its shard on its own thread.
    const int G = layout_.group_size(), tp = layout_.tp;
    try {
        run([&](int r) {
            comm::Communicator& world = *world_[size_t(r)];
            RankComms& c = comms_[size_t(r)];
            c.attn = world.split(r / tp, r);  // the attention TP group: same DP group and replica
            c.vocab = world.split(r / G, r);  // the DP group
            CpuReferenceOptions ro;
            ro.kv_budget_bytes = o.kv_budget_bytes;
            ro.n_threads = threads_per_rank;
            ro.shard = CpuReferenceOptions::Shard{.piece = model_shard(config_, layout_, r),
                                                  .attn = c.attn.get(),
                                                  .moe = &world,  // every rank, every token (dp = 1)
                                                  .vocab = c.vocab.get()};
            ranks_[size_t(r)] = std::make_unique<CpuReference>(weights, ro);
        });
    } catch (...) {
        stop_threads();
        throw;
    }
}

ParallelRunner::~ParallelRunner() {
    stop_threads();
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
    return "cpu-reference " + layout_.label() + " (" + std::to_string(layout_.world()) + " ranks)";
}

KvSpec ParallelRunner::kv_spec(int page_size) const {
    return ranks_.front()->kv_spec(page_size);
}

size_t ParallelRunner::kv_budget_bytes() const {
    return ranks_.front()->kv_budget_bytes();
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
                 layout.bytes(), " bytes per rank, budget is ", kv_budget_bytes(), " (OSPREY_CPU_KV_BYTES)");
    run([&](int r) { ranks_[size_t(r)]->allocate_kv(layout); });
    kv_layout_ = layout;
}

void ParallelRunner::forward(const ForwardBatch& batch) {
    check_forward_batch(batch, config_, kv_layout_);  // here, so no rank fails alone
    n_logit_rows_ = -1;
    run([&](int r) { ranks_[size_t(r)]->forward(batch); });
    n_logit_rows_ = batch.n_logit_rows();
}

void ParallelRunner::copy_kv(const KvCopyPlan& plan) {
    check_kv_copy_plan(plan, kv_layout_);
    run([&](int r) { ranks_[size_t(r)]->copy_kv(plan); });
}

void ParallelRunner::logits_to_host(std::vector<float>& out) {
    std::vector<std::vector<float>> others(ranks_.size());
    run([&](int r) { ranks_[size_t(r)]->logits_to_host(r == 0 ? out : others[size_t(r)]); });
}

void ParallelRunner::sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                            std::span<SampleResult> out) {
    OSPREY_CHECK(int(params.size()) == n_logit_rows_ && state.size() == params.size() && out.size() == params.size(),
                 "sample: ", params.size(), " parameter sets, ", state.size(), " states and ", out.size(),
                 " results for ", n_logit_rows_, " logit rows");
    std::vector<std::vector<SampleResult>> others(ranks_.size());
    for (size_t r = 1; r < others.size(); ++r) others[r].resize(params.size());
    run([&](int r) { ranks_[size_t(r)]->sample(params, state, r == 0 ? out : std::span(others[size_t(r)])); });
}

}  // namespace osprey::model
