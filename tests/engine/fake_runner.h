// A deterministic stand-in for a model backend, for engine tests. Its "K/V" is the token and the
// position written at each page row and window row; the logits of a row are a hash of the whole
// history read back from the pages (full layers) and the window slot (sliding layers). Any
// bookkeeping mistake (wrong page, slot, position, a skipped or overwritten row) either fails a
// check here (osprey::Error) or changes the output. reference_logits() gives the expected logits
// of a token history directly, as an oracle independent of the cache.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/runner.h"

namespace osprey::test {

struct FakeRunnerOptions {
    int vocab_size = 384;
    int sliding_window = 128;
    size_t kv_budget_bytes = size_t(1) << 20;
    int max_position = 4096;
    int dp_groups = 1;  // > 1: one cache per data-parallel group (slices and copy plans name theirs)
};

class FakeRunner : public model::ModelRunner {
public:
    explicit FakeRunner(FakeRunnerOptions options = {});

    const model::Config& config() const override { return config_; }
    std::string name() const override { return "fake"; }
    // f32 rows of kv_dim 4 (one head of 4): 32 bytes per position and layer, as the spec computes.
    model::KvDtype kv_dtype() const override { return model::KvDtype::f32; }
    size_t kv_budget_bytes() const override { return options_.kv_budget_bytes; }
    int dp_groups() const override { return options_.dp_groups; }
    void allocate_kv(const model::KvLayout& layout) override;
    void forward(const model::ForwardBatch& batch) override;
    void copy_kv(const model::KvCopyPlan& plan) override;
    void logits_to_host(std::vector<float>& out) override { out = logits_; }
    void sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                std::span<SampleResult> out) override;

    // Logits after `history` (positions 0 .. size-1), as the cache would give them. [vocab_size]
    static std::vector<float> reference_logits(std::span<const int32_t> history, int vocab_size, int sliding_window);

    int64_t n_forward_calls() const { return n_forward_; }
    int64_t n_tokens_run() const { return n_tokens_; }
    int64_t n_window_only_tokens() const { return n_window_only_; }  // replayed after prefix hits
    int max_batch_seen() const { return max_batch_; }
    int64_t n_tokens_in_group(int g) const { return n_group_tokens_[size_t(g)]; }
    bool fail_next_forward = false;  // makes the next forward() throw (error-path tests)

private:
    struct Row {
        int32_t token = -1;
        int32_t pos = -1;
    };
    FakeRunnerOptions options_;
    model::Config config_;
    model::KvLayout layout_;
    std::vector<std::vector<Row>> pages_;   // [dp_groups][n_pages, page_size]
    std::vector<std::vector<Row>> window_;  // [dp_groups][n_window_slots, sliding_window]
    std::vector<float> logits_;  // [n_logit_rows, vocab_size]
    int64_t n_forward_ = 0, n_tokens_ = 0, n_window_only_ = 0;
    int max_batch_ = 0;
    std::vector<int64_t> n_group_tokens_;  // [dp_groups]
};

}  // namespace osprey::test
