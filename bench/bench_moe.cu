// MoE step at gpt-oss-20b / 120b shapes on the GPU: each stage (route, group, mlp1, mlp2, combine)
// and the whole step, for decode (1, 8, 64 tokens) and prefill (256, 1k, 8k tokens), both expert
// GEMM configurations. Bytes count what must move at least: the active experts' MXFP4 weights
// (4.25 bits/weight + BF16 bias) and the activations; FLOPs are 2·rows·n_out·n_in per projection.
// Two layers of weights alternate between runs so that no run finds the previous one's weights in L2.
//   usage: bench_moe [20b|120b|all]
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/moe_group.h"
#include "kernels/cuda/moe_mlp_mxfp4.h"
#include "kernels/cuda/moe_route.h"
#include "tests/kernels/ref_moe.h"

using namespace osprey;
using cuda::DeviceBuffer;
using cuda::MoeKernel;

namespace {

constexpr int kLayers = 2;  // weight sets alternated between runs
constexpr int kInputs = 4;  // input sets (tokens, routing) rotated between runs
constexpr int kTopK = 4;

struct Layer {
    test::Mxfp4Projection mlp1, mlp2;
    Layer(int n_experts, int d_model, int d_ff, uint64_t seed)
        : mlp1(n_experts, 2 * d_ff, d_model, seed, 116, false), mlp2(n_experts, d_model, d_ff, seed + 7, 116, false) {}
};

struct Inputs {  // one batch, routed and grouped
    DeviceBuffer<bf16> x;
    DeviceBuffer<float> logits, w, out;
    DeviceBuffer<int32_t> ids, offsets, sorted, scratch;
    DeviceBuffer<bf16> u;
    DeviceBuffer<float> y;
    int n_active = 0;  // experts with at least one row
};

template <typename T>
void fill_random(DeviceBuffer<T>& d, size_t n, std::mt19937& rng, float lo, float hi) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<T> h(n);
    for (auto& v : h) {
        if constexpr (std::is_same_v<T, bf16>) {
            v = float_to_bf16(dist(rng));
        } else {
            v = dist(rng);
        }
    }
    d.resize(n);
    d.upload(h);
}

void run_shape(const char* name, int n_experts) {
    const int d_model = 2880, d_ff = 2880;
    std::printf("\n== gpt-oss-%s experts: %d experts, d_model %d, d_ff %d, top-%d ==\n", name, n_experts, d_model,
                d_ff, kTopK);
    std::vector<std::unique_ptr<Layer>> layers;
    for (int l = 0; l < kLayers; ++l) layers.push_back(std::make_unique<Layer>(n_experts, d_model, d_ff, 1000 + 17 * l));
    std::mt19937 rng(42);
    const double w1_bytes = 2.0 * d_ff * (d_model / 32) * 17 + 2.0 * 2 * d_ff;  // one expert: blocks+scales+bias
    const double w2_bytes = double(d_model) * (d_ff / 32) * 17 + 2.0 * d_model;

    for (int n_tokens : {1, 8, 64, 128, 256, 1024, 8192}) {
        const int n_rows = n_tokens * kTopK;
        std::vector<Inputs> in(kInputs);
        double n_active = 0;
        for (auto& b : in) {
            fill_random(b.x, size_t(n_tokens) * d_model, rng, -2.0f, 2.0f);
            fill_random(b.logits, size_t(n_tokens) * n_experts, rng, -4.0f, 4.0f);
            fill_random(b.out, size_t(n_tokens) * d_model, rng, -1.0f, 1.0f);
            b.w.resize(n_rows), b.ids.resize(n_rows), b.offsets.resize(n_experts + 1), b.sorted.resize(n_rows);
            b.scratch.resize(std::max<size_t>(1, cuda::moe_group_scratch_elems(n_tokens, kTopK, n_experts)));
            b.u.resize(size_t(n_rows) * d_ff), b.y.resize(size_t(n_rows) * d_model);
            cuda::moe_route_topk({.expert_ids = b.ids.get(), .expert_weights = b.w.get(), .logits = b.logits.get(),
                                  .n_tokens = n_tokens, .n_experts = n_experts, .top_k = kTopK}, nullptr);
            cuda::moe_group_by_expert({.expert_offsets = b.offsets.get(), .sorted_rows = b.sorted.get(),
                                       .scratch = b.scratch.get(), .expert_ids = b.ids.get(), .n_tokens = n_tokens,
                                       .n_experts = n_experts, .top_k = kTopK}, nullptr);
            const std::vector<int32_t> off = b.offsets.download();
            for (int e = 0; e < n_experts; ++e) b.n_active += off[e + 1] > off[e];
            n_active += double(b.n_active) / kInputs;
        }
        auto mlp1 = [&](int i, MoeKernel k) {
            Inputs& b = in[i % kInputs];
            cuda::moe_mlp1({.u = b.u.get(), .x = b.x.get(), .w = layers[i % kLayers]->mlp1.view(),
                            .expert_offsets = b.offsets.get(), .sorted_rows = b.sorted.get(), .n_tokens = n_tokens,
                            .n_experts = n_experts, .top_k = kTopK, .d_model = d_model, .d_ff = d_ff, .kernel = k},
                           nullptr);
        };
        auto mlp2 = [&](int i, MoeKernel k) {
            Inputs& b = in[i % kInputs];
            cuda::moe_mlp2({.y = b.y.get(), .u = b.u.get(), .w = layers[i % kLayers]->mlp2.view(),
                            .expert_offsets = b.offsets.get(), .sorted_rows = b.sorted.get(), .n_tokens = n_tokens,
                            .n_experts = n_experts, .top_k = kTopK, .d_model = d_model, .d_ff = d_ff, .kernel = k},
                           nullptr);
        };
        auto route = [&](int i) {
            Inputs& b = in[i % kInputs];
            cuda::moe_route_topk({.expert_ids = b.ids.get(), .expert_weights = b.w.get(), .logits = b.logits.get(),
                                  .n_tokens = n_tokens, .n_experts = n_experts, .top_k = kTopK}, nullptr);
        };
        auto group = [&](int i) {
            Inputs& b = in[i % kInputs];
            cuda::moe_group_by_expert({.expert_offsets = b.offsets.get(), .sorted_rows = b.sorted.get(),
                                       .scratch = b.scratch.get(), .expert_ids = b.ids.get(), .n_tokens = n_tokens,
                                       .n_experts = n_experts, .top_k = kTopK}, nullptr);
        };
        auto combine = [&](int i) {
            Inputs& b = in[i % kInputs];
            cuda::moe_combine({.out = b.out.get(), .y = b.y.get(), .expert_weights = b.w.get(), .n_tokens = n_tokens,
                               .d_model = d_model, .top_k = kTopK}, nullptr);
        };
        const int iters = n_tokens >= 1024 ? 10 : 50;
        const double act1 = 2.0 * n_tokens * d_model + 2.0 * n_rows * d_ff;     // x read, u written
        const double act2 = 2.0 * n_rows * d_ff + 4.0 * n_rows * d_model;       // u read, y written
        const double fl1 = 2.0 * n_rows * 2 * d_ff * d_model, fl2 = 2.0 * n_rows * d_model * d_ff;
        char label[96];
        std::printf("-- %d tokens (%d routed rows, %.1f active experts on average, automatic choice: %s)\n", n_tokens,
                    n_rows, n_active, cuda::moe_kernel_name(cuda::moe_choose_kernel(n_tokens, kTopK, n_experts)));
        for (MoeKernel k : {MoeKernel::gemv, MoeKernel::narrow, MoeKernel::gemm}) {
            const char* kn = cuda::moe_kernel_name(k);
            if (k == MoeKernel::gemv && n_tokens > 1024) continue;  // far outside its regime
            std::snprintf(label, sizeof label, "%s %5d tok mlp1 %s", name, n_tokens, kn);
            bench::report(label, bench::time_us([&](int i) { mlp1(i, k); }, iters), n_active * w1_bytes + act1, fl1);
            std::snprintf(label, sizeof label, "%s %5d tok mlp2 %s", name, n_tokens, kn);
            bench::report(label, bench::time_us([&](int i) { mlp2(i, k); }, iters), n_active * w2_bytes + act2, fl2);
        }
        std::snprintf(label, sizeof label, "%s %5d tok route", name, n_tokens);
        bench::report(label, bench::time_us(route, iters), 4.0 * n_tokens * n_experts + 8.0 * n_rows, 0);
        std::snprintf(label, sizeof label, "%s %5d tok group", name, n_tokens);
        bench::report(label, bench::time_us(group, iters), 8.0 * n_rows, 0);
        std::snprintf(label, sizeof label, "%s %5d tok combine", name, n_tokens);
        bench::report(label, bench::time_us(combine, iters), 4.0 * n_rows * d_model + 8.0 * n_tokens * d_model, 0);
        std::snprintf(label, sizeof label, "%s %5d tok whole step (auto)", name, n_tokens);
        bench::report(label,
                      bench::time_us([&](int i) {
                          route(i), group(i), mlp1(i, MoeKernel::automatic), mlp2(i, MoeKernel::automatic), combine(i);
                      }, iters),
                      n_active * (w1_bytes + w2_bytes) + act1 + act2, fl1 + fl2);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const std::string which = argc > 1 ? argv[1] : "all";
    std::printf("bench_moe on %s (peaks: %.0f GB/s, %.0f TFLOP/s)\n", cuda::device_name().c_str(), bench::kPeakGBps,
                bench::kPeakTflops);
    if (which == "20b" || which == "all") run_shape("20b", 32);
    if (which == "120b" || which == "all") run_shape("120b", 128);
    return 0;
}
