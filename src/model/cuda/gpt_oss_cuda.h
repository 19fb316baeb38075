// The CUDA backend: gpt-oss's forward pass on one GPU over a ragged batch, step for step like the
// CPU reference (model/gpt_oss_ref.h: same step names, same order), as kernel launches on one
// stream. BF16 weights and activations, MXFP4 experts as shipped, an FP32 residual stream, FP32
// accumulation everywhere, BF16 K/V in a paged cache (full layers) and per-sequence 128-row rings
// (sliding layers).
//
// Step names (as the CPU reference; passed to the dump hook as [rows, width] f32), per block i:
//   attn_norm, q, k, v (q and k after RoPE), attn, resid_attn (x after the attention residual; the
//   output projection and the residual add are one GEMM), mlp_norm, router_logits, moe, resid_mlp;
//   outside the blocks (layer -1): embedding, final_norm, logits.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_store.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/runtime.h"
#include "model/cuda/device_weights.h"
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
    bool graphs = true;         // replay decode-only steps from CUDA graphs (one per batch size)
};

// Receives every intermediate of a forward: (step name, layer or -1, [rows, width] values).
using CudaDumpFn = std::function<void(std::string_view step, int layer, std::span<const float> values)>;

class CudaRunner : public ModelRunner {
public:
    CudaRunner(const Weights& weights, CudaRunnerOptions options = {});
    ~CudaRunner() override;

    const Config& config() const override { return config_; }
    std::string name() const override;
    KvDtype kv_dtype() const override { return KvDtype::bf16; }
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

private:
    struct Step;        // host-side bookkeeping of one forward
    struct Activations; // device buffers carved from the workspace

    void check_batch(const ForwardBatch& batch) const;
    void prepare(const ForwardBatch& batch, Step& step);  // builds and uploads per-step metadata
    void run_step(const Step& step);                       // the launches (captured into graphs)
    void attention_block(int layer, const Step& step);
    void moe_block(int layer, const Step& step);
    void unembed(const Step& step);
    void dump(std::string_view name, int layer, const void* device, int rows, int width, bool bf16) const;
    void mark(const char* step);  // profiling: the GPU work since the previous mark belongs to `step`

    Config config_;
    CudaRunnerOptions options_;
    DeviceWeights weights_;
    RopeTable rope_;
    cuda::DeviceBuffer<float> rope_cos_, rope_sin_;  // [max_position, head_dim / 2]
    cuda::Stream stream_;
    std::unique_ptr<cuda::Blas> blas_;
    cuda::Workspace workspace_;
    std::unique_ptr<Activations> act_;

    KvLayout layout_;
    std::vector<cuda::DeviceBuffer<bf16>> k_cache_, v_cache_;  // [n_layers] (layout in attention.h)

    // Per-step metadata: packed on the host in pinned memory, uploaded with one copy.
    cuda::PinnedBuffer<uint8_t> meta_host_;
    cuda::DeviceBuffer<uint8_t> meta_device_;

    // Decode-only steps, by (batch size, full-layer attention items, window attention items).
    std::map<std::tuple<int, int, int>, cuda::Graph> graphs_;
    int n_logit_rows_ = 0;
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
