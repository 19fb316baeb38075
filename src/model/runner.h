// A model backend that runs gpt-oss forward steps: the CPU reference (model/gpt_oss_ref.h) or the
// CUDA backend. The engine talks to models only through this interface.
//
// A backend is storage and compute only. The KV cache's layout is data (model/kv_spec.h) and the
// engine is its only bookkeeper: it sizes the cache from the spec, decides which pages and ring
// slots each sequence uses and which positions each ring holds, and says so in every forward batch
// (model/forward_batch.h) and copy plan. A backend allocates what the layout says, runs forwards and
// executes copy plans; it keeps no KV state of its own beyond the bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/sampling.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/kv_spec.h"

namespace osprey::model {

class ModelRunner {
public:
    virtual ~ModelRunner() = default;
    virtual const Config& config() const = 0;
    virtual std::string name() const = 0;  // "cpu-reference", "cuda:NVIDIA H200", ...

    // The element type this backend keeps K/V in: with the config and a page size it makes the
    // KvSpec that sizes the cache.
    virtual KvDtype kv_dtype() const = 0;
    // The KV layout at `page_size` that allocate_kv() takes: the spec of the config and kv_dtype(),
    // or, for a backend split over tensor-parallel ranks, of one rank (each holds its KV heads only,
    // so bytes per page shrink; the engine sizes and addresses the cache the same way).
    virtual KvSpec kv_spec(int page_size) const { return KvSpec(config(), kv_dtype(), page_size); }
    // KV caches the backend keeps: one per data-parallel group (attention DP, model/parallel_layout.h).
    // Each is a whole KvLayout (the one allocate_kv() takes, on kv_budget_bytes() per rank), with its
    // own page and slot ids; forward slices and copy plans name their group. 1 unless DP is on.
    virtual int dp_groups() const { return 1; }
    // Bytes the backend can give to the KV cache (device memory left after weights and workspace,
    // or a host budget for the CPU backend); per rank for a parallel backend, like kv_spec().
    virtual size_t kv_budget_bytes() const = 0;
    // (Re)allocates the KV storage for `layout` (whose spec must use kv_dtype()); invalidates
    // everything cached before. Throws osprey::Error when it does not fit the budget.
    virtual void allocate_kv(const KvLayout& layout) = 0;

    // Runs one step: writes K/V of every token into the cache and computes logits for each slice
    // that wants them, kept by the backend until the next forward().
    virtual void forward(const ForwardBatch& batch) = 0;

    // Executes a copy plan (plan_kv_copy), ordered after earlier forwards and before later ones.
    // Throws osprey::Error, copying nothing, when a run lies outside the allocated layout.
    virtual void copy_kv(const KvCopyPlan& plan) = 0;

    // Logits of the last forward, [n_logit_rows, vocab_size] fp32, copied to the host (for tests
    // and the CPU sampler).
    virtual void logits_to_host(std::vector<float>& out) = 0;

    // Samples one token per logit row of the last forward (rows in slice order). `state` gives
    // each row's previous tokens and step index for the penalties and the seeded draw.
    virtual void sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                        std::span<SampleResult> out) = 0;

    // Prompt scoring: whether forward() honours SequenceSlice::score_targets (false: it must not be
    // given any), and the scores of the last forward, one per scored position in slice order.
    virtual bool supports_prompt_scoring() const { return false; }
    virtual void take_prompt_scores(std::vector<TokenScore>& out) { out.clear(); }
    // Hidden states for an EAGLE-3 head (engine/speculative.h): after set_capture_layers(L), every
    // forward also keeps the residual stream after each listed layer (0-based: the output of block
    // l, Hugging Face's hidden_states[l + 1]) for every token, and captured_to_host() gives the last
    // forward's as [n_tokens, L.size() * d_model] fp32, token order, layers in the order given.
    // An empty list turns it off. Backends that cannot throw osprey::Error.
    virtual void set_capture_layers(std::span<const int> layers) {
        OSPREY_CHECK(layers.empty(), name(), ": this backend cannot expose hidden states (EAGLE-3)");
    }
    virtual void captured_to_host(std::vector<float>& out) {
        (void)out;
        OSPREY_FAIL(name(), ": this backend cannot expose hidden states (EAGLE-3)");
    }
};

// The layout of `runner`'s spec at `page_size` with these block counts (for callers that size a
// cache themselves: benchmarks, tests, single-sequence generation).
inline KvLayout kv_layout_for(const ModelRunner& runner, int page_size, int n_pages, int n_window_slots) {
    KvLayout layout;
    layout.spec = runner.kv_spec(page_size);
    layout.n_pages = n_pages;
    layout.n_window_slots = n_window_slots;
    return layout;
}

}  // namespace osprey::model
