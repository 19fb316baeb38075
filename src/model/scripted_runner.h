// TEST ONLY: a ModelRunner that "generates" a fixed token script whatever the prompt (token i of
// every sample is script[i]; past the end it repeats the last token). `osprey serve` uses it only
// when $OSPREY_TEST_SCRIPT is set, so the Python client tests can drive a real tool-call round trip
// (a random-weight model never calls a tool by itself). The config is the tiny preset's.
// Several scripts make an agent loop: a prompt holding k tool calls (<|call|> tokens: k turns of
// tool use so far) gets script k (the last one past the end). A scripted token that a constrained
// request's mask refuses is replaced by an allowed one drawn from the seed.
#pragma once

#include <chrono>
#include <vector>

#include "model/runner.h"

namespace osprey::model {

class ScriptedRunner : public ModelRunner {
public:
    ScriptedRunner(Config config, std::vector<int32_t> script);
    ScriptedRunner(Config config, std::vector<std::vector<int32_t>> scripts);
    // Makes every forward() take at least this long (a model's pace, for cancellation tests).
    void set_step_delay(std::chrono::microseconds delay) { step_delay_ = delay; }

    const Config& config() const override { return config_; }
    std::string name() const override { return "scripted (test only)"; }
    KvDtype kv_dtype() const override { return KvDtype::f32; }
    // A budget as if K/V were stored, so that the engine sizes a cache like the CPU backend's would.
    size_t kv_budget_bytes() const override { return size_t(1) << 30; }
    void allocate_kv(const KvLayout& layout) override;
    void forward(const ForwardBatch& batch) override;
    void copy_kv(const KvCopyPlan& plan) override;  // checks the plan; there is no K/V to move
    void logits_to_host(std::vector<float>& out) override;
    void sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                std::span<SampleResult> out) override;

private:
    Config config_;
    std::vector<std::vector<int32_t>> scripts_;
    KvLayout layout_;
    int n_logit_rows_ = 0;
    std::chrono::microseconds step_delay_{0};
};

}  // namespace osprey::model
