// Sink attention over the paged KV cache (kernels/cuda/attention.h) at gpt-oss's shapes (64 query /
// 8 KV heads, head_dim 64, pages of 32): decode batches 1 and 64 at contexts 1k..128k (bytes: the
// K/V rows read), full and sliding layers; prefill chunks of 1k and 8k from an empty cache
// (FLOPs: 4 · heads · head_dim · causal pairs).
#include <cstdio>
#include <string>

#include "bench/cuda_bench_util.h"
#include "kernels/cuda/attention.h"

using namespace osprey;

namespace {

constexpr int kQ = 64, kKv = 8, kD = 64, kPage = 32, kLd = (kQ + 2 * kKv) * kD;

void run(const char* what, int batch, int context, int n_new, int window) {
    // Each sequence: `context` cached positions, then n_new fresh tokens.
    const int pages_per_seq = (context + n_new + kPage - 1) / kPage;
    const size_t n_pages = size_t(pages_per_seq) * batch;
    const int rows = window ? window : kPage;
    const size_t blocks = window ? size_t(batch) : n_pages;
    cuda::DeviceBuffer<bf16> k(blocks * kKv * rows * kD), v(k.size()), qkv(size_t(batch) * n_new * kLd),
        out(size_t(batch) * n_new * kQ * kD), sinks(kQ);
    k.fill_bytes(0x3c), v.fill_bytes(0x3c), qkv.fill_bytes(0x3c), sinks.fill_bytes(0);
    std::vector<int32_t> pt(n_pages);
    for (size_t i = 0; i < n_pages; ++i) pt[i] = int32_t(i);
    cuda::DeviceBuffer<int32_t> d_pt(pt.size());
    d_pt.upload(pt);
    std::vector<cuda::AttnSlice> slices;
    for (int i = 0; i < batch; ++i)
        slices.push_back({i * n_new, n_new, context, i, i * pages_per_seq, window ? std::max(0, context - window + 1) : 0});
    const cuda::AttnPlan plan = cuda::plan_attention(slices, window, kKv, 2 * cuda::sm_count());
    auto up = [](const auto& v) {
        using T = typename std::decay_t<decltype(v)>::value_type;
        cuda::DeviceBuffer<T> d(std::max<size_t>(1, v.size()));
        if (!v.empty()) d.upload(v);
        return d;
    };
    auto dd = up(plan.decode);
    auto dp = up(plan.prefill);
    auto dm = up(plan.merges);
    const size_t np = std::max(1, plan.n_partials);
    cuda::DeviceBuffer<float> pacc(np * kKv * 8 * kD);
    cuda::DeviceBuffer<float2> pml(np * kKv * 8);
    const cuda::AttnArgs a{.out = out.get(), .ld_out = kQ * kD, .qkv = qkv.get(), .ld_qkv = kLd, .k_cache = k.get(),
                           .v_cache = v.get(), .rows = rows, .ring = window > 0, .window = window,
                           .page_table = d_pt.get(), .sinks = sinks.get(), .n_q_heads = kQ, .n_kv_heads = kKv,
                           .head_dim = kD, .partial_acc = pacc.get(), .partial_ml = pml.get()};
    const cuda::AttnDevicePlan p{dd.get(), int(plan.decode.size()), dp.get(), int(plan.prefill.size()), dm.get(),
                                 int(plan.merges.size())};
    const double us = bench::time_us([&](int) { cuda::attention(a, p, nullptr); });
    double keys = 0, pairs = 0;
    for (int t = 0; t < n_new; ++t) {
        const int pos = context + t;
        const int n_keys = window ? std::min(window, pos + 1) : pos + 1;
        pairs += n_keys;
        keys = std::max<double>(keys, n_keys);
    }
    const double bytes = double(batch) * keys * kKv * kD * 2 * 2;  // K and V rows, bf16
    const double flops = double(batch) * pairs * kQ * kD * 4;
    const std::string label = std::string(what) + " B=" + std::to_string(batch) + " ctx=" + std::to_string(context) +
                              " new=" + std::to_string(n_new) + (window ? " win" : "");
    bench::report(label.c_str(), us, bytes, flops);
}

}  // namespace

int main() {
    for (int ctx : {1024, 8192, 32768, 131071}) run("attn decode", 1, ctx, 1, 0);
    for (int ctx : {1024, 8192}) run("attn decode", 64, ctx, 1, 0);
    run("attn decode", 128, 32768, 1, 0);  // gpt-oss-20b decode at its largest benchmarked batch
    run("attn decode", 1, 8192, 1, 128);
    run("attn decode", 64, 8192, 1, 128);
    run("attn prefill", 1, 0, 1024, 0);
    run("attn prefill", 1, 0, 8192, 0);
    run("attn prefill", 1, 0, 8192, 128);
    return 0;
}
