// TEST ONLY scripted model backend (see scripted_runner.h).
#include "model/scripted_runner.h"

#include <algorithm>
#include <thread>

#include "core/check.h"
#include "model/batch_check.h"

namespace osprey::model {

ScriptedRunner::ScriptedRunner(Config config, std::vector<int32_t> script)
    : ScriptedRunner(std::move(config), std::vector<std::vector<int32_t>>{std::move(script)}) {}

ScriptedRunner::ScriptedRunner(Config config, std::vector<std::vector<int32_t>> scripts)
    : config_(std::move(config)), scripts_(std::move(scripts)) {
    OSPREY_CHECK(!scripts_.empty(), "no test script");
    for (const auto& script : scripts_) {
        OSPREY_CHECK(!script.empty(), "a test script has no tokens");
        for (int32_t t : script)
            OSPREY_CHECK(t >= 0 && t < config_.vocab_size, "script token ", t, " outside the vocabulary");
    }
}

void ScriptedRunner::allocate_kv(const KvLayout& layout) {
    layout.check("scripted");
    OSPREY_CHECK(layout.bytes() <= kv_budget_bytes(), "scripted: KV layout needs ", layout.bytes(),
                 " bytes, budget is ", kv_budget_bytes());
    layout_ = layout;
}

void ScriptedRunner::copy_kv(const KvCopyPlan& plan) {
    check_kv_copy_plan(plan, layout_);
}

void ScriptedRunner::forward(const ForwardBatch& batch) {
    check_forward_batch(batch, config_, layout_);
    n_logit_rows_ = batch.n_logit_rows();
    if (step_delay_.count() > 0) std::this_thread::sleep_for(step_delay_);
}

void ScriptedRunner::logits_to_host(std::vector<float>& out) {
    out.assign(size_t(n_logit_rows_) * size_t(config_.vocab_size), 0.0f);
}

void ScriptedRunner::sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                            std::span<SampleResult> out) {
    OSPREY_CHECK(state.size() == out.size() && params.size() == out.size(), "sample: span sizes differ");
    for (size_t i = 0; i < out.size(); ++i) {
        const size_t step = size_t(state[i].step);
        constexpr int32_t kCall = 200012;  // <|call|>: one per earlier tool call in the prompt
        const size_t turn = size_t(std::count(state[i].prompt_tokens, state[i].prompt_tokens + state[i].n_prompt_tokens, kCall));
        const std::vector<int32_t>& script = scripts_[std::min(turn, scripts_.size() - 1)];
        out[i].token = script[std::min(step, script.size() - 1)];
        if (const uint32_t* allowed = state[i].allowed; allowed && !((allowed[out[i].token >> 5] >> (out[i].token & 31)) & 1)) {
            // Constrained decoding: a scripted token the mask refuses is replaced by an allowed one,
            // drawn from (seed, step) (so tests get arbitrary yet valid constrained output).
            std::vector<int32_t> ok;
            for (int32_t t = 0; t < config_.vocab_size; ++t)
                if ((allowed[t >> 5] >> (t & 31)) & 1) ok.push_back(t);
            OSPREY_CHECK(!ok.empty(), "scripted: the constraint allows no token");
            uint64_t x = params[i].seed ^ (uint64_t(step) * 0x9E3779B97F4A7C15ull);
            x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;
            out[i].token = ok[size_t((x ^ (x >> 29)) % ok.size())];
        }
        out[i].logprob = 0.0f;
        out[i].top.clear();
        if (params[i].top_logprobs > 0) out[i].top.push_back({out[i].token, 0.0f});
    }
}

}  // namespace osprey::model
