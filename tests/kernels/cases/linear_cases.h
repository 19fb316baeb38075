// Dense linears (kernels/cuda/linear.h: cuBLASLt, and our GEMV for decode-sized batches): one table for
// the test (tests/kernels/test_linear.cu, against kernels/cpu/matmul.h) and the benchmark
// (bench/bench_linear.cu). gpt-oss's linears — qkv [5120, 2880], out [2880, 4096] (+ residual, f32),
// router [32 | 128, 2880] (f32), unembedding [201088, 2880] (f32, no bias) — at decode (1, 2, 4, 8, 64
// tokens) and prefill (1024, 8192) sizes on both paths, plus small, strided and odd shapes.
//
// Perf: weights rotate over copies totalling > 256 MB (4x the L2), so decode figures are HBM-bound,
// not cache hits; bytes = weights + x + y (twice when accumulating), FLOPs = 2 · T · N · K. Cases
// with T · N · K > 6e9 are perf-only (the CPU reference would take minutes); prefill is checked at
// T = 33..300 and the unembedding at T = 1..8.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cases/harness.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/linear.h"

namespace osprey::cases::linear {

struct Case {
    std::string name;   // gtest name; empty: identifier(label)
    std::string label;  // bench label
    Use use = Use::both;
    int t = 1, n = 1, k = 1;  // tokens, outputs, inputs
    bool bias = true;
    bool f32 = false;         // f32 output (and bias)
    bool accumulate = false;  // y += x · Wᵀ + b
    int ldx = 0, ldy = 0;     // row strides (0: dense)
    cuda::LinearPath path = cuda::LinearPath::automatic;
    int gemv_rows = 0;  // GEMV rows per CTA (0: the kernel's choice from N)
};

inline Result run(const Case& c, Mode mode) {
    Result r;
    r.seed = case_seed(mode);
    const int ldx = c.ldx ? c.ldx : c.k, ldy = c.ldy ? c.ldy : c.n;
    const float w_scale = 1.0f / std::sqrt(float(c.k));
    const size_t w_elems = size_t(c.n) * c.k, y_elems = size_t(c.t) * ldy;
    const int copies = mode == Mode::perf ? copies_beyond_l2(2.0 * w_elems) : 1;
    auto d_x = device_uniform<bf16>(size_t(c.t) * ldx, stream_seed(r.seed, 1), -1.f, 1.f);
    auto d_w = device_uniform<bf16>(w_elems * copies, stream_seed(r.seed, 2), -w_scale, w_scale);
    auto d_b = device_uniform<bf16>(c.n, stream_seed(r.seed, 3), -1.f, 1.f);
    const std::vector<float> b = to_float(d_b.download(c.n));
    auto d_bf = to_device(b);  // f32 outputs take an f32 bias (the same values)
    // y0: the accumulated-into output (f32, or bf16 for the bf16 output; the same stream).
    auto d_y0f = device_uniform<float>(c.f32 ? y_elems : 0, stream_seed(r.seed, 4), -1.f, 1.f);
    auto d_y0b = device_uniform<bf16>(c.f32 ? 0 : y_elems, stream_seed(r.seed, 4), -1.f, 1.f);
    cuda::DeviceBuffer<float> d_yf;
    cuda::DeviceBuffer<bf16> d_yb;
    if (c.f32) {
        d_yf = c.accumulate ? clone(d_y0f, y_elems) : poisoned<float>(y_elems);
    } else {
        d_yb = c.accumulate ? clone(d_y0b, y_elems) : poisoned<bf16>(y_elems);
    }
    const void* bias = !c.bias ? nullptr : c.f32 ? static_cast<const void*>(d_bf.get()) : d_b.get();
    void* y = c.f32 ? static_cast<void*>(d_yf.get()) : d_yb.get();
    cuda::Blas blas;
    cuda::LinearArgs a{.y = y, .x = d_x.get(), .w = d_w.get(), .bias = bias, .n_tokens = c.t, .n_out = c.n,
                       .n_in = c.k, .ldx = c.ldx, .ldy = c.ldy, .y_f32 = c.f32, .accumulate = c.accumulate,
                       .path = c.path, .gemv_rows = c.gemv_rows};

    if (mode == Mode::perf) {
        const double us = time_us(
            [&](int i) {
                cuda::LinearArgs ai = a;
                ai.w = d_w.get() + size_t(i % copies) * w_elems;
                blas.linear(ai, nullptr);
            },
            iters_or(50));
        const double bytes =
            2.0 * w_elems + 2.0 * c.t * c.k + double(c.t) * c.n * (c.f32 ? 4 : 2) * (c.accumulate ? 2 : 1);
        r.timings.push_back({c.label, us, bytes, 2.0 * c.t * double(w_elems)});
        return r;
    }

    blas.linear(a, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    // Reference on the dense (unstrided) x, from the exact bf16 values.
    const std::vector<bf16> x = d_x.download(size_t(c.t) * ldx), w = d_w.download(w_elems);
    std::vector<float> xf(size_t(c.t) * c.k), want(size_t(c.t) * c.n);
    for (int t = 0; t < c.t; ++t)
        for (int i = 0; i < c.k; ++i) xf[size_t(t) * c.k + i] = bf16_to_float(x[size_t(t) * ldx + i]);
    cpu::matmul_bf16w(want, xf, w, c.bias ? b : std::vector<float>{}, c.t, c.k, c.n);
    const std::vector<float> y0 = c.f32 ? d_y0f.download(y_elems) : to_float(d_y0b.download(y_elems));
    const std::vector<float> yv = c.f32 ? d_yf.download(y_elems) : to_float(d_yb.download(y_elems));
    std::vector<float> got(size_t(c.t) * c.n);
    std::vector<double> ref(got.size());
    for (int t = 0; t < c.t; ++t)
        for (int j = 0; j < c.n; ++j) {
            got[size_t(t) * c.n + j] = yv[size_t(t) * ldy + j];
            ref[size_t(t) * c.n + j] =
                double(want[size_t(t) * c.n + j]) + (c.accumulate ? y0[size_t(t) * ldy + j] : 0.0);
        }
    // FP32 accumulation in another order than the reference: ~1e-6 relative of the sum of |terms|
    // (<= 1 here), so 1e-4 absolute covers it; a bf16 output adds one rounding (2^-8 relative).
    expect_close(r, got, ref, 1e-4, c.f32 ? 1e-5 : 1.0 / 256, "linear");
    return r;
}

inline std::vector<Case> cases() {
    using cuda::LinearPath;
    std::vector<Case> t;
    auto edge = [&](const char* name, Case c) {
        c.name = name;
        c.label = str("linear ", name);
        c.use = Use::check_only;
        t.push_back(c);
    };
    // Small, strided and odd shapes, and real shapes at sizes the grid below does not hold.
    edge("tiny_shape", {.t = 1, .n = 24, .k = 40});
    edge("no_bias", {.t = 5, .n = 24, .k = 40, .bias = false});
    edge("qkv_decode", {.t = 1, .n = 5120, .k = 2880});
    edge("qkv_prefill", {.t = 77, .n = 5120, .k = 2880});
    edge("out_proj_accumulates_residual_f32", {.t = 33, .n = 2880, .k = 4096, .f32 = true, .accumulate = true});
    edge("accumulate_f32_small", {.t = 9, .n = 64, .k = 128, .f32 = true, .accumulate = true});
    edge("router_shape_f32", {.t = 300, .n = 128, .k = 2880, .f32 = true});
    edge("strided_rows", {.t = 6, .n = 96, .k = 64, .ldx = 80, .ldy = 112});
    edge("unembedding_f32", {.t = 2, .n = 201088, .k = 2880, .bias = false, .f32 = true});
    edge("gemv_three_tokens_short_row", {.t = 3, .n = 13, .k = 8, .path = LinearPath::gemv});
    edge("gemv_strided", {.t = 5, .n = 100, .k = 64, .ldx = 72, .ldy = 130, .path = LinearPath::gemv});
    // The one-warp-per-row GEMV (linear.h: automatic for the unembedding at T = 1).
    edge("gemv_wide_small", {.t = 1, .n = 37, .k = 2880, .path = LinearPath::gemv_wide});
    edge("gemv_wide_tokens_strided", {.t = 7, .n = 50, .k = 64, .ldx = 72, .ldy = 60, .path = LinearPath::gemv_wide});
    edge("gemv_wide_f32_accumulate",
         {.t = 3, .n = 40, .k = 4096, .f32 = true, .accumulate = true, .path = LinearPath::gemv_wide});
    edge("gemv_wide_unembedding_f32",
         {.t = 1, .n = 201088, .k = 2880, .bias = false, .f32 = true, .path = LinearPath::gemv_wide});

    // gpt-oss shapes x tokens x path: bench_linear's lines before the tables (same labels).
    struct Shape {
        const char* name;
        int n, k;
        bool f32, acc, bias;
    };
    const Shape shapes[] = {{"qkv", 5120, 2880, false, false, true},   {"out+resid", 2880, 4096, true, true, true},
                            {"router20b", 32, 2880, true, false, true}, {"router120b", 128, 2880, true, false, true},
                            {"unembed", 201088, 2880, true, false, false}};
    for (const Shape& s : shapes)
        for (int tokens : {1, 2, 4, 8, 64, 1024, 8192}) {
            if (s.n == 201088 && tokens > 64) continue;  // logits are only computed for the last tokens
            for (const LinearPath path : {LinearPath::blas, LinearPath::gemv}) {
                if (path == LinearPath::gemv && tokens > cuda::kGemvMaxTokens) continue;
                Case c{
                    .t = tokens, .n = s.n, .k = s.k, .bias = s.bias, .f32 = s.f32, .accumulate = s.acc, .path = path};
                c.label = str("linear ", s.name, " T=", tokens, path == LinearPath::gemv ? " gemv" : " cublasLt");
                if (double(tokens) * s.n * s.k > 6e9) c.use = Use::perf_only;
                t.push_back(c);
            }
        }
    for (int tokens : {1, 2}) {  // the wide GEMV where automatic uses it (T = 1), and one step beyond
        Case c{.use = Use::perf_only, .t = tokens, .n = 201088, .k = 2880, .bias = false, .f32 = true,
               .path = LinearPath::gemv_wide};
        c.label = str("linear unembed T=", tokens, " gemv_wide");
        t.push_back(c);
    }
    // The GEMV at each rows-per-CTA choice, to check the automatic one (perf only; test_gemv.cu checks them).
    for (const Shape& s : shapes)
        for (int tokens : {1, 8})
            for (int rows : {8, 16, 32}) {
                Case c{.use = Use::perf_only, .t = tokens, .n = s.n, .k = s.k, .bias = s.bias, .f32 = s.f32,
                       .accumulate = s.acc, .path = LinearPath::gemv, .gemv_rows = rows};
                c.label = str("linear ", s.name, " T=", tokens, " gemv rows=", rows);
                t.push_back(c);
            }
    return t;
}

}  // namespace osprey::cases::linear
