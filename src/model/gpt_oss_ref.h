// The CPU reference backend: gpt-oss's forward pass over a ragged batch, written to read like
// shared/spec/gpt-oss-model.md §3 (one function per block, one comment per step). FP32 activations,
// BF16/MXFP4 weights decoded exactly, FP32 K/V in the cache. It is the executable specification that
// the CUDA path is tested against, and it is checked itself against Hugging Face transformers
// (tests/model/test_parity.cpp).
//
// Step names (shared with the CUDA forward and passed to the dump hook), per block i:
//   attn_norm, q, k, v (q and k after RoPE), attn (heads concatenated), attn_out (projection + bias),
//   resid_attn (x after the attention residual), mlp_norm, router_logits, moe (weighted expert sum),
//   resid_mlp (x after the MoE residual); and, outside the blocks (layer -1): embedding, final_norm
//   (rows that want logits), logits.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "core/bf16.h"
#include "core/thread_pool.h"
#include "model/parallel_layout.h"
#include "model/rope.h"
#include "model/runner.h"
#include "model/weights.h"

namespace osprey::model {

struct CpuReferenceOptions {
    // Host bytes offered to the KV cache (kv_budget_bytes()). 0: $OSPREY_CPU_KV_BYTES, else 2 GiB.
    size_t kv_budget_bytes = 0;
    int n_threads = 0;  // 0: the process-wide pool

    // One rank of a parallel layout (model/parallel_runner.h drives them): the heads, experts, expert
    // columns and vocabulary rows this rank computes, and the groups its partial results are summed
    // or gathered over. Unset: the whole model, no communication. Every rank of a group must call
    // forward, logits_to_host and sample together (they are collectives).
    struct Shard {
        ModelShard piece;
        comm::Communicator* attn = nullptr;   // attention TP group: out-projection partial sums
        comm::Communicator* moe = nullptr;    // MoE group: expert partial sums (every rank, every token)
        comm::Communicator* vocab = nullptr;  // DP group: logits by vocabulary rows, sampling
        // Attention DP: the ranks at this rank's place in every DP group (one per group, in group
        // order). Before each MoE block the groups' tokens are all-gathered over it, so every rank
        // applies its experts to the tokens of all groups; the MoE group (moe) is then every rank.
        // forward() may then get an empty batch (a group without work still joins the collectives).
        comm::Communicator* dp = nullptr;
    };
    std::optional<Shard> shard = std::nullopt;
};

// Receives every intermediate of a forward: (step name, layer or -1, [rows, width] values).
using DumpFn = std::function<void(std::string_view step, int layer, std::span<const float> values)>;

class CpuReference : public ModelRunner {
public:
    explicit CpuReference(Weights weights, CpuReferenceOptions options = {});

    const Config& config() const override { return config_; }
    std::string name() const override { return "cpu-reference"; }
    KvDtype kv_dtype() const override { return KvDtype::f32; }
    KvSpec kv_spec(int page_size) const override;
    size_t kv_budget_bytes() const override { return kv_budget_; }
    void allocate_kv(const KvLayout& layout) override;
    void forward(const ForwardBatch& batch) override;
    void copy_kv(const KvCopyPlan& plan) override;
    void logits_to_host(std::vector<float>& out) override;
    // Prompt scoring on a whole vocabulary (not with a vocabulary split over ranks).
    bool supports_prompt_scoring() const override;
    void take_prompt_scores(std::vector<TokenScore>& out) override;
    void sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                std::span<SampleResult> out) override;

    void set_capture_layers(std::span<const int> layers) override;
    void captured_to_host(std::vector<float>& out) override { out = captured_; }

    // Every forward() reports its intermediates to `fn` (empty: none). For layer-by-layer comparisons.
    void set_dump(DumpFn fn) { dump_ = std::move(fn); }

private:
    // Small per-layer tensors widened to FP32 once (norm gains, biases, sinks).
    // Sliced to this rank's piece: q/k/v biases and sinks by head, out_b empty unless this rank adds
    // it, mlp1_bias [local experts, 2 ff.count], mlp2_bias [local experts, d_model] or empty.
    struct LayerVectors {
        std::vector<float> attn_norm, q_b, k_b, v_b, sinks, out_b, mlp_norm, router_b, mlp1_bias, mlp2_bias;
    };
    // This rank's weights of one layer: views into the checkpoint where the piece is contiguous,
    // else into owned copies (out_w by columns, mlp2 by its input groups). Experts per local expert.
    struct LayerSlices {
        std::span<const bf16> q_w, k_w, v_w;  // [heads · head_dim, H], [kv heads · head_dim, H] x2
        std::span<const bf16> out_w;          // [H, heads · head_dim]
        std::vector<bf16> out_w_owned;
        std::vector<std::span<const uint8_t>> mlp1_blocks, mlp1_scales;  // [local][2 ff, H/32, 16], [2 ff, H/32]
        std::vector<std::span<const uint8_t>> mlp2_blocks, mlp2_scales;  // [local][H, ff/32, 16], [H, ff/32]
        std::vector<uint8_t> mlp2_owned;
    };
    // K/V of one layer, rows of kv_dim floats: pages [n_pages, page_size, kv_dim] for a paged layer,
    // rings [n_window_slots, sliding_window, kv_dim] for a ring layer (model/kv_spec.h).
    struct LayerKv {
        std::vector<float> k, v;
    };
    struct Step;  // the batch's per-token bookkeeping for one forward

    void check_batch(const ForwardBatch& batch) const;
    void attention_block(int layer, const Step& step);
    void moe_block(int layer, const Step& step);
    void store_kv(int layer, const Step& step);
    void unembed(const Step& step);
    void score_prompt(const Step& step);
    void dump(std::string_view name, int layer, std::span<const float> values) const;
    void slice_layer(int layer);
    // The logits of every vocabulary row, [n_logit_rows, vocab] (gathered from the ranks when split).
    void gather_logits(std::vector<float>& out);
    bool distributed_greedy(std::span<const SamplingParams> params, std::span<SampleResult> out);

    Weights weights_;
    Config config_;
    std::unique_ptr<ThreadPool> own_pool_;  // when options.n_threads > 0
    ThreadPool* pool_ = nullptr;
    size_t kv_budget_ = 0;
    RopeTable rope_;
    std::vector<LayerVectors> vectors_;        // [n_layers]
    std::vector<LayerSlices> slices_;          // [n_layers]
    ModelShard piece_;                         // what this rank computes (the whole model unless sharded)
    comm::Communicator* attn_comm_ = nullptr;  // null: nothing to reduce
    comm::Communicator* moe_comm_ = nullptr;
    comm::Communicator* vocab_comm_ = nullptr;
    comm::Communicator* dp_comm_ = nullptr;  // null, or size 1: no other DP group
    int q_local_ = 0, kv_local_ = 0;         // this rank's q and kv widths (heads · head_dim)
    std::vector<float> final_norm_;          // [d_model]
    KvLayout layout_;
    std::vector<LayerKv> kv_;  // [n_layers]
    DumpFn dump_;

    // Activations of the current step, [n_tokens, width] each.
    std::vector<float> x_, xn_, q_, k_, v_, attn_, proj_, router_, moe_;
    std::vector<int32_t> expert_ids_;    // [n_tokens, top_k]
    std::vector<float> expert_weights_;  // [n_tokens, top_k]
    std::vector<float> logits_;          // [n_logit_rows, piece_.vocab.count]
    // Attention DP: tokens of every DP group this step ([dp groups]) and this group's first row in
    // the gathered MoE input; xn_all_, moe_all_ [Σ dp_tokens_, d_model]. Empty without DP.
    std::vector<size_t> dp_tokens_;
    size_t dp_first_ = 0;
    std::vector<float> xn_all_, moe_all_;
    int n_logit_rows_ = 0;
    std::vector<TokenScore> scores_;  // of the last forward (prompt scoring)
    std::vector<int> capture_layers_;  // EAGLE-3: layers whose output is kept per token
    std::vector<float> captured_;      // [n_tokens, capture_layers_.size() * d_model]
};

}  // namespace osprey::model
