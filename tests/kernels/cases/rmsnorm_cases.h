// RMSNorm of the FP32 residual stream to BF16 (kernels/cuda/rmsnorm.h), with the fused residual add
// (`delta`) and the row gather of the final norm: one table for the test
// (tests/kernels/test_rmsnorm_cuda.cu, against kernels/cpu/rmsnorm.h) and the benchmark
// (bench/bench_rmsnorm.cu). Widths from the kernel's constants (256 threads x float4, up to 4096
// channels kept in registers) and gpt-oss's 2880, at decode and prefill token counts.
// Perf bytes: x read, delta read and x written back (with delta), y written, the gain once.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cases/harness.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cuda/rmsnorm.h"

namespace osprey::cases::rmsnorm {

inline constexpr int kThreads = 256;  // kernels/cuda/rmsnorm.cu
inline constexpr float kEps = 1e-5f;

struct Case {
    std::string name;   // gtest name; empty: identifier(label)
    std::string label;  // bench label
    Use use = Use::both;
    int n_tokens = 1;
    int d = 2880;
    bool delta = false;   // x += delta first (written back)
    bool gather = false;  // normalise rows n_src-1, n_src-2, ... of n_src = n_tokens + 3 rows
    bool moe = false;     // x += Σ_k moe_w[4r + k] · moe_y[4r + k] first (the MoE combine, fused)
};

inline Result run(const Case& c, Mode mode) {
    Result r;
    r.seed = case_seed(mode);
    const int n_src = c.gather ? c.n_tokens + 3 : c.n_tokens;
    const size_t src_elems = size_t(n_src) * c.d, y_elems = size_t(c.n_tokens) * c.d;
    auto d_x = device_uniform<float>(src_elems, stream_seed(r.seed, 1), -3.f, 3.f);
    auto d_delta = device_uniform<float>(src_elems, stream_seed(r.seed, 2), -1.f, 1.f);
    auto d_gain = device_uniform<float>(c.d, stream_seed(r.seed, 3), 0.5f, 1.5f);
    auto d_moe_y = device_uniform<float>(src_elems * 4, stream_seed(r.seed, 4), -2.f, 2.f);
    auto d_moe_w = device_uniform<float>(size_t(n_src) * 4, stream_seed(r.seed, 5), 0.f, 0.5f);
    std::vector<int32_t> rows(c.n_tokens);
    // Gathered rows are distinct (each residual row is updated once), in reverse order.
    for (int t = 0; t < c.n_tokens; ++t) rows[t] = c.gather ? n_src - 1 - t : t;
    auto d_rows = to_device(rows);
    auto d_y = poisoned<bf16>(y_elems);
    const std::vector<float> x = mode == Mode::check ? d_x.download(src_elems) : std::vector<float>{};
    const cuda::RmsNormArgs a{.y = d_y.get(), .x = d_x.get(), .gain = d_gain.get(),
                              .delta = c.delta ? d_delta.get() : nullptr,
                              .moe_y = c.moe ? d_moe_y.get() : nullptr, .moe_w = c.moe ? d_moe_w.get() : nullptr,
                              .rows = c.gather ? d_rows.get() : nullptr,
                              .n_tokens = c.n_tokens, .d = c.d, .eps = kEps};

    if (mode == Mode::perf) {
        const double us = time_us([&](int) { cuda::rmsnorm(a, nullptr); }, iters_or(50));
        const double bytes =
            double(c.n_tokens) * c.d * (4.0 + (c.delta ? 8.0 : 0.0) + (c.moe ? 20.0 : 0.0) + 2.0) + 4.0 * c.d;
        r.timings.push_back({c.label, us, bytes, 0.0});
        return r;
    }

    cuda::rmsnorm(a, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> delta = d_delta.download(src_elems), gain = d_gain.download(c.d);
    const std::vector<float> moe_y = c.moe ? d_moe_y.download(src_elems * 4) : std::vector<float>{};
    const std::vector<float> moe_w = c.moe ? d_moe_w.download(size_t(n_src) * 4) : std::vector<float>{};
    std::vector<float> xin(y_elems), want(y_elems);
    std::vector<float> x_after = x;
    for (int t = 0; t < c.n_tokens; ++t)
        for (int col = 0; col < c.d; ++col) {
            float v = x[size_t(rows[t]) * c.d + col];
            if (c.delta) v += delta[size_t(rows[t]) * c.d + col];
            if (c.moe) {  // slot order, one fused multiply-add per slot (as the kernel compiles)
                float dv = 0.0f;
                for (int k = 0; k < 4; ++k)
                    dv = std::fma(moe_w[size_t(rows[t]) * 4 + k], moe_y[(size_t(rows[t]) * 4 + k) * c.d + col], dv);
                v += dv;
            }
            xin[size_t(t) * c.d + col] = v;
            x_after[size_t(rows[t]) * c.d + col] = v;
        }
    cpu::rmsnorm(want, xin, gain, c.n_tokens, c.d, kEps);
    // One bf16 rounding of the output (2^-9 relative, half an ulp) on top of f32 sums in another
    // order (~1e-6 relative).
    expect_close(r, to_float(d_y.download(y_elems)), to_double(want), 1e-6, 1.0 / 256, "rmsnorm y");
    // The residual add is written back exactly (f32 + f32 in both; the MoE sum as a chain of FMAs in
    // slot order, ~1 ulp if the compiler splits one); without delta x is untouched.
    expect_close(r, d_x.download(src_elems), to_double(x_after), c.moe ? 1e-6 : 0.0, c.moe ? 1e-6 : 0.0,
                 "rmsnorm residual");
    return r;
}

inline std::vector<Case> cases() {
    std::vector<Case> t;
    auto edge = [&](const char* name, Case c) {
        c.name = name;
        c.label = str("rmsnorm ", name);
        c.use = Use::check_only;
        t.push_back(c);
    };
    edge("fewer_channels_than_threads", {.n_tokens = 1, .d = 12});
    edge("one_vector_step", {.n_tokens = 3, .d = kThreads * 4});
    edge("partial_last_step", {.n_tokens = 3, .d = kThreads * 4 + 4});
    edge("max_channels", {.n_tokens = 2, .d = cuda::kRmsNormMaxChannels, .delta = true});
    edge("gpt_oss_shape", {.n_tokens = 64, .d = 2880});
    edge("fused_residual_add", {.n_tokens = 37, .d = 2880, .delta = true});
    edge("gathered_rows", {.n_tokens = 5, .d = 2880, .gather = true});
    edge("gathered_rows_with_residual", {.n_tokens = 4, .d = 2880, .delta = true, .gather = true});
    edge("fused_moe_combine", {.n_tokens = 8, .d = 2880, .moe = true});
    edge("fused_moe_combine_gathered", {.n_tokens = 3, .d = 2880, .gather = true, .moe = true});
    edge("fused_moe_combine_partial_step", {.n_tokens = 2, .d = kThreads * 4 + 4, .moe = true});
    // gpt-oss: attn_norm / mlp_norm with the MoE residual add fused, decode and prefill token counts;
    // the final norm of the logit rows (gathered).
    for (int n : {1, 8, 64, 128, 1024, 8192})
        t.push_back({.label = str("rmsnorm T=", n, " d=2880 +delta"), .n_tokens = n, .d = 2880, .delta = true});
    for (int n : {1, 64, 128})
        t.push_back({.label = str("rmsnorm T=", n, " d=2880 +delta gathered"), .n_tokens = n, .d = 2880,
                     .delta = true, .gather = true});
    return t;
}

}  // namespace osprey::cases::rmsnorm
