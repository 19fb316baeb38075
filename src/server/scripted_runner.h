// TEST ONLY: a ModelRunner that "generates" a fixed token script whatever the prompt (token i of
// every sample is script[i]; past the end it repeats the last token). `osprey serve` uses it only
// when $OSPREY_TEST_SCRIPT is set, so the Python client tests can drive a real tool-call round trip
// (a random-weight model never calls a tool by itself). The config is the tiny preset's.
#pragma once

#include <chrono>
#include <vector>

#include "model/runner.h"

namespace osprey::server {

class ScriptedRunner : public model::ModelRunner {
public:
    ScriptedRunner(model::Config config, std::vector<int32_t> script);
    // Makes every forward() take at least this long (a model's pace, for cancellation tests).
    void set_step_delay(std::chrono::microseconds delay) { step_delay_ = delay; }

    const model::Config& config() const override { return config_; }
    std::string name() const override { return "scripted (test only)"; }
    size_t bytes_per_page(int page_size) const override { return size_t(page_size) * 16; }
    size_t bytes_per_window_slot() const override { return size_t(config_.sliding_window) * 16; }
    size_t kv_budget_bytes() const override { return size_t(64) << 20; }
    void allocate_kv(const model::KvLayout& layout) override { layout_ = layout; }
    const model::KvLayout& kv_layout() const override { return layout_; }
    void forward(const model::ForwardBatch& batch) override;
    void copy_kv(const model::KvCopy& copy) override;  // checks the copy; there is no K/V to move
    void logits_to_host(std::vector<float>& out) override;
    void sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                std::span<SampleResult> out) override;

private:
    model::Config config_;
    std::vector<int32_t> script_;
    model::KvLayout layout_;
    int n_logit_rows_ = 0;
    std::chrono::microseconds step_delay_{0};
};

}  // namespace osprey::server
