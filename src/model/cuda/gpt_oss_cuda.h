// The CUDA backend: gpt-oss's forward pass on one GPU over a ragged batch, step for step like the
// CPU reference (model/gpt_oss_ref.h: same step names, same order), as kernel launches on one
// stream. BF16 weights and activations, MXFP4 experts as shipped, an FP32 residual stream, FP32
// accumulation everywhere, BF16 K/V (or FP8 E4M3 with a multiplier per position and KV head:
// CudaRunnerOptions::kv_dtype, kernels/cuda/kv_fp8.h) in a paged cache (full layers) and per-sequence
// 128-row rings (sliding layers).
//
// Step names (as the CPU reference; passed to the dump hook as [rows, width] f32), per block i:
//   attn_norm, q, k, v (q and k after RoPE), attn, resid_attn (x after the attention residual; the
//   output projection and the residual add are one GEMM), mlp_norm, router_logits, moe, resid_mlp;
//   outside the blocks (layer -1): embedding, final_norm, logits.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include "comm/communicator.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_store.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/runtime.h"
#include "model/cuda/device_weights.h"
#include "model/parallel_layout.h"
#include "model/rope.h"
#include "model/runner.h"
#include "model/weights.h"

namespace osprey::model {

struct CudaRunnerOptions {
    int max_tokens = 8192;      // tokens per forward (prefill chunk + decode tokens); sizes the workspace
    int max_logit_rows = 256;   // slices wanting logits per forward
    int max_slices = 256;       // sequences per forward
    size_t kv_reserve_bytes = size_t(1) << 30;  // device memory kept free besides weights + workspace
    bool progress = true;       // progress bar while loading weights
    // Replay steps of decodes and speculative verifies (every token of every slice gets a logit row)
    // from CUDA graphs, one per shape (CudaRunner::GraphKey).
    bool graphs = true;
    // The KV cache's element type: bf16 (the default), or fp8_e4m3 (--kv-cache-dtype fp8: E4M3 codes and
    // one F32 multiplier per position and KV head, as the CPU reference; kernels/cuda/kv_fp8.h).
    KvDtype kv_dtype = KvDtype::bf16;
    // The MoE of prefill-sized batches on the W4A8 FP8 wgmma GEMMs (kernels/cuda/moe_mlp_w4a8.h) instead
    // of W4A16; also turned on by $OSPREY_MOE_W4A8=1. The CLI's --moe-gemm w4a8.
    bool moe_w4a8 = false;
    // The weights' MXFP4 experts are loaded as FP8 blocks, requantised on the GPU (DeviceWeights::load):
    // `--weights fp8` with the experts on one GPU (the host keeps only the MXFP4 bytes). Whole model only.
    bool experts_to_fp8 = false;
    // A second copy of the MXFP4 experts in moe_decode's decode layout (kernels/cuda/mxfp4_words.h), read
    // by the decode MoE of 1-8 token batches: 9 integer operations per 8 weights instead of 13, for 0.5
    // byte per expert weight of device memory (DeviceWeights::add_decode_copies). Also turned on by
    // $OSPREY_MOE_DECODE_COPY=1.
    bool moe_decode_copy = false;

    // One rank of a parallel layout (model/cuda/parallel_cuda.h drives them; the CPU reference's Shard
    // is the model): the heads, experts, expert columns and vocabulary rows this rank holds, and the
    // device communicators its partial results are summed over (stream-ordered on this runner's
    // stream). Unset: the whole model, today's single-GPU path unchanged. Every rank of a group must
    // call forward, logits_to_host and sample together (they are collectives).
    struct Shard {
        ModelShard piece;
        comm::Communicator* attn = nullptr;        // attention TP group: out-projection partial sums
        comm::Communicator* moe = nullptr;         // every rank: the experts' partial sums
        comm::Communicator* vocab = nullptr;       // DP group: logits split by vocabulary
        comm::Communicator* host_vocab = nullptr;  // the same ranks, host memory: the argmax candidates
        // Attention data parallelism: the ranks at this rank's place in every DP group (one per group,
        // in group order), device and host. Before each MoE block the groups' tokens are gathered over
        // it, every rank applies its experts to all of them, and each group keeps its rows; forward()
        // may then get an empty batch (an idle group still joins the MoE's collectives).
        comm::Communicator* dp = nullptr;
        comm::Communicator* host_dp = nullptr;
        int ranks_on_device = 1;                   // ranks sharing this GPU (same-device tests): its KV budget is split
    };
    std::optional<Shard> shard = std::nullopt;
};

// Receives every intermediate of a forward: (step name, layer or -1, [rows, width] values).
using CudaDumpFn = std::function<void(std::string_view step, int layer, std::span<const float> values)>;

class CudaRunner : public ModelRunner {
public:
    CudaRunner(const Weights& weights, CudaRunnerOptions options = {});
    ~CudaRunner() override;

    const Config& config() const override { return config_; }
    std::string name() const override;
    KvDtype kv_dtype() const override { return options_.kv_dtype; }
    KvSpec kv_spec(int page_size) const override;  // this rank's KV heads only
    size_t kv_budget_bytes() const override;
    void allocate_kv(const KvLayout& layout) override;
    void forward(const ForwardBatch& batch) override;
    void copy_kv(const KvCopyPlan& plan) override;
    void logits_to_host(std::vector<float>& out) override;
    // EAGLE-3 hidden states: layers before the last (copied out of the residual stream where the
    // next block's norm has folded the MoE output in), kept on the device until captured_to_host.
    void set_capture_layers(std::span<const int> layers) override;
    void captured_to_host(std::vector<float>& out) override;
    void sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                std::span<SampleResult> out) override;
    // Prompt scoring: the scored rows' logits are computed on the GPU (kScoreRows at a time, into
    // buffers of their own, so the sampled rows' logits stay) and scored on the host.
    bool supports_prompt_scoring() const override { return true; }
    void take_prompt_scores(std::vector<TokenScore>& out) override;

    // Greedy tokens (argmax, lowest id on ties) of the last forward's logit rows, computed on the
    // GPU: only the token ids are copied to the host.
    void greedy(std::vector<int32_t>& out);

    // Every forward() reports its intermediates to `fn` (slow: synchronises and copies). Disables graphs.
    void set_dump(CudaDumpFn fn) { dump_ = std::move(fn); }
    // Times every step of each forward with CUDA events (eager launches, no graphs) and accumulates
    // the GPU time per step kind; profile() lists (step, total µs, calls) in first-seen order.
    void set_profile(bool on);
    struct ProfileRow {
        std::string step;
        double us = 0.0;
        long calls = 0;
    };
    std::vector<ProfileRow> profile() const { return prof_rows_; }
    const LoadStats& load_stats() const { return weights_.stats; }
    size_t weight_bytes() const { return weights_.device_bytes(); }
    cudaStream_t stream() const { return stream_.get(); }
    int graphs_captured() const { return int(graphs_.size()); }
    // Replays the last forward's CUDA graph `n` times back to back (no host work between them) and
    // returns the GPU's µs per replay, event to event: the step without host gaps, for benchmarks.
    // The replays rewrite that step's K/V rows with the same values, so later steps are unaffected.
    // Throws when the last forward ran without a graph.
    double replay_last_graph_us(int n);
    // What a graph's launches depend on besides device memory: the step's token and logit-row counts,
    // each attention plan's item counts and the K/V store rows. Metadata offsets follow from them
    // (prepare() packs fixed-size arrays first, the page table last).
    using GraphKey = std::array<int, 11>;
    // When a step shape is captured: pure decode steps at once, as they repeat every step; steps with
    // verify slices when the same shape recurs within kGraphRecurSteps graphable steps, so that the
    // shapes of occasional probes (a back-off or the adaptive policy letting one sequence propose every
    // few dozen steps) never pay a capture: on the H200 a capture on each probe's second sighting cost
    // n-gram lookup 4% at batch 1 (20b). At most kMaxGraphs are kept (beyond: eager launches).
    static constexpr int kMaxGraphs = 512;
    static constexpr int kGraphRecurSteps = 4;
    static constexpr int kMaxGraphSliceTokens = 17;  // 1 + the largest k (engine/speculative.h)

private:
    struct Step;        // host-side bookkeeping of one forward
    struct Activations; // device buffers carved from the workspace

    void check_batch(const ForwardBatch& batch) const;
    void prepare(const ForwardBatch& batch, Step& step);  // builds and uploads per-step metadata
    void run_step(const Step& step);                       // the launches (captured into graphs)
    void attention_block(int layer, const Step& step);
    void moe_block(int layer, const Step& step);
    void unembed(const Step& step);
    void apply_masks(std::span<const SamplingState> state);  // constrained decoding, before sampling
    void score_prompt(const ForwardBatch& batch);
    void dump(std::string_view name, int layer, const void* device, int rows, int width, bool bf16) const;
    void mark(const char* step);  // profiling: the GPU work since the previous mark belongs to `step`
    // What this rank computes (the whole model unless sharded): widths of its heads, its experts and
    // their columns (padded to whole 64-column tiles with zero weights), its vocabulary rows.
    struct Dims {
        int n_heads = 0, n_kv_heads = 0, q_dim = 0, kv_dim = 0;
        int first_expert = 0, n_experts = 0, d_ff = 0;
        int vocab = 0;
        bool attn_reduce = false, moe_reduce = false;  // partial sums to all-reduce
        bool dp = false;                               // the MoE runs on every DP group's tokens
    };
    static Dims make_dims(const Config& c, const CudaRunnerOptions& o);
    bool sharded() const { return options_.shard.has_value(); }
    // Whether a step of T tokens folds each block's norms into GEMV prologues (decode sizes, one GPU,
    // no dumps or hidden-state captures; $OSPREY_FUSED_NORMS=0 turns it off for A/B runs).
    bool fuse_norms(int T) const;
    // Whether a step's RoPE and K/V append run inside the decode attention kernel instead of rope()
    // (decode-only steps that store in RoPE, BF16 cache, no dumps; $OSPREY_ATTN_ROPE=0 turns it off for
    // A/B runs): one launch fewer per layer.
    bool fuse_rope(const Step& step) const;
    // Whether a step's out-projection is deferred to moe_block and launched with the router as one grid
    // (cuda::gemv_router_tail, or the two launches in order where it does not take the pair, e.g. FP8
    // out-projection weights): fused norms and $OSPREY_ROUTER_TAIL=1 (off by default until the H200
    // measures it).
    bool router_tail(int T) const;
    void gather_logits(std::vector<float>& out);  // sharded: every vocabulary row of the group's logits
    void distributed_greedy(std::vector<int32_t>& out);
    // Attention DP: the MoE of every DP group's tokens (this group's n_local rows of a.h in, its rows
    // of the reduced output in a.moe); an idle group runs it for every layer with n_local = 0.
    void moe_experts_dp(int layer, int n_local);

    Config config_;
    CudaRunnerOptions options_;
    Dims dims_;
    DeviceWeights weights_;
    RopeTable rope_;
    cuda::DeviceBuffer<float> rope_cos_, rope_sin_;  // [max_position, head_dim / 2]
    cuda::Stream stream_;
    std::unique_ptr<cuda::Blas> blas_;
    cuda::Workspace workspace_;
    std::unique_ptr<Activations> act_;
    // router_tail: the out-projection attention_block deferred for moe_block's router launch.
    std::optional<cuda::LinearArgs> deferred_out_proj_;
    cuda::DeviceBuffer<float> full_logits_;  // sharded, non-greedy sampling: the group's [R, vocab] on its first rank

    KvLayout layout_;
    std::vector<cuda::DeviceBuffer<bf16>> k_cache_, v_cache_;  // [n_layers] (layout in attention.h), bf16 cache
    // FP8 cache (kv_fp8.h): [n_layers] codes and multipliers of K and V.
    std::vector<cuda::DeviceBuffer<uint8_t>> k8_cache_, v8_cache_;
    std::vector<cuda::DeviceBuffer<float>> k8_scale_, v8_scale_;
    bool fp8_kv() const { return options_.kv_dtype == KvDtype::fp8_e4m3; }
    cuda::KvFp8 cache8(int layer);  // the layer's FP8 cache (fp8_kv())

    // Per-step metadata: packed on the host in pinned memory, uploaded with one copy.
    cuda::PinnedBuffer<uint8_t> meta_host_;
    cuda::DeviceBuffer<uint8_t> meta_device_;

    // Decode and verify steps, by shape; how often each shape with verify slices was seen.
    std::map<GraphKey, cuda::Graph> graphs_;
    std::optional<GraphKey> last_graph_key_;  // the shape whose graph the last forward replayed (benchmarks)
    std::map<GraphKey, int64_t> graph_sightings_;  // shapes with verify slices: the step last seen
    int64_t n_graph_steps_ = 0;                     // graphable steps so far
    int n_logit_rows_ = 0;
    std::vector<size_t> dp_tokens_;  // attention DP: tokens of each DP group this step
    size_t dp_first_ = 0;            // this group's first row among them
    // Constrained decoding's masks of the current step (apply_masks).
    std::vector<uint32_t> mask_host_;
    std::vector<int32_t> mask_rows_host_;
    cuda::DeviceBuffer<uint32_t> mask_device_;
    cuda::DeviceBuffer<int32_t> mask_rows_device_;
    // Prompt scoring (allocated on first use): row ids, normalised rows and logits of kScoreRows rows.
    static constexpr int kScoreRows = 64;
    cuda::DeviceBuffer<int32_t> score_rows_;  // [kScoreRows]
    cuda::DeviceBuffer<bf16> score_h_;        // [kScoreRows, d_model]
    cuda::DeviceBuffer<float> score_logits_;  // [kScoreRows, vocab]
    std::vector<TokenScore> scores_;          // of the last forward
    int n_tokens_ = 0;  // of the last forward
    std::vector<int> capture_layers_;
    cuda::DeviceBuffer<float> captured_;  // [max_tokens, capture_layers_.size() * d_model]
    CudaDumpFn dump_;
    bool profile_ = false;
    std::vector<std::unique_ptr<cuda::Event>> prof_events_;
    std::vector<const char*> prof_marks_;
    std::vector<ProfileRow> prof_rows_;
};

}  // namespace osprey::model
