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
//
// FP8 weights (Case::fp8, linear.h Fp8Weight): every non-NaN E4M3 code (uniform random bytes) with
// multipliers spread over 3 binades, against cpu::fp8_matmul (the CPU reference: dequantised
// weights, FP32 accumulation, the multiplier on each 128-input block's partial sum), to the same
// bounds as BF16 for the GEMV paths (T <= 32 on the automatic path). The prefill path (T > 32, the
// blas path, or K not a multiple of 16) rounds each
// dequantised weight to BF16 before cuBLASLt: it is checked to the same bounds against the CPU BF16
// matmul over exactly those rounded weights (its contract), and the rounding's own size (<= 2^-9 of
// Σ|x·w| per output) is what the model-level test (tests/model/test_cuda_fp8_weights.cu) bounds.
// Perf bytes count the codes and the multipliers: the % of 4.64 TB/s compares with the BF16 lines.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "core/fp8.h"
#include "kernels/cases/harness.h"
#include "kernels/cpu/fp8_matmul.h"
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
    bool fp8 = false;     // W as FP8 E4M3 codes with block multipliers (linear.h Fp8Weight)
    int block_rows = 128; // FP8: rows per multiplier row
};

// Uniform random E4M3 codes, NaN codes (0x7F, 0xFF) moved to their neighbours (±448).
__global__ void fill_e4m3_kernel(uint8_t* p, size_t n, uint64_t seed) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
        uint8_t c = uint8_t(mix64(mix64(seed) ^ i) >> 56);
        if ((c & 0x7F) == 0x7F) --c;
        p[i] = c;
    }
}
inline cuda::DeviceBuffer<uint8_t> device_e4m3(size_t n, uint64_t seed) {
    cuda::DeviceBuffer<uint8_t> d(std::max<size_t>(1, n));
    const size_t blocks = std::min<size_t>(8192, (n + 255) / 256);
    fill_e4m3_kernel<<<unsigned(blocks), 256>>>(d.get(), n, seed);
    CUDA_CHECK(cudaGetLastError());
    return d;
}

// The CPU reference of an FP8 linear whose multiplier rows cover block_rows rows: cpu::fp8_matmul,
// once for a checkpoint grid (128), else once per group of block_rows rows (a window whose multipliers
// start at the group's row, as the grid's repeated rows mean). y: [t, n].
inline std::vector<float> fp8_reference(const std::vector<float>& x, const std::vector<uint8_t>& codes,
                                        const std::vector<float>& scale, const std::vector<float>& bias, int t, int n,
                                        int k, int block_rows) {
    std::vector<float> y(size_t(t) * n);
    const int64_t nkb = fp8::n_blocks(k);
    const int group = block_rows == fp8::kBlock ? n : block_rows;
    std::vector<float> part;
    for (int r0 = 0; r0 < n; r0 += group) {
        const int rows = std::min(group, n - r0);
        const cpu::Fp8Matrix m{.data = codes.data() + size_t(r0) * k,
                               .scale_inv = scale.data() + size_t(r0 / block_rows) * nkb,
                               .ld = k};
        part.assign(size_t(t) * rows, 0.f);
        cpu::fp8_matmul(part, x, m, bias.empty() ? std::span<const float>{} : std::span(bias).subspan(r0, rows), t,
                        k, rows);
        for (int i = 0; i < t; ++i)
            for (int j = 0; j < rows; ++j) y[size_t(i) * n + r0 + j] = part[size_t(i) * rows + j];
    }
    return y;
}

// Whether Blas::linear runs an FP8 case through the dequantise + cuBLASLt path (linear.cu).
inline bool fp8_takes_dequant(const Case& c) {
    const bool fused = c.norm || c.acc_moe;
    if (fused) return false;
    if (!cuda::fp8_gemv_shape_ok(c.k)) return true;
    if (c.path == cuda::LinearPath::blas) return true;
    if (c.path == cuda::LinearPath::gemv || c.path == cuda::LinearPath::gemv_wide) return false;
    return c.t > cuda::kFp8GemvGroupMaxTokens;  // up to there: the GEMV per 8 tokens
}

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
    const size_t w_bytes = w_elems * (c.fp8 ? 1 : 2);
    const int copies = mode == Mode::perf ? copies_beyond_l2(double(w_bytes)) : 1;
    auto d_x = device_uniform<bf16>(size_t(c.t) * ldx, stream_seed(r.seed, 1), -1.f, 1.f);
    auto d_w = device_uniform<bf16>(c.fp8 ? 0 : w_elems * copies, stream_seed(r.seed, 2), -w_scale, w_scale);
    // FP8: codes, and multipliers making |w| about w_scale / 2 on average as above (the mean |code| of
    // uniform random codes is ~43), spread over [1/4, 2] of that.
    const size_t s_elems = c.fp8 ? size_t((c.n + c.block_rows - 1) / c.block_rows) * size_t(fp8::n_blocks(c.k)) : 0;
    auto d_codes = c.fp8 ? device_e4m3(w_elems * copies, stream_seed(r.seed, 2)) : cuda::DeviceBuffer<uint8_t>(1);
    const float s_base = w_scale / (2.f * 43.f);
    auto d_scale = device_uniform<float>(s_elems, stream_seed(r.seed, 11), 0.25f * s_base, 2.f * s_base);
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
    cuda::LinearArgs a{.y = y, .x = d_x.get(), .w = c.fp8 ? nullptr : d_w.get(), .bias = bias, .n_tokens = c.t,
                       .n_out = c.n, .n_in = c.k, .ldx = c.ldx, .ldy = c.ldy, .y_f32 = c.f32,
                       .accumulate = c.accumulate, .path = c.path, .gemv_rows = c.gemv_rows};
    if (c.fp8) a.w8 = {.codes = d_codes.get(), .scale = d_scale.get(), .block_rows = c.block_rows};
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
                if (c.fp8) {
                    ai.w8.codes = d_codes.get() + size_t(i % copies) * w_elems;
                } else {
                    ai.w = d_w.get() + size_t(i % copies) * w_elems;
                }
                blas.linear(ai, nullptr);
            },
            iters_or(50));
        const double bytes = double(w_bytes) + 4.0 * double(s_elems) + 2.0 * c.t * c.k +
                             double(c.t) * c.n * (c.f32 ? 4 : 2) * (c.accumulate ? 2 : 1);
        r.timings.push_back({c.label, us, bytes, 2.0 * c.t * double(w_elems)});
        return r;
    }

    blas.linear(a, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    // Reference on the dense (unstrided) x, from the exact bf16 values.
    std::vector<bf16> x = d_x.download(size_t(c.t) * ldx);
    const std::vector<bf16> w = c.fp8 ? std::vector<bf16>{} : d_w.download(w_elems);
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
    if (!c.fp8) {
        cpu::matmul_bf16w(want, xf, w, c.bias ? b : std::vector<float>{}, c.t, c.k, c.n);
    } else {
        const std::vector<uint8_t> codes = d_codes.download(w_elems);
        const std::vector<float> scale = d_scale.download(s_elems);
        if (fp8_takes_dequant(c)) {
            // The prefill path's contract: cuBLASLt over bf16(e4m3(code) · multiplier).
            std::vector<bf16> wd(w_elems);
            const int64_t nkb = fp8::n_blocks(c.k);
            for (int j = 0; j < c.n; ++j)
                for (int i = 0; i < c.k; ++i) {
                    const size_t e = size_t(j) * c.k + i;
                    wd[e] = float_to_bf16(fp8::e4m3_to_float(codes[e]) *
                                          scale[size_t(j / c.block_rows) * nkb + i / fp8::kBlock]);
                }
            cpu::matmul_bf16w(want, xf, wd, c.bias ? b : std::vector<float>{}, c.t, c.k, c.n);
            r.note("fp8 prefill path: checked against the BF16-rounded dequantised weights");
        } else {
            want = fp8_reference(xf, codes, scale, c.bias ? b : std::vector<float>{}, c.t, c.n, c.k, c.block_rows);
        }
    }
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
    // FP8 weights (linear.h Fp8Weight). Edges: N and K off 128 (partial blocks both ways), K not a
    // multiple of 16 (the prefill path at every T), finer multiplier grids (stacked q/k/v parts of a
    // small model: 64 rows; a sliced vocabulary: any), every T of the GEMV, both sides of T = 8, strides,
    // each rows-per-CTA choice, the fused decode parts, gemv_wide, and the chunked prefill path on the
    // unembedding (18 chunks of the 64 MB scratch).
    auto fp8 = [&](const char* name, Case c) {
        c.fp8 = true;
        edge(name, c);
    };
    fp8("fp8_tiny_shape", {.t = 1, .n = 24, .k = 48});
    for (int tokens = 1; tokens <= 8; ++tokens)
        t.push_back([&] {
            Case c{.use = Use::check_only, .t = tokens, .n = 200, .k = 272, .bias = tokens % 2 == 1, .f32 = tokens > 4,
                   .fp8 = true};
            c.label = str("linear fp8 odd shape T=", tokens);
            return c;
        }());
    fp8("fp8_odd_shape_t9_two_gemv_groups", {.t = 9, .n = 200, .k = 272});
    fp8("fp8_odd_shape_t32_four_gemv_groups", {.t = 32, .n = 200, .k = 272, .f32 = true, .accumulate = true});
    fp8("fp8_odd_shape_t33_prefill", {.t = 33, .n = 200, .k = 272});
    fp8("fp8_odd_shape_t5_blas_path", {.t = 5, .n = 200, .k = 272, .path = LinearPath::blas});
    fp8("fp8_k_not_multiple_of_16", {.t = 3, .n = 70, .k = 200, .f32 = true});
    fp8("fp8_block_rows_64_decode", {.t = 1, .n = 640, .k = 128, .block_rows = 64});
    fp8("fp8_block_rows_64_gemv_groups", {.t = 20, .n = 640, .k = 128, .block_rows = 64});
    fp8("fp8_block_rows_64_prefill", {.t = 40, .n = 640, .k = 128, .block_rows = 64});
    fp8("fp8_block_rows_1_decode", {.t = 4, .n = 45, .k = 160, .f32 = true, .block_rows = 1});
    fp8("fp8_block_rows_8_wide", {.t = 1, .n = 77, .k = 2880, .path = LinearPath::gemv_wide, .block_rows = 8});
    fp8("fp8_qkv_decode_t1", {.t = 1, .n = 5120, .k = 2880});
    fp8("fp8_qkv_decode_t8", {.t = 8, .n = 5120, .k = 2880});
    fp8("fp8_qkv_t9_two_gemv_groups", {.t = 9, .n = 5120, .k = 2880});
    fp8("fp8_qkv_prefill_t77", {.t = 77, .n = 5120, .k = 2880});
    fp8("fp8_out_proj_accumulates_residual_t1", {.t = 1, .n = 2880, .k = 4096, .f32 = true, .accumulate = true});
    fp8("fp8_out_proj_accumulates_residual_t33", {.t = 33, .n = 2880, .k = 4096, .f32 = true, .accumulate = true});
    fp8("fp8_strided_gemv", {.t = 6, .n = 96, .k = 64, .ldx = 80, .ldy = 112, .path = LinearPath::gemv});
    fp8("fp8_strided_gemv_groups", {.t = 20, .n = 96, .k = 64, .ldx = 80, .ldy = 112});
    fp8("fp8_strided_prefill", {.t = 40, .n = 96, .k = 64, .ldx = 80, .ldy = 112});
    for (int rows : {8, 16, 32}) {
        Case c{.use = Use::check_only, .t = 5, .n = 100, .k = 2880, .path = LinearPath::gemv, .gemv_rows = rows,
               .fp8 = true};
        c.label = str("linear fp8 gemv rows ", rows);
        t.push_back(c);
    }
    fp8("fp8_unembedding_t1_wide", {.t = 1, .n = 201088, .k = 2880, .bias = false, .f32 = true});
    fp8("fp8_unembedding_t1_gemv",
        {.t = 1, .n = 201088, .k = 2880, .bias = false, .f32 = true, .path = LinearPath::gemv});
    fp8("fp8_unembedding_t3", {.t = 3, .n = 201088, .k = 2880, .bias = false, .f32 = true});
    fp8("fp8_unembedding_t9_chunked_prefill",
        {.t = 9, .n = 201088, .k = 2880, .bias = false, .f32 = true, .path = LinearPath::blas});
    fp8("fp8_unembedding_t9_two_gemv_groups", {.t = 9, .n = 201088, .k = 2880, .bias = false, .f32 = true});
    fp8("fp8_gemv_wide_tokens_strided",
        {.t = 7, .n = 50, .k = 64, .ldx = 72, .ldy = 60, .path = LinearPath::gemv_wide});
    fp8("fp8_gemv_wide_f32_accumulate",
        {.t = 3, .n = 40, .k = 4096, .f32 = true, .accumulate = true, .path = LinearPath::gemv_wide});
    fp8("fp8_norm_prologue_qkv_t1", {.t = 1, .n = 5120, .k = 2880, .norm = true});
    fp8("fp8_norm_prologue_moe_qkv_t3", {.t = 3, .n = 5120, .k = 2880, .norm = true, .norm_moe = true});
    fp8("fp8_norm_prologue_moe_qkv_t8", {.t = 8, .n = 5120, .k = 2880, .norm = true, .norm_moe = true});
    fp8("fp8_norm_prologue_odd_rows", {.t = 5, .n = 13, .k = 80, .norm = true, .norm_moe = true, .block_rows = 8});
    fp8("fp8_acc_moe_out_proj_t1",
        {.t = 1, .n = 2880, .k = 4096, .f32 = true, .accumulate = true, .acc_moe = true});
    fp8("fp8_acc_moe_out_proj_t8",
        {.t = 8, .n = 2880, .k = 4096, .f32 = true, .accumulate = true, .acc_moe = true});
    fp8("fp8_acc_moe_odd_rows", {.t = 2, .n = 19, .k = 64, .f32 = true, .accumulate = true, .acc_moe = true});

    // FP8 at gpt-oss's attention and unembedding shapes for bench_linear, next to the BF16 lines above:
    // T = 1 and 8 on the GEMVs (the unembedding at T = 1 on gemv_wide, automatic, and on the tensor-core
    // GEMV), 16 and 32 on the GEMV per 8 tokens (against the prefill path at 32: where the automatic
    // switch belongs), T = 64 on the prefill path (dequantise + cuBLASLt). Checked where T · N · K <= 6e9.
    struct Fp8Line {
        const char* shape;
        int n, k;
        bool f32, acc, bias;
        int t;
        LinearPath path;
        const char* how;
    };
    const Fp8Line fp8_lines[] = {
        {"qkv", 5120, 2880, false, false, true, 1, LinearPath::gemv, "gemv"},
        {"qkv", 5120, 2880, false, false, true, 8, LinearPath::gemv, "gemv"},
        {"qkv", 5120, 2880, false, false, true, 16, LinearPath::automatic, "gemv x2"},
        {"qkv", 5120, 2880, false, false, true, 32, LinearPath::automatic, "gemv x4"},
        {"qkv", 5120, 2880, false, false, true, 32, LinearPath::blas, "dequant+cublasLt"},
        {"qkv", 5120, 2880, false, false, true, 64, LinearPath::automatic, "dequant+cublasLt"},
        {"out+resid", 2880, 4096, true, true, true, 1, LinearPath::gemv, "gemv"},
        {"out+resid", 2880, 4096, true, true, true, 8, LinearPath::gemv, "gemv"},
        {"out+resid", 2880, 4096, true, true, true, 64, LinearPath::automatic, "dequant+cublasLt"},
        {"unembed", 201088, 2880, true, false, false, 1, LinearPath::gemv_wide, "gemv_wide"},
        {"unembed", 201088, 2880, true, false, false, 1, LinearPath::gemv, "gemv"},
        {"unembed", 201088, 2880, true, false, false, 8, LinearPath::gemv, "gemv"},
        {"unembed", 201088, 2880, true, false, false, 16, LinearPath::automatic, "gemv x2"},
        {"unembed", 201088, 2880, true, false, false, 64, LinearPath::automatic, "dequant+cublasLt"},
    };
    for (const Fp8Line& l : fp8_lines) {
        Case c{.t = l.t, .n = l.n, .k = l.k, .bias = l.bias, .f32 = l.f32, .accumulate = l.acc, .path = l.path,
               .fp8 = true};
        c.label = str("linear ", l.shape, " T=", l.t, " fp8 ", l.how);
        if (double(l.t) * l.n * l.k > 6e9) c.use = Use::perf_only;
        t.push_back(c);
    }
    for (int tokens : {1, 8}) {  // the fused decode variants
        Case q{.use = Use::perf_only, .t = tokens, .n = 5120, .k = 2880, .norm = true, .norm_moe = true, .fp8 = true};
        q.label = str("linear qkv T=", tokens, " fp8 gemv+norm+moe");
        Case o{.use = Use::perf_only, .t = tokens, .n = 2880, .k = 4096, .f32 = true, .accumulate = true,
               .acc_moe = true, .fp8 = true};
        o.label = str("linear out+resid T=", tokens, " fp8 gemv+moe");
        t.insert(t.end(), {q, o});
    }
    // qkv and the out-projection at T = 1 on gemv_wide (x given, no fused norm or MoE add: the decode step's
    // unfused form), against the tensor-core GEMV lines above.
    for (const bool f8 : {false, true}) {
        Case q{.use = Use::perf_only, .t = 1, .n = 5120, .k = 2880, .path = LinearPath::gemv_wide, .fp8 = f8};
        q.label = str("linear qkv T=1 ", f8 ? "fp8 " : "", "gemv_wide");
        Case o{.use = Use::perf_only, .t = 1, .n = 2880, .k = 4096, .f32 = true, .accumulate = true,
               .path = LinearPath::gemv_wide, .fp8 = f8};
        o.label = str("linear out+resid T=1 ", f8 ? "fp8 " : "", "gemv_wide");
        t.insert(t.end(), {q, o});
    }
    for (int rows : {8, 16, 32}) {  // rows per CTA for the FP8 GEMV (the automatic choice is BF16's)
        Case c{.use = Use::perf_only, .t = 1, .n = 5120, .k = 2880, .path = LinearPath::gemv, .gemv_rows = rows,
               .fp8 = true};
        c.label = str("linear qkv T=1 fp8 gemv rows=", rows);
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
