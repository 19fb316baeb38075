// What the model-level CUDA tests share (test_cuda_forward, test_cuda_fp8_kv, test_cuda_w4a8,
// test_cuda_speculative): the synthetic tiny checkpoint, the relative L2 error and argmax of logit
// rows, random prompts, and a CPU reference / CUDA runner pair fed the same batches (same KV blocks on
// both; the CPU keeps f32, or FP8 with the option, the GPU bf16 or FP8).
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <span>
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

}  // namespace osprey::model::test
