// Top-4 MoE routing (kernels/cuda/moe_route.h): one table for the test (tests/kernels/test_moe_route.cu,
// against kernels/cpu/routing.h: exact expert ids, ties to the lower id, weights to FP32 rounding) and
// the benchmark (bench/bench_moe.cu): gpt-oss's 32 and 128 experts at decode and prefill batch sizes,
// the tiny model's 8, expert counts off the warp size, heavy ties, the router bias added in the kernel.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cases/harness.h"
#include "kernels/cpu/routing.h"
#include "kernels/cuda/moe_route.h"

namespace osprey::cases::moe_route {

inline constexpr int kTopK = 4;

enum class Logits { random, ties };

struct Case {
    std::string name;   // gtest name; empty: identifier(label)
    std::string label;  // bench label
    Use use = Use::both;
    int n_tokens = 1;
    int n_experts = 32;
    Logits kind = Logits::random;
    bool bias = false;
};

inline Result run(const Case& c, Mode mode) {
    Result r;
    r.seed = case_seed(mode);
    const size_t n_logits = size_t(c.n_tokens) * c.n_experts, n_rows = size_t(c.n_tokens) * kTopK;
    auto d_logits = device_uniform<float>(n_logits, stream_seed(r.seed, 1), -6.f, 6.f);
    if (c.kind == Logits::ties) {  // a handful of distinct values: most top-4 sets contain ties
        std::vector<float> v = d_logits.download(n_logits);
        for (float& x : v) x = std::round(x / 3.0f);
        d_logits.upload(v);
    }
    auto d_bias = device_uniform<bf16>(c.n_experts, stream_seed(r.seed, 2), -1.f, 1.f);
    auto d_ids = poisoned<int32_t>(n_rows);
    auto d_w = poisoned<float>(n_rows);
    const cuda::MoeRouteArgs a{.expert_ids = d_ids.get(), .expert_weights = d_w.get(), .logits = d_logits.get(),
                               .bias = c.bias ? d_bias.get() : nullptr, .n_tokens = c.n_tokens,
                               .n_experts = c.n_experts, .top_k = kTopK};

    if (mode == Mode::perf) {
        const double us =
            time_us([&](int) { cuda::moe_route_topk(a, nullptr); }, iters_or(c.n_tokens >= 1024 ? 10 : 50));
        r.timings.push_back({c.label, us, 4.0 * n_logits + 8.0 * n_rows + (c.bias ? 2.0 * c.n_experts : 0.0), 0.0});
        return r;
    }

    cuda::moe_route_topk(a, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> biased = d_logits.download(n_logits);
    if (c.bias) {
        const std::vector<float> bias = to_float(d_bias.download(c.n_experts));
        for (int t = 0; t < c.n_tokens; ++t)
            for (int e = 0; e < c.n_experts; ++e) biased[size_t(t) * c.n_experts + e] += bias[e];
    }
    std::vector<int32_t> want_ids(n_rows);
    std::vector<float> want_w(n_rows);
    cpu::route_topk_softmax(want_ids, want_w, biased, c.n_tokens, c.n_experts, kTopK);
    expect_equal(r, d_ids.download(n_rows), want_ids, "expert ids");
    // exp and a 4-term sum in FP32 against the reference's double: a few ulps.
    expect_close(r, d_w.download(n_rows), to_double(want_w), 1e-6, 1e-5, "weights");
    return r;
}

inline std::vector<Case> cases() {
    std::vector<Case> t;
    auto add = [&](Case c, Use use) {
        c.label = str("route E=", c.n_experts, " T=", c.n_tokens, c.kind == Logits::ties ? " ties" : "",
                      c.bias ? " bias" : "");
        c.use = use;
        t.push_back(c);
    };
    for_moe_token_grid([&](int n, int e, Use use) { add({.n_tokens = n, .n_experts = e}, use); });
    for (int e : {8, 32, 128}) add({.n_tokens = 500, .n_experts = e, .kind = Logits::ties}, Use::check_only);
    for (int e : {32, 128}) add({.n_tokens = 100, .n_experts = e, .bias = true}, Use::check_only);
    for (int e : {4, 5, 33, 255, 256}) add({.n_tokens = 77, .n_experts = e}, Use::check_only);  // off the warp size
    return t;
}

}  // namespace osprey::cases::moe_route
