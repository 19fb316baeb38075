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
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cuda/rmsnorm.h"
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
    // The GEMV's fused decode parts (linear.h): x = rmsnorm(residual [+ MoE slots]) in the prologue
    // (norm, norm_moe), and y += the MoE slots before the accumulation (acc_moe).
    bool norm = false, norm_moe = false, acc_moe = false;
};

// The fused-norm variant of a case: the residual, MoE slots and gain it reads, the rows it normalises.
struct NormInputs {
    cuda::DeviceBuffer<float> res, moe_y, moe_w, gain;
    cuda::DeviceBuffer<bf16> h;
};
inline NormInputs norm_inputs(const Case& c, uint32_t seed) {
    const size_t tk = size_t(c.t) * c.k;
    return {.res = device_uniform<float>(tk, stream_seed(seed, 5), -2.f, 2.f),
            .moe_y = device_uniform<float>(c.norm_moe ? 4 * tk : 0, stream_seed(seed, 6), -1.f, 1.f),
            .moe_w = device_uniform<float>(c.norm_moe ? 4 * size_t(c.t) : 0, stream_seed(seed, 7), 0.f, 0.5f),
            .gain = device_uniform<float>(c.k, stream_seed(seed, 8), 0.5f, 1.5f),
            .h = poisoned<bf16>(tk)};
}

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
    NormInputs ni = c.norm ? norm_inputs(c, r.seed) : NormInputs{};  // (perf cases up to 8192 x 2880 need none)
    if (c.norm) {
        a.x = nullptr;
        a.norm = {.res = ni.res.get(), .gain = ni.gain.get(), .h = ni.h.get(), .eps = 1e-5f};
        if (c.norm_moe) a.norm.moe_y = ni.moe_y.get(), a.norm.moe_w = ni.moe_w.get();
    }
    // acc_moe: MoE slots [T, 4, N] added into y before the accumulation
    auto d_acc_y = device_uniform<float>(c.acc_moe ? 4 * size_t(c.t) * c.n : 0, stream_seed(r.seed, 9), -1.f, 1.f);
    auto d_acc_w = device_uniform<float>(c.acc_moe ? 4 * size_t(c.t) : 0, stream_seed(r.seed, 10), 0.f, 0.5f);
    if (c.acc_moe) a.acc_moe_y = d_acc_y.get(), a.acc_moe_w = d_acc_w.get();

    if (mode == Mode::perf) {  // (the fused variants read the same residual every run: L2-resident, as in a step)
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
    std::vector<bf16> x = d_x.download(size_t(c.t) * ldx);
    const std::vector<bf16> w = d_w.download(w_elems);
    if (c.norm) {
        // The prologue's rows must be bit-identical to the rmsnorm kernel's on the same inputs (which also
        // writes the residual: given a copy), and close to the CPU reference's; the product is then checked
        // on those rows.
        const size_t tk = size_t(c.t) * c.k;
        auto res_copy = clone(ni.res, tk);
        auto h_kernel = poisoned<bf16>(tk);
        cuda::RmsNormArgs na{.y = h_kernel.get(), .x = res_copy.get(), .gain = ni.gain.get(), .n_tokens = c.t,
                             .d = c.k, .eps = 1e-5f};
        if (c.norm_moe) na.moe_y = ni.moe_y.get(), na.moe_w = ni.moe_w.get();
        cuda::rmsnorm(na, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<bf16> h = ni.h.download(tk), hk = h_kernel.download(tk);
        std::vector<uint16_t> hb(tk), hkb(tk);
        for (size_t i = 0; i < tk; ++i) hb[i] = h[i].bits, hkb[i] = hk[i].bits;
        expect_equal(r, hb, hkb, "norm prologue rows vs the rmsnorm kernel's (bf16 bits)");
        const std::vector<float> res = ni.res.download(tk), gain = ni.gain.download(c.k);
        const std::vector<float> my = ni.moe_y.download(c.norm_moe ? 4 * tk : 0);
        const std::vector<float> mw = ni.moe_w.download(c.norm_moe ? 4 * size_t(c.t) : 0);
        std::vector<float> v(res), nv(tk);
        if (c.norm_moe)
            for (int t = 0; t < c.t; ++t)
                for (int i = 0; i < c.k; ++i) {
                    float dv = 0.f;
                    for (int k = 0; k < 4; ++k) dv += mw[4 * t + k] * my[(size_t(t) * 4 + k) * c.k + i];
                    v[size_t(t) * c.k + i] += dv;
                }
        cpu::rmsnorm(nv, v, gain, c.t, c.k, 1e-5f);
        // one bf16 rounding of a value the GPU computes in another order: 2^-8 relative
        expect_close(r, to_float(h), to_double(nv), 1e-6, 1.0 / 128, "norm prologue rows vs the CPU reference");
        x.assign(tk, bf16{});
        for (size_t i = 0; i < tk; ++i) x[i] = h[i];
    }
    const int ldx_ref = c.norm ? c.k : ldx;
    std::vector<float> xf(size_t(c.t) * c.k), want(size_t(c.t) * c.n);
    for (int t = 0; t < c.t; ++t)
        for (int i = 0; i < c.k; ++i) xf[size_t(t) * c.k + i] = bf16_to_float(x[size_t(t) * ldx_ref + i]);
    cpu::matmul_bf16w(want, xf, w, c.bias ? b : std::vector<float>{}, c.t, c.k, c.n);
    std::vector<float> y0 = c.f32 ? d_y0f.download(y_elems) : to_float(d_y0b.download(y_elems));
    if (c.acc_moe) {  // y0 + the slots, in the norm's order (exact in f32 as the kernel does it)
        const std::vector<float> my = d_acc_y.download(4 * size_t(c.t) * c.n), mw = d_acc_w.download(4 * size_t(c.t));
        for (int t = 0; t < c.t; ++t)
            for (int j = 0; j < c.n; ++j) {
                float dv = 0.f;
                for (int k = 0; k < 4; ++k) dv += mw[4 * t + k] * my[(size_t(t) * 4 + k) * c.n + j];
                y0[size_t(t) * ldy + j] += dv;
            }
    }
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
    // The fused decode parts (linear.h: GemvNorm, acc_moe_y): real shapes at T = 1, 3, 8, tile edges.
    edge("norm_prologue_qkv_t1", {.t = 1, .n = 5120, .k = 2880, .norm = true});
    edge("norm_prologue_moe_qkv_t3", {.t = 3, .n = 5120, .k = 2880, .norm = true, .norm_moe = true});
    edge("norm_prologue_moe_qkv_t8", {.t = 8, .n = 5120, .k = 2880, .norm = true, .norm_moe = true});
    edge("norm_prologue_router20b_t1", {.t = 1, .n = 32, .k = 2880, .f32 = true, .norm = true});
    edge("norm_prologue_router120b_t8", {.t = 8, .n = 128, .k = 2880, .f32 = true, .norm = true});
    edge("norm_prologue_odd_rows", {.t = 5, .n = 13, .k = 72, .norm = true, .norm_moe = true});
    edge("acc_moe_out_proj_t1", {.t = 1, .n = 2880, .k = 4096, .f32 = true, .accumulate = true, .acc_moe = true});
    edge("acc_moe_out_proj_t8", {.t = 8, .n = 2880, .k = 4096, .f32 = true, .accumulate = true, .acc_moe = true});
    edge("acc_moe_odd_rows", {.t = 2, .n = 19, .k = 64, .f32 = true, .accumulate = true, .acc_moe = true});

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
    // The fused decode variants against the plain GEMV lines above (perf only).
    for (int tokens : {1, 8}) {
        Case q{.use = Use::perf_only, .t = tokens, .n = 5120, .k = 2880, .norm = true, .norm_moe = true};
        q.label = str("linear qkv T=", tokens, " gemv+norm+moe");
        Case o{.use = Use::perf_only, .t = tokens, .n = 2880, .k = 4096, .f32 = true, .accumulate = true,
               .acc_moe = true};
        o.label = str("linear out+resid T=", tokens, " gemv+moe");
        Case rt{.use = Use::perf_only, .t = tokens, .n = 32, .k = 2880, .f32 = true, .norm = true};
        rt.label = str("linear router20b T=", tokens, " gemv+norm");
        t.insert(t.end(), {q, o, rt});
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
