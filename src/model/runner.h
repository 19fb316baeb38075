// A model backend that runs gpt-oss forward steps: the CPU reference (model/gpt_oss_ref.h) or the
// CUDA backend. The engine talks to models only through this interface.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/forward_batch.h"
#include "core/sampling.h"

namespace osprey::model {

struct KvLayout {
    int page_size = 32;     // tokens per page of the full-attention layers
    int n_pages = 0;        // pages shared by all sequences
    int n_window_slots = 0; // sliding-window rings (one per running sequence)
};

// A copy of cached K/V inside one backend: whole pages of the full-attention layers, src_pages[i]
// to dst_pages[i], and optionally one window slot of the sliding layers with the positions it holds.
// Afterwards a sequence using dst_pages and dst_slot continues exactly as the source would (a fork:
// parallel samples of one prompt, or a benchmark giving many sequences distinct copies of one fill).
struct KvCopy {
    std::vector<int32_t> src_pages, dst_pages;  // same length; no page on both sides
    int src_slot = -1, dst_slot = -1;           // both -1: no window slot copied
};

class ModelRunner {
public:
    virtual ~ModelRunner() = default;
    virtual const Config& config() const = 0;
    virtual std::string name() const = 0;  // "cpu-reference", "cuda:NVIDIA H200", ...

    // Bytes one page (all full-attention layers) and one window slot (all sliding layers) take.
    virtual size_t bytes_per_page(int page_size) const = 0;
    virtual size_t bytes_per_window_slot() const = 0;
    // Bytes the backend can give to the KV cache (device memory left after weights and workspace,
    // or a host budget for the CPU backend), for sizing KvLayout.
    virtual size_t kv_budget_bytes() const = 0;
    // (Re)allocates the KV storage; invalidates everything cached before.
    virtual void allocate_kv(const KvLayout& layout) = 0;
    virtual const KvLayout& kv_layout() const = 0;

    // Runs one step: writes K/V of every token into the cache and computes logits for each slice
    // that wants them, kept by the backend until the next forward().
    virtual void forward(const ForwardBatch& batch) = 0;

    // Copies K/V as `copy` says (ordered after earlier forwards, before later ones). Throws
    // osprey::Error, copying nothing, when a page or slot is out of range or the two sides overlap.
    virtual void copy_kv(const KvCopy& copy) = 0;

    // Logits of the last forward, [n_logit_rows, vocab_size] fp32, copied to the host (for tests
    // and the CPU sampler).
    virtual void logits_to_host(std::vector<float>& out) = 0;

    // Samples one token per logit row of the last forward (rows in slice order). `state` gives
    // each row's previous tokens and step index for the penalties and the seeded draw.
    virtual void sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                        std::span<SampleResult> out) = 0;
};

}  // namespace osprey::model
