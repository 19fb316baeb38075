// The MoE step with matrix experts (kernels/cuda/moe_mlp_matrix.h: FP8 W8A8 and BF16): route -> group ->
// moe_matrix (mlp1 + mlp2). One table for the test (tests/kernels/test_moe_matrix.cu, against the CPU
// references w8a8::matmul / matmul_bf16w + swiglu) and the benchmark (bench/bench_moe_matrix.cu): the
// tiny, 20b (32 experts) and 120b (128 experts) shapes at 1 to 8192 tokens, each variant the format
// takes, token tiles around 64 and 128 routed rows, partial k-blocks and m-tiles, ragged experts and
// experts without rows.
//
// Weights (generated on the device, per shape, format and layer): FP8 codes with exponent fields 4..9
// (magnitudes 2^-3 .. 3.75, no NaN), block multipliers 2^-(0..3) / sqrt(n_in) varying block by block;
// BF16 uniform in ±2 / sqrt(n_in); biases uniform in ±0.5. With x uniform in [-2, 2], mlp1's outputs
// land on both sides of the SwiGLU clamp (±7).
//
// Check: routing and grouping as the kernels left them (every routed row placed once); every u and y
// row finite (they start as NaN); for up to 48 tokens, u of each routed row against the reference fed the
// same x (FP8: the CPU quantisation, bit-exact with the GPU's: test_moe_matrix checks it) and y against
// the reference fed the GPU's own u (isolates mlp2). Tolerances:
//   FP8: the tensor core sums each k32 step with about 13 fraction bits of the largest term, a 128-k
//     block at a time: 2e-3 of the largest |u| (+ u's BF16 rounding, 1/128 relative) and of the largest
//     |y| (+ 1e-3 relative); and W8A8 against W8A16 (fp8_matmul on the FP32 activations): relative L2
//     of u below 2 · 2^-4 / sqrt(3) (two E4M3 roundings' RMS), printed;
//   BF16: FP32 accumulation in another order: 1e-4 of the largest |u| + 1/128 relative (u's BF16
//     rounding), 1e-4 of the largest |y| + 1e-4 relative.
// Perf (bench_moe_matrix): the whole pair (FP8: with both quantisations) per case, against 1470 (FP8)
// or 790 (BF16) TFLOP/s and 4.64 TB/s; bytes = the active experts' weights (+ FP8 multipliers) and
// biases, x read, u written and read, y written. Two layers of weights alternate and four input sets
// rotate so that no run finds its weights in L2.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/fp8.h"
#include "kernels/cases/harness.h"
#include "kernels/cpu/fp8_matmul.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/w4a8_matmul.h"
#include "kernels/cpu/w8a8_matmul.h"
#include "kernels/cuda/moe_group.h"
#include "kernels/cuda/moe_mlp_matrix.h"
#include "kernels/cuda/moe_route.h"

namespace osprey::cases::moe_matrix {

using cuda::MatrixFormat;

inline constexpr int kTopK = 4;

struct Shape {
    const char* name;
    int n_experts, d_model, d_ff;
};
inline constexpr Shape kTiny{"tiny", 8, 128, 128};
inline constexpr Shape k20b{"20b", 32, 2880, 2880};
inline constexpr Shape k120b{"120b", 128, 2880, 2880};
// mlp1 128 x 192 (FP8 1.5 k-blocks, BF16 3 stages; half a 256-row m-tile: a warpgroup idle); mlp2 192 x 64
// (half an FP8 k-block; 1.5 m-tiles of 128, 3/4 of 256: one m-block of a warpgroup idle).
inline constexpr Shape kEdges{"edges", 4, 192, 64};
// mlp1 640 x 448 (3.5 k-blocks, 2.5 or 5 m-tiles), mlp2 448 x 320 (2.5 k-blocks; 1.75 or 3.5 m-tiles).
inline constexpr Shape kWide{"wide", 6, 448, 320};

// Fills one projection of every expert: FP8 codes (exponent field 4..9, any sign and mantissa) and block
// multipliers, or BF16 values; biases.
__global__ void fill_matrix_kernel(uint8_t* w, size_t n_w, bool fp8, float* scales, size_t n_scales, bf16* bias,
                                   size_t n_bias, uint64_t seed, float gain) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (fp8 ? n_w : n_w / 2); i += stride) {
        const uint64_t r = mix64(seed ^ (i * 4 + 0));
        if (fp8) {
            w[i] = uint8_t((r & 0x80) | ((4 + (r >> 8) % 6) << 3) | ((r >> 16) & 7));
        } else {
            const float u = float(r >> 40) / float(1 << 24);
            reinterpret_cast<bf16*>(w)[i].bits = __bfloat16_as_ushort(__float2bfloat16_rn((2.0f * u - 1.0f) * 2.0f * gain));
        }
    }
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n_scales; i += stride)
        scales[i] = gain * exp2f(-float(mix64(seed ^ (i * 4 + 1)) % 4));
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n_bias; i += stride) {
        const float u = float(mix64(seed ^ (i * 4 + 2)) >> 40) / float(1 << 24);
        bias[i].bits = __bfloat16_as_ushort(__float2bfloat16_rn((2.0f * u - 1.0f) * 0.5f));
    }
}

// One projection [n_out, n_in] of every expert on the device; host copies of single experts on demand.
struct MatrixProjection {
    MatrixFormat format;
    int n_experts = 0, n_out = 0, n_in = 0;
    cuda::DeviceBuffer<uint8_t> d_w;    // [E, n_out, n_in] codes or BF16
    cuda::DeviceBuffer<float> d_scale;  // FP8: [E, nb(n_out), nb(n_in)]
    cuda::DeviceBuffer<bf16> d_bias;    // [E, n_out]
    std::vector<float> bias;            // host, as float
    std::map<int, std::vector<uint8_t>> w_host;  // expert -> its matrix bytes
    std::map<int, std::vector<float>> s_host;    // expert -> its multipliers

    MatrixProjection(MatrixFormat f, int e, int n_out_, int n_in_, uint64_t seed)
        : format(f), n_experts(e), n_out(n_out_), n_in(n_in_) {
        const bool fp8 = f == MatrixFormat::fp8;
        d_w.resize(size_t(e) * n_out * n_in * (fp8 ? 1 : 2));
        d_scale.resize(fp8 ? size_t(e * fp8::n_blocks(n_out) * fp8::n_blocks(n_in)) : 1);
        d_bias.resize(size_t(e) * n_out);
        fill_matrix_kernel<<<1024, 256>>>(d_w.get(), d_w.size(), fp8, d_scale.get(), fp8 ? d_scale.size() : 0,
                                          d_bias.get(), d_bias.size(), seed, 1.0f / std::sqrt(float(n_in)));
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaDeviceSynchronize());
        bias = to_float(d_bias.download());
    }
    cuda::MatrixExperts view() const {
        return {d_w.get(), format == MatrixFormat::fp8 ? d_scale.get() : nullptr, d_bias.get()};
    }
    size_t expert_bytes() const { return size_t(n_out) * n_in * (format == MatrixFormat::fp8 ? 1 : 2); }
    void fetch(int e) {
        if (w_host.count(e)) return;
        std::vector<uint8_t> w(expert_bytes());
        CUDA_CHECK(cudaMemcpy(w.data(), d_w.get() + size_t(e) * expert_bytes(), w.size(), cudaMemcpyDeviceToHost));
        w_host[e] = std::move(w);
        if (format == MatrixFormat::fp8) {
            const size_t ns = size_t(fp8::n_blocks(n_out) * fp8::n_blocks(n_in));
            std::vector<float> s(ns);
            CUDA_CHECK(cudaMemcpy(s.data(), d_scale.get() + size_t(e) * ns, ns * 4, cudaMemcpyDeviceToHost));
            s_host[e] = std::move(s);
        }
    }
    cpu::Fp8Matrix fp8_matrix(int e) {
        fetch(e);
        return {.data = w_host[e].data(), .scale_inv = s_host[e].data(), .ld = n_in};
    }
    std::span<const float> bias_of(int e) const { return std::span<const float>(bias).subspan(size_t(e) * n_out, n_out); }
    // One row through the projection: FP8 W8A8 on (xq, xs), or FP8 W8A16 / BF16 on x (FP32).
    std::vector<float> w8a8(int e, const std::vector<uint8_t>& xq, const std::vector<float>& xs) {
        std::vector<float> y(n_out);
        cpu::w8a8::matmul(y, xq, xs, fp8_matrix(e), bias_of(e), 1, n_in, n_out);
        return y;
    }
    std::vector<float> exact(int e, const std::vector<float>& x) {
        std::vector<float> y(n_out);
        if (format == MatrixFormat::fp8) {
            cpu::fp8_matmul(y, x, fp8_matrix(e), bias_of(e), 1, n_in, n_out);
        } else {
            fetch(e);
            const auto* w = reinterpret_cast<const bf16*>(w_host[e].data());
            cpu::matmul_bf16w(y, x, std::span<const bf16>(w, size_t(n_out) * n_in), bias_of(e), 1, n_in, n_out);
        }
        return y;
    }
};

struct Experts {
    MatrixProjection mlp1, mlp2;
    Experts(MatrixFormat f, const Shape& s, uint64_t seed)
        : mlp1(f, s.n_experts, 2 * s.d_ff, s.d_model, seed), mlp2(f, s.n_experts, s.d_model, s.d_ff, seed + 1) {}
};

// Expert weights per (shape, format, layer), made once per process on first use; never destroyed (device
// memory must not be freed after the CUDA runtime has shut down). 120b BF16 is 6.4 GB per layer.
inline Experts& experts_for(const Shape& s, MatrixFormat f, int layer, uint64_t seed) {
    static auto* cache = new std::map<std::tuple<std::string, int, int>, std::unique_ptr<Experts>>;
    auto& p = (*cache)[{s.name, int(f), layer}];
    if (!p) p = std::make_unique<Experts>(f, s, seed);
    return *p;
}

struct Case {
    std::string name;
    std::string label;  // unused (perf lines are labelled per case)
    Use use = Use::both;
    Shape shape = k20b;
    int n_tokens = 1;
    MatrixFormat format = MatrixFormat::fp8;
    int variant = -1;      // -1: the automatic choice
    int experts_used = 0;  // > 0: the batch concentrated on experts [0, experts_used)
};

// Logits uniform in [-4, 4] (or pushed onto experts [0, experts_used)), routed and grouped on the device.
struct Routed {
    int n_tokens = 0, n_rows = 0;
    cuda::DeviceBuffer<bf16> x;
    cuda::DeviceBuffer<float> logits, w;
    cuda::DeviceBuffer<int32_t> ids, offsets, sorted, scratch;
    Routed(const Shape& s, int n, int experts_used, uint32_t seed, int stream0) : n_tokens(n), n_rows(n * kTopK) {
        x = device_uniform<bf16>(size_t(n) * s.d_model, stream_seed(seed, stream0 + 1), -2.f, 2.f);
        logits = device_uniform<float>(size_t(n) * s.n_experts, stream_seed(seed, stream0 + 2), -4.f, 4.f);
        if (experts_used > 0) {
            std::vector<float> l = logits.download(size_t(n) * s.n_experts);
            for (int t = 0; t < n; ++t)
                for (int e = experts_used; e < s.n_experts; ++e) l[size_t(t) * s.n_experts + e] -= 100.0f;
            logits.upload(l);
        }
        w = poisoned<float>(n_rows), ids = poisoned<int32_t>(n_rows), offsets = poisoned<int32_t>(s.n_experts + 1);
        sorted = poisoned<int32_t>(n_rows);
        scratch.resize(std::max<size_t>(1, cuda::moe_group_scratch_elems(n, kTopK, s.n_experts)));
        cuda::moe_route_topk({.expert_ids = ids.get(), .expert_weights = w.get(), .logits = logits.get(),
                              .n_tokens = n, .n_experts = s.n_experts, .top_k = kTopK},
                             nullptr);
        cuda::moe_group_by_expert({.expert_offsets = offsets.get(), .sorted_rows = sorted.get(), .scratch = scratch.get(),
                                   .expert_ids = ids.get(), .n_tokens = n, .n_experts = s.n_experts, .top_k = kTopK},
                                  nullptr);
    }
};

inline cuda::MoeMatrixArgs args_for(const Case& c, const Experts& ex, const Routed& in, bf16* u, float* y, void* ws) {
    const Shape& s = c.shape;
    return {.y = y, .u = u, .x = in.x.get(), .format = c.format, .mlp1 = ex.mlp1.view(), .mlp2 = ex.mlp2.view(),
            .expert_offsets = in.offsets.get(), .sorted_rows = in.sorted.get(), .workspace = ws,
            .n_tokens = in.n_tokens, .n_experts = s.n_experts, .top_k = kTopK, .d_model = s.d_model, .d_ff = s.d_ff,
            .variant = c.variant};
}

inline Result check(const Case& c, Result r) {
    const Shape& s = c.shape;
    const bool fp8 = c.format == MatrixFormat::fp8;
    Experts& ex = experts_for(s, c.format, 0, mix64(r.seed));
    const int n_tokens = c.n_tokens, n_rows = n_tokens * kTopK;
    const Routed in(s, n_tokens, c.experts_used, r.seed, 0);
    auto d_u = poisoned<bf16>(size_t(n_rows) * s.d_ff);
    auto d_y = poisoned<float>(size_t(n_rows) * s.d_model);
    auto d_ws = poisoned<uint8_t>(cuda::moe_matrix_workspace_bytes(c.format, n_tokens, kTopK, s.d_model, s.d_ff));
    cuda::moe_matrix(args_for(c, ex, in, d_u.get(), d_y.get(), d_ws.get()), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());

    const std::vector<int32_t> ids = in.ids.download(n_rows);
    const std::vector<int32_t> offsets = in.offsets.download(s.n_experts + 1), sorted = in.sorted.download(n_rows);
    const std::vector<float> xf = to_float(in.x.download(size_t(n_tokens) * s.d_model));
    const std::vector<float> u = to_float(d_u.download(size_t(n_rows) * s.d_ff));
    const std::vector<float> y = d_y.download(size_t(n_rows) * s.d_model);
    std::vector<int32_t> position(n_rows, -1);  // routed row (t * top_k + slot) -> its place in sorted order
    for (int e = 0; e < s.n_experts; ++e)
        for (int p = offsets[e]; p < offsets[e + 1]; ++p) {
            if (p < 0 || p >= n_rows || sorted[p] < 0 || sorted[p] >= n_rows || ids[sorted[p]] != e ||
                position[sorted[p]] != -1) {
                r.fail("grouping: position ", p, " of expert ", e);
                return r;
            }
            position[sorted[p]] = p;
        }
    if (offsets[s.n_experts] != n_rows) r.fail("grouping: ", offsets[s.n_experts], " rows placed of ", n_rows);
    for (size_t i = 0; i < u.size(); ++i)
        if (!std::isfinite(u[i])) return r.fail("u[", i, "] = ", u[i]), r;
    for (size_t i = 0; i < y.size(); ++i)
        if (!std::isfinite(y[i])) return r.fail("y[", i, "] = ", y[i]), r;

    std::set<int> tokens{0, n_tokens - 1};
    std::mt19937 rng(r.seed);
    while (int(tokens.size()) < std::min(n_tokens, 48)) tokens.insert(int(rng() % n_tokens));
    const int kb1 = cpu::w4a8::n_blocks(s.d_model), kb2 = cpu::w4a8::n_blocks(s.d_ff);
    std::vector<float> got_u, want_u, exact_u, got_y, want_y;
    std::vector<float> a1(2 * s.d_ff), ue(s.d_ff);
    for (int t : tokens) {
        const std::vector<float> xt(xf.begin() + size_t(t) * s.d_model, xf.begin() + size_t(t + 1) * s.d_model);
        std::vector<uint8_t> xq(s.d_model);
        std::vector<float> xs(kb1);
        if (fp8) cpu::w4a8::quantize_rows(xq, xs, xt, 1, s.d_model);
        for (int k = 0; k < kTopK; ++k) {
            const int row = t * kTopK + k, e = ids[row], p = position[row];
            // mlp1 + SwiGLU against the reference on the same x (and, FP8, W8A16's exact activations)
            cpu::swiglu_clamped(ue, ex.mlp1.exact(e, xt), 1, s.d_ff, 1.702f, 7.0f);
            exact_u.insert(exact_u.end(), ue.begin(), ue.end());
            if (fp8) {
                std::vector<float> uw(s.d_ff);
                cpu::swiglu_clamped(uw, ex.mlp1.w8a8(e, xq, xs), 1, s.d_ff, 1.702f, 7.0f);
                want_u.insert(want_u.end(), uw.begin(), uw.end());
            } else {
                want_u.insert(want_u.end(), ue.begin(), ue.end());
            }
            const std::vector<float> ug(u.begin() + size_t(p) * s.d_ff, u.begin() + size_t(p + 1) * s.d_ff);
            got_u.insert(got_u.end(), ug.begin(), ug.end());
            // mlp2 fed the GPU's own u
            std::vector<float> yw;
            if (fp8) {
                std::vector<uint8_t> uq(s.d_ff);
                std::vector<float> us(kb2);
                cpu::w4a8::quantize_rows(uq, us, ug, 1, s.d_ff);
                yw = ex.mlp2.w8a8(e, uq, us);
            } else {
                yw = ex.mlp2.exact(e, ug);
            }
            want_y.insert(want_y.end(), yw.begin(), yw.end());
            got_y.insert(got_y.end(), y.begin() + size_t(row) * s.d_model, y.begin() + size_t(row + 1) * s.d_model);
        }
    }
    const std::string f = cuda::matrix_format_name(c.format);
    if (fp8) {
        expect_near_all(r, got_u, want_u, 2e-3, 1.0 / 128, f + " mlp1 u vs the W8A8 reference");
        expect_near_all(r, got_y, want_y, 2e-3, 1e-3, f + " mlp2 y vs the W8A8 reference");
        const double step = 0.0625 / std::sqrt(3.0), eu = rel_l2(got_u, exact_u);
        if (!(eu < 2 * step)) r.fail("W8A8 u vs W8A16: relative L2 ", eu, " >= ", 2 * step);
        r.note(str("W8A8 vs W8A16 (FP32 activations): u relative L2 ", eu));
    } else {
        expect_near_all(r, got_u, want_u, 1e-4, 1.0 / 128, f + " mlp1 u vs the reference");
        expect_near_all(r, got_y, want_y, 1e-4, 1e-4, f + " mlp2 y vs the reference");
    }
    return r;
}

inline Result perf(const Case& c, Result r) {
    constexpr int kLayers = 2, kInputs = 4;
    const Shape& s = c.shape;
    const bool fp8 = c.format == MatrixFormat::fp8;
    const int n_tokens = c.n_tokens, n_rows = n_tokens * kTopK, d_model = s.d_model, d_ff = s.d_ff;
    std::vector<Experts*> layers;
    for (int l = 0; l < kLayers; ++l) layers.push_back(&experts_for(s, c.format, l, 1000 + 17 * l));
    std::vector<std::unique_ptr<Routed>> in;
    double n_active = 0;
    for (int i = 0; i < kInputs; ++i) {
        in.push_back(std::make_unique<Routed>(s, n_tokens, c.experts_used, r.seed, 10 * i));
        const std::vector<int32_t> off = in.back()->offsets.download();
        for (int e = 0; e < s.n_experts; ++e) n_active += (off[e + 1] > off[e]) / double(kInputs);
    }
    cuda::DeviceBuffer<bf16> u(size_t(n_rows) * d_ff);
    cuda::DeviceBuffer<float> y(size_t(n_rows) * d_model);
    cuda::DeviceBuffer<uint8_t> ws(std::max<size_t>(1, cuda::moe_matrix_workspace_bytes(c.format, n_tokens, kTopK, d_model, d_ff)));
    auto pair = [&](int i) {
        cuda::moe_matrix(args_for(c, *layers[i % kLayers], *in[i % kInputs], u.get(), y.get(), ws.get()), nullptr);
    };
    const int iters = iters_or(n_tokens >= 1024 ? 10 : 50);
    const double eb = fp8 ? 1.0 : 2.0;
    const double nb = double(fp8::n_blocks(d_model)), nf = double(fp8::n_blocks(d_ff)), n2 = double(fp8::n_blocks(2 * d_ff));
    const double w_bytes = 3.0 * d_ff * d_model * eb + (fp8 ? 4.0 * (n2 * nb + nb * nf) : 0.0) + 2.0 * (2 * d_ff + d_model);
    const double act = 2.0 * n_tokens * d_model + 2.0 * 2 * n_rows * d_ff + 4.0 * n_rows * d_model +
                       (fp8 ? 2.0 * n_tokens * d_model + 2.0 * n_rows * d_ff : 0.0);  // quantised x, u written and read
    const double flops = 2.0 * n_rows * 3.0 * d_ff * d_model;
    const int v = c.variant >= 0 ? c.variant : cuda::moe_matrix_variant_for(c.format, n_tokens, kTopK, s.n_experts);
    char label[128];
    std::snprintf(label, sizeof label, "%s %5d tok mlp1+mlp2 %s v%d", s.name, n_tokens, cuda::matrix_format_name(c.format), v);
    r.note(str(label, ": ", n_rows, " routed rows, ", n_active, " active experts on average"));
    Timing t{label, time_us(pair, iters), n_active * w_bytes + act, flops};
    t.math = fp8 ? Math::fp8 : Math::bf16;
    r.timings.push_back(t);
    return r;
}

inline Result run(const Case& c, Mode mode) {
    Result r;
    r.seed = case_seed(mode);
    return mode == Mode::check ? check(c, std::move(r)) : perf(c, std::move(r));
}

inline std::vector<Case> cases() {
    std::vector<Case> t;
    // One case per variant the format takes; the automatic choice first (unsuffixed), the forced variants
    // checked (and timed from 1024 tokens, where they are meant to differ).
    auto add = [&](const Shape& s, int n, MatrixFormat f, Use use, int experts_used = 0, const char* prefix = "") {
        const std::string base = str(prefix, s.name, "_", n, "_", cuda::matrix_format_name(f));
        t.push_back({.name = base, .use = use, .shape = s, .n_tokens = n, .format = f, .experts_used = experts_used});
        for (int v = 0; v < cuda::moe_matrix_variants(); ++v) {
            if (!cuda::moe_matrix_variant_takes(f, v)) continue;
            Case cv{.name = str(base, "_v", v), .use = use, .shape = s, .n_tokens = n, .format = f, .variant = v,
                    .experts_used = experts_used};
            if (cv.use == Use::both && n < 1024) cv.use = Use::check_only;
            t.push_back(cv);
        }
    };
    for (MatrixFormat f : {MatrixFormat::fp8, MatrixFormat::bf16}) {
        for (int n : {1, 3, 8, 64, 333, 2048}) add(kTiny, n, f, Use::check_only);
        // 20b and 120b: the bench's token counts (decode 1 and 8, mid 64, prefill 1024 and 8192) and odd ones.
        for (const Shape& s : {k20b, k120b})
            for (int n : {1, 3, 8, 64, 333, 1024, 8192}) {
                const bool bench = n == 1 || n == 8 || n == 64 || n == 1024 || n == 8192;
                add(s, n, f, bench ? Use::both : Use::check_only);
            }
        // Token tiles of 64 and 128 routed rows: one row less, exactly, one more, two plus a rest (4 experts).
        for (int n : {63, 64, 65, 127, 128, 129, 263}) add(k20b, n, f, Use::check_only, 4, "tiles_");
        // The 120b shape on a few experts (many rows each).
        add(k120b, 300, f, Use::check_only, 4, "few_");
        // Partial k-blocks and m-tiles, ragged experts, experts without rows.
        for (int n : {1, 5, 300}) add(kEdges, n, f, Use::check_only);
        for (int n : {1, 40, 300}) add(kWide, n, f, Use::check_only);
    }
    return t;
}

}  // namespace osprey::cases::moe_matrix
