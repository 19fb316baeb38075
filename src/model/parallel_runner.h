// Tensor, expert and data parallelism on the CPU backend: one ModelRunner that drives one CpuReference
// shard per rank of a ParallelLayout (model/parallel_layout.h), each on a thread of its own, joined by
// in-process communicators (comm/in_process.h). The engine sees one runner and knows nothing of the
// ranks beyond the per-rank KV spec (kv_spec(): each rank holds its KV heads only), so it sizes the
// cache per rank and hands every rank of a DP group the same page and slot ids.
//
// Attention data parallelism (dp > 1): dp_groups() KV caches, one per group of G = max(tp, ep) ranks;
// every group allocates the same KvLayout, and slices and copy plans name their group (dp_group).
// forward() gives each group its own slices (an empty step to a group without any); attention runs
// per group on its tokens, the MoE on every rank over the tokens of all groups (gathered before each
// MoE block, the partial outputs all-reduced over all ranks, each group keeping its rows); logits and
// sampling stay per group, on its vocabulary ranks, and come back in slice order.
//
// A call runs on every rank's thread and returns when all are done: forward (collectives inside:
// out-projection and MoE all-reduces, the DP token gather), copy_kv (the group's ranks copy their own
// rows), logits_to_host and sample (the vocabulary is split; see CpuReference::sample). Batches and
// copy plans are checked here before any rank starts, so a bad request never leaves a rank waiting in
// a collective; if a rank throws anyway, the communicators are aborted, the error is rethrown, and the
// runner refuses further work (a step's KV state is then unknown).
//
// The CUDA backend slots in the same way (model/cuda/parallel_cuda.h): its options give a factory for
// the ranks (a CudaRunner shard per rank, on its worker thread: one thread per GPU) and one for the
// device communicators (NCCL, or several ranks on one GPU for tests); the host exchanges of a step
// (the distributed argmax's candidates, the DP token counts) then go through in-process communicators
// split the same way (docs/architecture.md, "Parallelism").
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "model/gpt_oss_ref.h"
#include "model/parallel_layout.h"

namespace osprey::model {

// What a rank's runner is made from (on the rank's own thread). The communicators live as long as the
// ParallelRunner; the device ones (attn, moe, vocab, dp) carry the rank's activations, the host ones
// small host arrays. For CPU ranks both are the same in-process communicators.
struct RankContext {
    int rank = 0;
    ModelShard piece;
    comm::Communicator* attn = nullptr;   // attention TP group
    comm::Communicator* moe = nullptr;    // every rank: the MoE's combine
    comm::Communicator* vocab = nullptr;  // the DP group: logits split by vocabulary
    comm::Communicator* dp = nullptr;     // this place in every DP group
    comm::Communicator* host_vocab = nullptr;
    comm::Communicator* host_dp = nullptr;
    int n_threads = 1;  // CPU threads for this rank
};
using RankFactory = std::function<std::unique_ptr<ModelRunner>(const RankContext&)>;
using CommGroupFactory = std::function<std::vector<std::unique_ptr<comm::Communicator>>(int n_ranks)>;

struct ParallelRunnerOptions {
    ParallelLayout layout = {};
    size_t kv_budget_bytes = 0;  // per rank (CpuReferenceOptions); 0: $OSPREY_CPU_KV_BYTES, else 2 GiB
    int n_threads = 0;           // CPU threads in all, shared out over the ranks; 0: every core
    KvDtype kv_dtype = KvDtype::f32;  // CpuReference ranks' KV cache (f32 or fp8_e4m3)
    // Another backend's ranks (empty: CpuReference shards). With it, make_device_group makes the
    // communicators of the ranks' activations (empty: in-process ones), and on_rank_thread runs first
    // on each rank's thread (the CUDA backend selects the rank's device there).
    RankFactory make_rank = nullptr;
    CommGroupFactory make_device_group = nullptr;
    std::function<void(int rank)> on_rank_thread = nullptr;
};

class ParallelRunner : public ModelRunner {
public:
    ParallelRunner(const Weights& weights, ParallelRunnerOptions options);
    ~ParallelRunner() override;
    ParallelRunner(const ParallelRunner&) = delete;
    ParallelRunner& operator=(const ParallelRunner&) = delete;

    const Config& config() const override { return config_; }
    std::string name() const override;  // "cpu-reference TP2 EP2 (2 ranks)"
    KvDtype kv_dtype() const override { return ranks_.front()->kv_dtype(); }
    int dp_groups() const override { return layout_.dp; }
    KvSpec kv_spec(int page_size) const override;  // one rank's: n_kv_heads / tp heads per row
    size_t kv_budget_bytes() const override;       // one rank's
    void allocate_kv(const KvLayout& layout) override;
    void forward(const ForwardBatch& batch) override;
    void copy_kv(const KvCopyPlan& plan) override;
    void logits_to_host(std::vector<float>& out) override;
    void sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                std::span<SampleResult> out) override;

    const ParallelLayout& layout() const { return layout_; }
    int n_ranks() const { return int(ranks_.size()); }
    CpuReference& rank(int r);  // for tests (dump hooks); CPU ranks only
    ModelRunner& runner(int r) { return *ranks_[size_t(r)]; }

private:
    // Runs fn(rank) on every rank's thread and waits; rethrows the first error after aborting the
    // communicators (a rank may be blocked in a collective waiting for the failed one).
    void run(const std::function<void(int)>& fn);
    void worker(int rank);
    void stop_threads();
    int group_of(int rank) const;  // its data-parallel group

    Config config_;
    ParallelLayout layout_;
    KvLayout kv_layout_;
    int n_logit_rows_ = 0;                                    // of the last forward (-1 while one runs)
    std::vector<int> row_group_;                              // [n_logit_rows_] DP group of each logit row
    std::vector<std::unique_ptr<comm::Communicator>> world_;       // [ranks] the activations' (device or host)
    std::vector<std::unique_ptr<comm::Communicator>> host_world_;  // [ranks] host exchanges; empty: world_
    struct RankComms {
        // attention TP group, DP group, the same place in every DP group (size dp); host_*: the host
        // exchanges' (unset when world_ is a host group)
        std::unique_ptr<comm::Communicator> attn, vocab, dp, host_vocab, host_dp;
    };
    std::vector<RankComms> comms_;                     // [ranks]
    std::vector<std::unique_ptr<ModelRunner>> ranks_;  // [ranks]

    std::mutex mu_;
    std::condition_variable cv_job_, cv_done_;
    const std::function<void(int)>* job_ = nullptr;
    uint64_t generation_ = 0;
    int pending_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
    bool broken_ = false;
    std::vector<std::thread> threads_;  // [ranks]
};

}  // namespace osprey::model
