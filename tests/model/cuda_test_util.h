// What the model-level CUDA tests share (test_cuda_forward, test_cuda_fp8_kv, test_cuda_fp8_weights,
// test_cuda_matrix_experts, test_cuda_w4a8, test_cuda_speculative): the synthetic tiny checkpoint, the
// relative L2 error and argmax of logit rows, random prompts, a CPU reference / CUDA runner pair fed the
// same batches (same KV blocks on both; the CPU keeps f32, or FP8 with the option, the GPU bf16 or FP8),
// and the two checks every weight or KV format runs on such a pair (a prompt in chunks then greedy
// steps; every intermediate layer by layer), each test keeping its own bounds.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/cuda/gpt_oss_cuda.h"
#include "model/gpt_oss_ref.h"
#include "model/synthetic.h"
#include "model/test_reference_util.h"

namespace osprey::model::test {

// ||got - want|| / ||want||; infinite when got has a NaN or an infinity.
inline double rel_l2(std::span<const float> got, std::span<const float> want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
        den += double(want[i]) * want[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

inline int argmax(std::span<const float> row) {
    return int(std::max_element(row.begin(), row.end()) - row.begin());
}

// The synthetic tiny checkpoint (4 layers, d_model 128, 8 query / 1 KV heads, 8 experts, real vocab and
// RoPE, sliding window 128), written once per process.
inline const Weights& tiny_weights() {
    static const Weights w = [] {
        const auto dir = synthetic_checkpoint("cuda-tiny", preset_config("tiny"), 7);
        return Weights::load(dir);
    }();
    return w;
}

inline std::vector<int32_t> random_prompt(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = int32_t(rng() % 200000);
    return t;
}

// The runner options the pair tests use (1024 tokens, 16 logit rows, 16 slices per step), with a BF16
// or an FP8 KV cache.
inline CudaRunnerOptions tiny_cuda_options(bool graphs, KvDtype kv_dtype = KvDtype::bf16) {
    return CudaRunnerOptions{.max_tokens = 1024, .max_logit_rows = 16, .max_slices = 16, .progress = false,
                             .graphs = graphs, .kv_dtype = kv_dtype};
}

struct CudaCpuPair {
    CpuReference cpu;
    CudaRunner gpu;
    KvLayout gpu_layout;  // the same blocks in both
    CudaCpuPair(const Weights& w, const CpuReferenceOptions& cpu_options, const CudaRunnerOptions& gpu_options)
        : cpu(w, cpu_options), gpu(w, gpu_options) {
        cpu.allocate_kv(kv_layout_for(cpu, 16, 256, 8));
        gpu_layout = kv_layout_for(gpu, 16, 256, 8);
        gpu.allocate_kv(gpu_layout);
    }
    // Same batch on both; returns the worst relative logit error over the rows.
    double forward(const ForwardBatch& b, std::vector<float>* gpu_logits = nullptr,
                   std::vector<float>* cpu_logits = nullptr) {
        cpu.forward(b);
        gpu.forward(b);
        std::vector<float> lc, lg;
        cpu.logits_to_host(lc);
        gpu.logits_to_host(lg);
        if (lc.size() != lg.size()) return INFINITY;
        const int V = cpu.config().vocab_size;
        double worst = 0;
        for (size_t r = 0; r < lc.size() / V; ++r)
            worst = std::max(worst, rel_l2(std::span(lg).subspan(r * V, V), std::span(lc).subspan(r * V, V)));
        if (gpu_logits) *gpu_logits = lg;
        if (cpu_logits) *cpu_logits = lc;
        return worst;
    }
};

// `prompt` in chunks of the given sizes (200 + 120 of 320 tokens: the second chunk's window reaches into
// the ring), then 32 greedy steps: every logit row within `bound` of the reference's, and the GPU's own
// argmax (logits stay on the device) picking the reference's token at every step. `label` prefixes the
// printed errors.
inline void prompt_in_chunks_then_32_greedy_steps(CudaCpuPair& p, const std::vector<int32_t>& prompt,
                                                  std::initializer_list<int> chunks, double bound,
                                                  std::string_view label = "") {
    const std::string tag(label);
    Seq s;
    s.tokens = prompt;
    s.pages = pages_from(0, 40);
    s.window_slot = 3;
    std::vector<float> lc;
    for (int n : chunks) {
        ForwardBatch b;
        b.tokens.assign(s.tokens.begin() + s.n_computed, s.tokens.begin() + s.n_computed + n);
        b.slices.push_back(slice_for(s, 0, n));
        const double err = p.forward(b, nullptr, &lc);
        std::printf("  %sprefill chunk of %d: logits rel err %.2e\n", tag.c_str(), n, err);
        EXPECT_LT(err, bound);
        s.n_computed += n;
    }
    int next = argmax(lc);
    double worst = 0;
    for (int i = 0; i < 32; ++i) {
        s.tokens.push_back(next);
        ForwardBatch b;
        b.tokens = {next};
        b.slices.push_back(slice_for(s, 0, 1));
        worst = std::max(worst, p.forward(b, nullptr, &lc));
        s.n_computed += 1;
        std::vector<int32_t> greedy;
        p.gpu.greedy(greedy);
        ASSERT_EQ(greedy.size(), 1u);
        next = argmax(lc);
        EXPECT_EQ(greedy[0], next) << "greedy step " << i;
    }
    std::printf("  %s32 decode steps: worst logits rel err %.2e\n", tag.c_str(), worst);
    EXPECT_LT(worst, bound);
}

// b on both runners with their dumps on: every intermediate the GPU dumps has a reference counterpart of
// the same size within bound(name) (relative L2; name is "step@layer"), and there are at least 4 · 10 + 3
// of them (the tiny model's 4 layers). The dumps are switched off again afterwards.
template <class Bound>
void expect_steps_match(CudaCpuPair& p, const ForwardBatch& b, Bound&& bound, std::string_view label = "") {
    const std::string tag(label);
    std::map<std::string, std::vector<float>> cpu_steps, gpu_steps;
    auto key = [](std::string_view step, int layer) { return std::string(step) + "@" + std::to_string(layer); };
    p.cpu.set_dump([&](std::string_view step, int layer, std::span<const float> v) {
        cpu_steps[key(step, layer)].assign(v.begin(), v.end());
    });
    p.gpu.set_dump([&](std::string_view step, int layer, std::span<const float> v) {
        gpu_steps[key(step, layer)].assign(v.begin(), v.end());
    });
    p.forward(b);
    p.cpu.set_dump({});
    p.gpu.set_dump({});
    int compared = 0;
    for (const auto& [name, g] : gpu_steps) {
        auto it = cpu_steps.find(name);
        ASSERT_NE(it, cpu_steps.end()) << name << " is not a reference step";
        ASSERT_EQ(it->second.size(), g.size()) << name;
        const double err = rel_l2(g, it->second);
        std::printf("  %s%-20s rel err %.2e\n", tag.c_str(), name.c_str(), err);
        EXPECT_LT(err, bound(name)) << name;
        ++compared;
    }
    EXPECT_GE(compared, 4 * 10 + 3);
}

// A one-slice prefill batch of `tokens` (pages 0..19).
inline ForwardBatch prefill_batch(const std::vector<int32_t>& tokens) {
    Seq s;
    s.tokens = tokens;
    s.pages = pages_from(0, 20);
    ForwardBatch b;
    b.tokens = s.tokens;
    b.slices.push_back(slice_for(s, 0, int(tokens.size())));
    return b;
}

}  // namespace osprey::model::test
