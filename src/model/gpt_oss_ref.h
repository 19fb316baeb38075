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
#include "kernels/cpu/fp8_matmul.h"
#include "model/parallel_layout.h"
#include "model/rope.h"
#include "model/runner.h"
#include "model/weights.h"

namespace osprey::model {

struct CpuReferenceOptions {
    // Host bytes offered to the KV cache (kv_budget_bytes()). 0: $OSPREY_CPU_KV_BYTES, else 2 GiB.
    size_t kv_budget_bytes = 0;
    int n_threads = 0;  // 0: the process-wide pool
    // f32 (exact), or fp8_e4m3 (--kv-cache-dtype fp8: E4M3 codes with one multiplier per row and KV
    // head, model/kv_spec.h); the sinks stay FP32 either way.
    KvDtype kv_dtype = KvDtype::f32;
    // MXFP4 expert projections in the W4A8 arithmetic of the GPU's FP8 GEMM (kernels/cpu/w4a8_matmul.h:
    // activations quantised to E4M3 per row and 128-k block, weights exact), for measuring its error
    // layer by layer on the CPU (osprey accuracy --moe-gemm w4a8). Every batch size, unlike the GPU's
    // prefill-only switch.
    bool moe_w4a8 = false;
    // FP8 expert projections in the W8A8 arithmetic of the GPU's matrix-expert GEMM
    // (kernels/cpu/w8a8_matmul.h: activations quantised to E4M3 per row and 128-k block; u rounded to BF16
    // before its quantisation, as the GPU stores it), the reference of the CUDA runner's FP8 experts.
    // Unset, FP8 experts are W8A16 (cpu::fp8_matmul on the FP32 activations). MXFP4 and BF16 experts
    // ignore it. Every batch size; a parallel layout's expert columns must start at multiples of 128.
    bool moe_w8a8 = false;

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
    KvDtype kv_dtype() const override { return kv_dtype_; }
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
    // One [n_out, n_in] weight as this rank's matmuls read it, in the form it is stored: BF16 rows,
    // an FP8 block-scaled window (cpu::Fp8Matrix) or MXFP4 blocks and scales. Exactly one is set.
    struct Linear {
        std::span<const bf16> dense;              // [n_out, n_in] BF16
        cpu::Fp8Matrix fp8;                       // window [n_out, n_in] of the whole matrix
        std::span<const uint8_t> blocks, scales;  // [n_out, n_in/32, 16], [n_out, n_in/32] MXFP4
        static Linear of_bf16(std::span<const bf16> w) {
            Linear l;
            l.dense = w;
            return l;
        }
        static Linear of_fp8(const cpu::Fp8Matrix& w) {
            Linear l;
            l.fp8 = w;
            return l;
        }
        static Linear of_mxfp4(std::span<const uint8_t> blocks, std::span<const uint8_t> scales) {
            Linear l;
            l.blocks = blocks;
            l.scales = scales;
            return l;
        }
    };
    // This rank's weights of one layer: views into the checkpoint where the piece is contiguous (an
    // FP8 window always is), else into owned copies (BF16 out_w by columns, MXFP4 mlp2 by its input
    // groups, BF16 mlp2 by columns). Experts per local expert.
    struct LayerSlices {
        Linear q_w, k_w, v_w;  // [heads · head_dim, H], [kv heads · head_dim, H] x2
        Linear out_w;          // [H, heads · head_dim]
        std::vector<bf16> out_w_owned;
        std::vector<Linear> mlp1, mlp2;  // [local] [2 ff, H], [H, ff]
        std::vector<uint8_t> mlp2_owned;
        std::vector<std::vector<bf16>> mlp2_bf16_owned;
    };
    // K/V of one layer, rows of kv_dim values: pages [n_pages, page_size, kv_dim] for a paged layer,
    // rings [n_window_slots, sliding_window, kv_dim] for a ring layer (model/kv_spec.h). FP32 rows
    // (k, v), or FP8 codes (k8, v8) with a multiplier per row and KV head (k_scale, v_scale [rows, heads]).
    struct LayerKv {
        std::vector<float> k, v;
        std::vector<uint8_t> k8, v8;
        std::vector<float> k_scale, v_scale;
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
    void linear(std::span<float> y, std::span<const float> x, const Linear& w, std::span<const float> bias,
                int n_rows, int n_in, int n_out);
    // An expert projection: linear(), or with moe_w8a8 and FP8 weights the W8A8 arithmetic.
    void expert_linear(std::span<float> y, std::span<const float> x, const Linear& w, std::span<const float> bias,
                       int n_rows, int n_in, int n_out);
    // The logits of every vocabulary row, [n_logit_rows, vocab] (gathered from the ranks when split).
    void gather_logits(std::vector<float>& out);
    bool distributed_greedy(std::span<const SamplingParams> params, std::span<SampleResult> out);

    Weights weights_;
    Config config_;
    std::unique_ptr<ThreadPool> own_pool_;  // when options.n_threads > 0
    ThreadPool* pool_ = nullptr;
    size_t kv_budget_ = 0;
    KvDtype kv_dtype_ = KvDtype::f32;
    bool moe_w4a8_ = false;
    bool moe_w8a8_ = false;
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
    Linear unembedding_;                     // [piece_.vocab.count, d_model]
    KvLayout layout_;
    std::vector<LayerKv> kv_;  // [n_layers]
    DumpFn dump_;

    // Activations of the current step, [n_tokens, width] each.
    std::vector<float> x_, xn_, q_, k_, v_, attn_, proj_, router_, moe_;
    std::vector<uint8_t> k8_, v8_;        // FP8 KV: this step's rows as codes [n_tokens, kv width]
    std::vector<float> k_scale_, v_scale_;  // and multipliers [n_tokens, kv heads]
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
