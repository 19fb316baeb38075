// The MoE step with MXFP4 experts (kernels/cuda/moe_mlp_mxfp4.h and its neighbours): route -> group ->
// mlp1 -> mlp2 -> combine. One table for the test (tests/kernels/test_moe_mlp.cu, against the CPU
// reference kernels mxfp4_matmul, swiglu, routing) and the benchmark (bench/bench_moe.cu): the tiny,
// 20b (32 experts) and 120b (128 experts) shapes, batches of 1 to 8192 tokens, each tiling forced
// (gemv, narrow, gemm, and the Hopper wgmma kernel) and the automatic choice, plus shapes cut at the
// kernels' tile constants.
//
// Check: the whole chain on one set of inputs; routing and grouping exact, u, y and the combined
// output of up to 48 tokens against the reference (tolerances below). Perf (bench_moe's lines before
// the tables, same labels): a forced-tiling case times its mlp1 and mlp2; an automatic case times
// route, group, combine and the whole step. Two layers of weights alternate and four input sets
// rotate between runs so that no run finds its weights in L2. Bytes count what must move at least:
// the active experts' MXFP4 weights (4.25 bits/weight + BF16 bias) and the activations; FLOPs are
// 2 · rows · n_out · n_in per projection (BF16 tensor cores after the FP4 decode).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cases/harness.h"
#include "kernels/cpu/mxfp4_matmul.h"
#include "kernels/cpu/routing.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/w4a8_matmul.h"
#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/moe_decode.h"
#include "kernels/cuda/moe_group.h"
#include "kernels/cuda/moe_mlp_mxfp4.h"
#include "kernels/cuda/moe_mlp_w4a8.h"
#include "kernels/cuda/moe_mlp_wgmma.h"
#include "kernels/cuda/moe_route.h"

namespace osprey::cases::moe_mlp {

using cuda::MoeKernel;

inline constexpr int kTopK = 4;
// Mirrors the tile constants of kernels/cuda/moe_mlp_mxfp4.cu and moe_mlp_wgmma.cu.
inline constexpr int kGemvRows = 8, kNarrowRows = 32, kGemmRows = 128;  // routed rows per token tile
inline constexpr int kWgmmaRows = 128, kWgmmaSsRows160 = 160;  // also 256 (variants 3 and 6), 64 (4), 160 (7)
inline constexpr int kGemvBM = 32, kGemmBM = 128, kWgmmaBM = 256;        // weight rows per block / tile
inline constexpr int kBK = 64;                                           // k per pipeline stage
inline constexpr int kWgmmaStages = 5;

struct Shape {
    const char* name;
    int n_experts, d_model, d_ff;
};
inline constexpr Shape kTiny{"tiny", 8, 128, 128};
inline constexpr Shape k20b{"20b", 32, 2880, 2880};
inline constexpr Shape k120b{"120b", 128, 2880, 2880};
// Output widths that leave partial blocks (mlp2: 192 rows = 1.5 gemm blocks, 6 gemv blocks, 3/4 of a
// wgmma tile; mlp1: 128 rows = half a wgmma tile, one consumer warpgroup idle) and an input width
// shorter than the pipeline depth (3 stages of kBK).
inline constexpr Shape kEdges{"edges", 4, 3 * kBK, kBK};
static_assert(kEdges.d_model % kGemvBM == 0 && kEdges.d_model % kGemmBM != 0 && kEdges.d_model % kWgmmaBM != 0);
// wgmma: several m-tiles with a partial last one (mlp1 640 rows = 2.5 tiles, mlp2 320 = 1.25) and a
// k-loop longer than its ring (5 and 7 stages of kBK wrap the 5-stage ring inside one tile).
inline constexpr Shape kWgmmaEdges{"wgmma_edges", 6, 448, 320};
static_assert(2 * kWgmmaEdges.d_ff % kWgmmaBM != 0 && kWgmmaEdges.d_model / kBK > kWgmmaStages);

// Fills an MXFP4 projection: uniformly random nibbles, scale bytes in [scale_lo, scale_lo + 6],
// bias uniform in [-bias_range, bias_range] (rounded to bf16).
__global__ void fill_mxfp4_kernel(uint8_t* blocks, size_t n_blocks_bytes, uint8_t* scales, size_t n_scales, bf16* bias,
                                  size_t n_bias, uint64_t seed, int scale_lo, float bias_range) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n_blocks_bytes / 8; i += stride)
        reinterpret_cast<uint64_t*>(blocks)[i] = mix64(seed ^ (i * 3 + 0));
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n_scales; i += stride)
        scales[i] = uint8_t(scale_lo + mix64(seed ^ (i * 3 + 1)) % 7);
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n_bias; i += stride) {
        const float u = float(mix64(seed ^ (i * 3 + 2)) >> 40) / float(1 << 24);  // [0, 1)
        bias[i].bits = __bfloat16_as_ushort(__float2bfloat16_rn((2.0f * u - 1.0f) * bias_range));
    }
}

// One projection of every expert on the device, and (when a check needs it) copied to the host.
struct Mxfp4Projection {
    int n_experts = 0, n_out = 0, n_in = 0;
    cuda::DeviceBuffer<uint8_t> d_blocks, d_scales;  // [n_experts, n_out, n_in/32, 16], [n_experts, n_out, n_in/32]
    cuda::DeviceBuffer<bf16> d_bias;                 // [n_experts, n_out]
    std::vector<uint8_t> blocks, scales;             // host copies (empty until download_host)
    std::vector<float> bias;                         // as float for the CPU reference
    mutable std::unique_ptr<cuda::DeviceBuffer<uint8_t>> d_blocks_decode;  // view(decode)'s copy, made on first use

    Mxfp4Projection(int n_experts_, int n_out_, int n_in_, uint64_t seed, int scale_lo)
        : n_experts(n_experts_), n_out(n_out_), n_in(n_in_) {
        const size_t rows = size_t(n_experts) * n_out;
        d_blocks.resize(rows * (n_in / 2));
        d_scales.resize(rows * (n_in / 32));
        d_bias.resize(rows);
        fill_mxfp4_kernel<<<1024, 256>>>(d_blocks.get(), d_blocks.size(), d_scales.get(), d_scales.size(),
                                         d_bias.get(), d_bias.size(), seed, scale_lo, 0.5f);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaDeviceSynchronize());
    }
    void download_host() {
        if (!blocks.empty()) return;
        blocks = d_blocks.download();
        scales = d_scales.download();
        bias = to_float(d_bias.download());
    }
    cuda::Mxfp4Experts view() const { return {d_blocks.get(), d_scales.get(), d_bias.get()}; }
    // The experts as moe_decode reads them with `words`: the decode layout (mxfp4_words.h) from a copy of
    // the blocks made on the device on first use and kept with the projection.
    cuda::Mxfp4Experts view(cuda::Mxfp4WordLayout words) const {
        if (words == cuda::Mxfp4WordLayout::published) return view();
        if (!d_blocks_decode) {
            d_blocks_decode = std::make_unique<cuda::DeviceBuffer<uint8_t>>(d_blocks.size());
            cuda::mxfp4_to_decode_layout(d_blocks.get(), d_blocks_decode->get(), d_blocks.bytes(), nullptr);
            CUDA_CHECK(cudaDeviceSynchronize());
        }
        return {d_blocks_decode->get(), d_scales.get(), d_bias.get()};
    }

    // y[n_rows, n_out] = x[n_rows, n_in] · W[e]ᵀ + b[e] with the CPU reference kernel (after download_host).
    void ref(int e, const std::vector<float>& x, int n_rows, std::vector<float>& y) const {
        const size_t row0 = size_t(e) * n_out;
        y.assign(size_t(n_rows) * n_out, 0.0f);
        cpu::mxfp4_matmul(y, x, std::span(blocks).subspan(row0 * (n_in / 2), size_t(n_out) * (n_in / 2)),
                          std::span(scales).subspan(row0 * (n_in / 32), size_t(n_out) * (n_in / 32)),
                          std::span(bias).subspan(row0, n_out), n_rows, n_in, n_out);
    }
    // The W4A8 reference on quantised rows (xq natural order, xs [n_rows, ceil(n_in / 128)]).
    void ref_w4a8(int e, const std::vector<uint8_t>& xq, const std::vector<float>& xs, int n_rows,
                  std::vector<float>& y) const {
        const size_t row0 = size_t(e) * n_out;
        y.assign(size_t(n_rows) * n_out, 0.0f);
        cpu::w4a8::matmul(y, xq, xs, std::span(blocks).subspan(row0 * (n_in / 2), size_t(n_out) * (n_in / 2)),
                          std::span(scales).subspan(row0 * (n_in / 32), size_t(n_out) * (n_in / 32)),
                          std::span(bias).subspan(row0, n_out), n_rows, n_in, n_out);
    }
};

struct Experts {
    Mxfp4Projection mlp1, mlp2;
    Experts(const Shape& s, uint64_t seed)
        // Scale bytes 116..122: weights up to 6 * 2^-5, so mlp1's outputs land on both sides of the
        // SwiGLU clamp (±7) for x in [-2, 2].
        : mlp1(s.n_experts, 2 * s.d_ff, s.d_model, seed, 116), mlp2(s.n_experts, s.d_model, s.d_ff, seed + 1, 116) {}
};

// Expert weights per (shape, layer), made once per process (the 120b set is 1.7 GB) from `seed` on
// first use. Never destroyed: device memory must not be freed after the CUDA runtime has shut down.
inline Experts& experts_for(const Shape& s, int layer, uint64_t seed) {
    static auto* cache = new std::map<std::pair<std::string, int>, std::unique_ptr<Experts>>;
    auto& p = (*cache)[{s.name, layer}];
    if (!p) p = std::make_unique<Experts>(s, seed);
    return *p;
}

struct Case {
    std::string name;   // gtest name: <shape>_<tokens>_<kernel> as before the tables
    std::string label;  // unused (perf lines are labelled per stage)
    Use use = Use::both;
    Shape shape = k20b;
    int n_tokens = 1;
    MoeKernel kernel = MoeKernel::automatic;
    int experts_used = 0;  // > 0: the batch concentrated on experts [0, experts_used) (many rows each)
    int wgmma_variant = -1;  // wgmma / w4a8 cases: the kernel configuration (moe_mlp_wgmma.h, moe_mlp_w4a8.h); -1: the env's
    bool w4a8 = false;       // moe_w4a8 (FP8 wgmma) in place of mlp1 + mlp2 (kernel is then unused)
};

// A W4A8 case: route -> group -> moe_w4a8 (quantise x, mlp1, quantise u, mlp2) -> combine, checked
//   - u against the W4A8 reference fed the same quantised x (the CPU quantisation is the GPU's, bit for
//     bit; the test of moe_w4a8_quantize checks that): the FP8 tensor core truncates each k32 step's sum
//     to about 13 fraction bits of its largest term, so 2e-3 of the largest |u| plus u's BF16 rounding;
//   - y against the W4A8 reference fed the GPU's own u (quantised on the CPU): 2e-3 of the largest |y|;
//   - u and the MoE output against the exact (MXFP4 x FP32) chain: relative L2 below 2 · 2^-4 / sqrt(3),
//     twice the RMS of one E4M3 rounding (the weights are exact): u carries x's rounding through both
//     factors of the SwiGLU, the output adds u's own. The CPU references give 3.5e-2 (u) and 4.2e-2
//     (y) at 20b's widths, 2.5e-2 and 1.8e-2 at the tiny model's.
inline Result check_w4a8(const Case& c, Result r) {
    const Shape& s = c.shape;
    Experts& ex = experts_for(s, 0, mix64(r.seed));
    ex.mlp1.download_host();
    ex.mlp2.download_host();
    const int n_tokens = c.n_tokens, n_rows = n_tokens * kTopK;
    std::mt19937 rng(r.seed);
    auto d_x = device_uniform<bf16>(size_t(n_tokens) * s.d_model, stream_seed(r.seed, 1), -2.f, 2.f);
    auto d_logits = device_uniform<float>(size_t(n_tokens) * s.n_experts, stream_seed(r.seed, 2), -4.f, 4.f);
    std::vector<float> logits = d_logits.download(size_t(n_tokens) * s.n_experts);
    if (c.experts_used > 0) {
        for (int t = 0; t < n_tokens; ++t)
            for (int e = c.experts_used; e < s.n_experts; ++e) logits[size_t(t) * s.n_experts + e] -= 100.0f;
        d_logits.upload(logits);
    }
    auto d_out = device_uniform<float>(size_t(n_tokens) * s.d_model, stream_seed(r.seed, 3), -1.f, 1.f);
    const std::vector<bf16> x = d_x.download(size_t(n_tokens) * s.d_model);
    const std::vector<float> residual = d_out.download(size_t(n_tokens) * s.d_model);
    auto d_ids = poisoned<int32_t>(n_rows);
    auto d_w = poisoned<float>(n_rows);
    auto d_offsets = poisoned<int32_t>(s.n_experts + 1);
    auto d_sorted = poisoned<int32_t>(n_rows);
    cuda::DeviceBuffer<int32_t> d_scratch(
        std::max<size_t>(1, cuda::moe_group_scratch_elems(n_tokens, kTopK, s.n_experts)));
    auto d_u = poisoned<bf16>(size_t(n_rows) * s.d_ff);
    auto d_y = poisoned<float>(size_t(n_rows) * s.d_model);
    auto d_ws = poisoned<uint8_t>(cuda::moe_w4a8_workspace_bytes(n_tokens, kTopK, s.d_model, s.d_ff));
    cuda::moe_route_topk({.expert_ids = d_ids.get(), .expert_weights = d_w.get(), .logits = d_logits.get(),
                          .n_tokens = n_tokens, .n_experts = s.n_experts, .top_k = kTopK},
                         nullptr);
    cuda::moe_group_by_expert({.expert_offsets = d_offsets.get(), .sorted_rows = d_sorted.get(),
                               .scratch = d_scratch.get(), .expert_ids = d_ids.get(), .n_tokens = n_tokens,
                               .n_experts = s.n_experts, .top_k = kTopK},
                              nullptr);
    cuda::moe_w4a8({.y = d_y.get(), .u = d_u.get(), .x = d_x.get(), .mlp1 = ex.mlp1.view(), .mlp2 = ex.mlp2.view(),
                    .expert_offsets = d_offsets.get(), .sorted_rows = d_sorted.get(), .workspace = d_ws.get(),
                    .n_tokens = n_tokens, .n_experts = s.n_experts, .top_k = kTopK, .d_model = s.d_model,
                    .d_ff = s.d_ff, .variant = c.wgmma_variant},
                   nullptr);
    cuda::moe_combine({.out = d_out.get(), .y = d_y.get(), .expert_weights = d_w.get(), .n_tokens = n_tokens,
                       .d_model = s.d_model, .top_k = kTopK},
                      nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());

    const std::vector<int32_t> ids = d_ids.download(n_rows);
    const std::vector<float> w = d_w.download(n_rows);
    const std::vector<int32_t> offsets = d_offsets.download(s.n_experts + 1), sorted = d_sorted.download(n_rows);
    const std::vector<bf16> u = d_u.download(size_t(n_rows) * s.d_ff);
    const std::vector<float> y = d_y.download(size_t(n_rows) * s.d_model);
    const std::vector<float> out = d_out.download(size_t(n_tokens) * s.d_model);
    std::vector<int32_t> position(n_rows, -1);
    for (int e = 0; e < s.n_experts; ++e)
        for (int p = offsets[e]; p < offsets[e + 1]; ++p) {
            if (p < 0 || p >= n_rows || sorted[p] < 0 || sorted[p] >= n_rows || ids[sorted[p]] != e) {
                r.fail("grouping: position ", p, " of expert ", e);
                return r;
            }
            position[sorted[p]] = p;
        }
    for (size_t i = 0; i < y.size(); ++i)
        if (!std::isfinite(y[i])) {
            r.fail("y[", i, "] = ", y[i]);
            return r;
        }

    std::set<int> tokens;
    if (n_tokens <= 48) {
        for (int t = 0; t < n_tokens; ++t) tokens.insert(t);
    } else {
        tokens = {0, n_tokens - 1};
        while (int(tokens.size()) < 48) tokens.insert(int(rng() % n_tokens));
    }
    std::map<int, std::vector<int>> rows_of;
    for (int t : tokens)
        for (int k = 0; k < kTopK; ++k) rows_of[ids[t * kTopK + k]].push_back(t * kTopK + k);
    const int kb1 = cpu::w4a8::n_blocks(s.d_model), kb2 = cpu::w4a8::n_blocks(s.d_ff);
    std::vector<float> got_u, want_u, exact_u, got_y, want_y;
    std::map<int, std::vector<float>> y_exact;  // routed row -> the exact chain's y
    for (const auto& [e, rows] : rows_of) {
        const int n = int(rows.size());
        std::vector<float> xe(size_t(n) * s.d_model), a, ue(size_t(n) * s.d_ff), ux(size_t(n) * s.d_ff),
            ug(size_t(n) * s.d_ff), ye, yx;
        for (int i = 0; i < n; ++i)
            for (int col = 0; col < s.d_model; ++col)
                xe[size_t(i) * s.d_model + col] = bf16_to_float(x[size_t(rows[i] / kTopK) * s.d_model + col]);
        std::vector<uint8_t> xq(xe.size()), uq(ug.size());
        std::vector<float> xs(size_t(n) * kb1), us(size_t(n) * kb2);
        cpu::w4a8::quantize_rows(xq, xs, xe, n, s.d_model);
        ex.mlp1.ref_w4a8(e, xq, xs, n, a);
        cpu::swiglu_clamped(ue, a, n, s.d_ff, 1.702f, 7.0f);
        ex.mlp1.ref(e, xe, n, a);
        cpu::swiglu_clamped(ux, a, n, s.d_ff, 1.702f, 7.0f);
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < s.d_ff; ++j)
                ug[size_t(i) * s.d_ff + j] = bf16_to_float(u[size_t(position[rows[i]]) * s.d_ff + j]);  // natural columns
        got_u.insert(got_u.end(), ug.begin(), ug.end());
        want_u.insert(want_u.end(), ue.begin(), ue.end());
        exact_u.insert(exact_u.end(), ux.begin(), ux.end());
        cpu::w4a8::quantize_rows(uq, us, ug, n, s.d_ff);
        ex.mlp2.ref_w4a8(e, uq, us, n, ye);  // fed the GPU's own u: isolates mlp2
        ex.mlp2.ref(e, ux, n, yx);           // the exact chain
        for (int i = 0; i < n; ++i) {
            got_y.insert(got_y.end(), y.begin() + size_t(rows[i]) * s.d_model, y.begin() + size_t(rows[i] + 1) * s.d_model);
            want_y.insert(want_y.end(), ye.begin() + size_t(i) * s.d_model, ye.begin() + size_t(i + 1) * s.d_model);
            y_exact[rows[i]].assign(yx.begin() + size_t(i) * s.d_model, yx.begin() + size_t(i + 1) * s.d_model);
        }
    }
    expect_near_all(r, got_u, want_u, 2e-3, 1.0 / 128, "w4a8 mlp1 u vs the W4A8 reference");
    expect_near_all(r, got_y, want_y, 2e-3, 1e-3, "w4a8 mlp2 y vs the W4A8 reference");
    const double step = 0.0625 / std::sqrt(3.0);  // RMS of one E4M3 rounding, relative
    const double eu = rel_l2(got_u, exact_u);
    if (!(eu < 2 * step)) r.fail("w4a8 u vs the exact chain: relative L2 ", eu, " >= ", 2 * step);
    std::vector<float> got_out, exact_out;
    for (int t : tokens)
        for (int col = 0; col < s.d_model; ++col) {
            double sum = 0.0;
            for (int k = 0; k < kTopK; ++k) sum += double(w[t * kTopK + k]) * y_exact[t * kTopK + k][col];
            got_out.push_back(out[size_t(t) * s.d_model + col] - residual[size_t(t) * s.d_model + col]);
            exact_out.push_back(float(sum));
        }
    const double eo = rel_l2(got_out, exact_out);
    if (!(eo < 2 * step)) r.fail("w4a8 moe output vs the exact chain: relative L2 ", eo, " >= ", 2 * step);
    r.note(str("w4a8 relative L2 vs exact: u ", eu, ", moe output ", eo));
    return r;
}

inline Result check(const Case& c, Result r) {
    if (c.w4a8) return check_w4a8(c, std::move(r));
    const Shape& s = c.shape;
    Experts& ex = experts_for(s, 0, mix64(r.seed));
    ex.mlp1.download_host();
    ex.mlp2.download_host();
    const int n_tokens = c.n_tokens, n_rows = n_tokens * kTopK;
    std::mt19937 rng(r.seed);

    // Inputs: x ~ the normed hidden state (bf16), router logits, residual.
    auto d_x = device_uniform<bf16>(size_t(n_tokens) * s.d_model, stream_seed(r.seed, 1), -2.f, 2.f);
    auto d_logits = device_uniform<float>(size_t(n_tokens) * s.n_experts, stream_seed(r.seed, 2), -4.f, 4.f);
    std::vector<float> logits = d_logits.download(size_t(n_tokens) * s.n_experts);
    if (c.experts_used > 0) {  // concentrate the batch on a few experts (many rows per expert)
        for (int t = 0; t < n_tokens; ++t)
            for (int e = c.experts_used; e < s.n_experts; ++e) logits[size_t(t) * s.n_experts + e] -= 100.0f;
        d_logits.upload(logits);
    }
    auto d_out = device_uniform<float>(size_t(n_tokens) * s.d_model, stream_seed(r.seed, 3), -1.f, 1.f);
    const std::vector<bf16> x = d_x.download(size_t(n_tokens) * s.d_model);
    const std::vector<float> residual = d_out.download(size_t(n_tokens) * s.d_model);
    auto d_ids = poisoned<int32_t>(n_rows);
    auto d_w = poisoned<float>(n_rows);
    auto d_offsets = poisoned<int32_t>(s.n_experts + 1);
    auto d_sorted = poisoned<int32_t>(n_rows);
    cuda::DeviceBuffer<int32_t> d_scratch(
        std::max<size_t>(1, cuda::moe_group_scratch_elems(n_tokens, kTopK, s.n_experts)));
    auto d_u = poisoned<bf16>(size_t(n_rows) * s.d_ff);
    auto d_y = poisoned<float>(size_t(n_rows) * s.d_model);

    cuda::moe_route_topk({.expert_ids = d_ids.get(), .expert_weights = d_w.get(), .logits = d_logits.get(),
                          .n_tokens = n_tokens, .n_experts = s.n_experts, .top_k = kTopK},
                         nullptr);
    cuda::moe_group_by_expert({.expert_offsets = d_offsets.get(), .sorted_rows = d_sorted.get(),
                               .scratch = d_scratch.get(), .expert_ids = d_ids.get(), .n_tokens = n_tokens,
                               .n_experts = s.n_experts, .top_k = kTopK},
                              nullptr);
    cuda::moe_mlp1({.u = d_u.get(), .x = d_x.get(), .w = ex.mlp1.view(), .expert_offsets = d_offsets.get(),
                    .sorted_rows = d_sorted.get(), .n_tokens = n_tokens, .n_experts = s.n_experts, .top_k = kTopK,
                    .d_model = s.d_model, .d_ff = s.d_ff, .kernel = c.kernel,
                    .wgmma_variant = c.wgmma_variant},
                   nullptr);
    cuda::moe_mlp2({.y = d_y.get(), .u = d_u.get(), .w = ex.mlp2.view(), .expert_offsets = d_offsets.get(),
                    .sorted_rows = d_sorted.get(), .n_tokens = n_tokens, .n_experts = s.n_experts, .top_k = kTopK,
                    .d_model = s.d_model, .d_ff = s.d_ff, .kernel = c.kernel,
                    .wgmma_variant = c.wgmma_variant},
                   nullptr);
    cuda::moe_combine({.out = d_out.get(), .y = d_y.get(), .expert_weights = d_w.get(), .n_tokens = n_tokens,
                       .d_model = s.d_model, .top_k = kTopK},
                      nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());

    const std::vector<int32_t> ids = d_ids.download(n_rows);
    const std::vector<float> w = d_w.download(n_rows);
    const std::vector<int32_t> offsets = d_offsets.download(s.n_experts + 1), sorted = d_sorted.download(n_rows);
    const std::vector<bf16> u = d_u.download(size_t(n_rows) * s.d_ff);
    const std::vector<float> y = d_y.download(size_t(n_rows) * s.d_model);
    const std::vector<float> out = d_out.download(size_t(n_tokens) * s.d_model);

    // Routing and grouping: exact.
    std::vector<int32_t> want_ids(n_rows);
    std::vector<float> want_w(n_rows);
    cpu::route_topk_softmax(want_ids, want_w, logits, n_tokens, s.n_experts, kTopK);
    if (!expect_equal(r, ids, want_ids, "expert ids")) return r;
    std::vector<int32_t> position(n_rows, -1);  // sorted position of each routed row
    for (int e = 0; e < s.n_experts; ++e)
        for (int p = offsets[e]; p < offsets[e + 1]; ++p) {
            if (p < 0 || p >= n_rows || sorted[p] < 0 || sorted[p] >= n_rows || ids[sorted[p]] != e) {
                r.fail("grouping: position ", p, " of expert ", e, " holds row ",
                       p >= 0 && p < n_rows ? sorted[p] : -1);
                return r;
            }
            position[sorted[p]] = p;
        }
    if (offsets[s.n_experts] != n_rows) {
        r.fail("grouping: ", offsets[s.n_experts], " rows grouped, expected ", n_rows);
        return r;
    }

    // Every output row written and finite.
    for (size_t i = 0; i < y.size(); ++i)
        if (!std::isfinite(y[i])) {
            r.fail("y[", i, "] = ", y[i]);
            return r;
        }
    for (size_t i = 0; i < out.size(); ++i)
        if (!std::isfinite(out[i])) {
            r.fail("out[", i, "] = ", out[i]);
            return r;
        }

    // CPU reference on up to 48 tokens (all of a small batch; first, last and random ones otherwise).
    std::set<int> tokens;
    if (n_tokens <= 48) {
        for (int t = 0; t < n_tokens; ++t) tokens.insert(t);
    } else {
        tokens = {0, n_tokens - 1};
        while (int(tokens.size()) < 48) tokens.insert(int(rng() % n_tokens));
    }
    std::map<int, std::vector<int>> rows_of;  // expert -> sampled routed rows
    for (int t : tokens)
        for (int k = 0; k < kTopK; ++k) rows_of[ids[t * kTopK + k]].push_back(t * kTopK + k);

    std::vector<float> got_u, want_u, got_y, want_y;
    std::map<int, std::vector<float>> y_chain;  // routed row -> reference y from the reference u
    for (const auto& [e, rows] : rows_of) {
        const int n = int(rows.size());
        std::vector<float> xe(size_t(n) * s.d_model), a, ue(size_t(n) * s.d_ff), ug(size_t(n) * s.d_ff), ye, yc;
        for (int i = 0; i < n; ++i)
            for (int col = 0; col < s.d_model; ++col)
                xe[size_t(i) * s.d_model + col] = bf16_to_float(x[size_t(rows[i] / kTopK) * s.d_model + col]);
        ex.mlp1.ref(e, xe, n, a);
        cpu::swiglu_clamped(ue, a, n, s.d_ff, 1.702f, 7.0f);
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < s.d_ff; ++j)
                ug[size_t(i) * s.d_ff + j] =
                    bf16_to_float(u[size_t(position[rows[i]]) * s.d_ff + cuda::moe_u_column(j)]);
        got_u.insert(got_u.end(), ug.begin(), ug.end());
        want_u.insert(want_u.end(), ue.begin(), ue.end());
        ex.mlp2.ref(e, ug, n, ye);  // mlp2 fed the GPU's own u: isolates mlp2's error
        ex.mlp2.ref(e, ue, n, yc);  // and the all-reference chain, for the end-to-end bound
        for (int i = 0; i < n; ++i) {
            got_y.insert(got_y.end(), y.begin() + size_t(rows[i]) * s.d_model,
                         y.begin() + size_t(rows[i] + 1) * s.d_model);
            want_y.insert(want_y.end(), ye.begin() + size_t(i) * s.d_model, ye.begin() + size_t(i + 1) * s.d_model);
            y_chain[rows[i]].assign(yc.begin() + size_t(i) * s.d_model, yc.begin() + size_t(i + 1) * s.d_model);
        }
    }
    // u: FP32 accumulation of exact products (tiny error) then one BF16 rounding (2^-9 relative):
    // 2^-8 relative plus 1e-3 of the largest |u| for accumulation-order differences near zero.
    expect_near_all(r, got_u, want_u, 1e-3, 1.0 / 256, "mlp1 u");
    // y from identical bf16 inputs: only FP32 accumulation order differs (K = d_ff).
    expect_near_all(r, got_y, want_y, 1e-4, 1e-4, "mlp2 y");

    std::vector<float> got_out, want_out, want_out_chain;
    for (int t : tokens)
        for (int col = 0; col < s.d_model; ++col) {
            double sum = 0.0, sum_chain = 0.0;
            for (int k = 0; k < kTopK; ++k) {
                sum += double(w[t * kTopK + k]) * y[size_t(t * kTopK + k) * s.d_model + col];
                sum_chain += double(want_w[t * kTopK + k]) * y_chain[t * kTopK + k][col];
            }
            got_out.push_back(out[size_t(t) * s.d_model + col] - residual[size_t(t) * s.d_model + col]);
            want_out.push_back(float(sum));
            want_out_chain.push_back(float(sum_chain));
        }
    // The combine itself: 4 FP32 products in slot order (the residual is subtracted back exactly enough).
    expect_near_all(r, got_out, want_out, 1e-5, 1e-5, "combine");
    // End to end against the all-FP32 reference: u's BF16 rounding propagates through mlp2
    // (BF16 activations: 1e-2 of the largest output).
    expect_near_all(r, got_out, want_out_chain, 1e-2, 0.0, "moe output vs reference chain");
    return r;
}

inline Result perf(const Case& c, Result r) {
    constexpr int kLayers = 2;  // weight sets alternated between runs
    constexpr int kInputs = 4;  // input sets (tokens, routing) rotated between runs
    const Shape& s = c.shape;
    const int n_tokens = c.n_tokens, n_rows = n_tokens * kTopK, d_model = s.d_model, d_ff = s.d_ff;
    std::vector<Experts*> layers;
    for (int l = 0; l < kLayers; ++l) layers.push_back(&experts_for(s, l, 1000 + 17 * l));
    struct Inputs {  // one batch, routed and grouped
        cuda::DeviceBuffer<bf16> x, u;
        cuda::DeviceBuffer<float> logits, w, out, y;
        cuda::DeviceBuffer<int32_t> ids, offsets, sorted, scratch;
    };
    std::vector<Inputs> in(kInputs);
    double n_active = 0;  // experts with at least one row, averaged over the input sets
    for (int i = 0; i < kInputs; ++i) {
        Inputs& b = in[i];
        b.x = device_uniform<bf16>(size_t(n_tokens) * d_model, stream_seed(r.seed, 10 * i + 1), -2.f, 2.f);
        b.logits = device_uniform<float>(size_t(n_tokens) * s.n_experts, stream_seed(r.seed, 10 * i + 2), -4.f, 4.f);
        b.out = device_uniform<float>(size_t(n_tokens) * d_model, stream_seed(r.seed, 10 * i + 3), -1.f, 1.f);
        b.w.resize(n_rows), b.ids.resize(n_rows), b.offsets.resize(s.n_experts + 1), b.sorted.resize(n_rows);
        b.scratch.resize(std::max<size_t>(1, cuda::moe_group_scratch_elems(n_tokens, kTopK, s.n_experts)));
        b.u.resize(size_t(n_rows) * d_ff), b.y.resize(size_t(n_rows) * d_model);
        cuda::moe_route_topk({.expert_ids = b.ids.get(), .expert_weights = b.w.get(), .logits = b.logits.get(),
                              .n_tokens = n_tokens, .n_experts = s.n_experts, .top_k = kTopK},
                             nullptr);
        cuda::moe_group_by_expert({.expert_offsets = b.offsets.get(), .sorted_rows = b.sorted.get(),
                                   .scratch = b.scratch.get(), .expert_ids = b.ids.get(), .n_tokens = n_tokens,
                                   .n_experts = s.n_experts, .top_k = kTopK},
                                  nullptr);
        const std::vector<int32_t> off = b.offsets.download();
        for (int e = 0; e < s.n_experts; ++e) n_active += (off[e + 1] > off[e]) / double(kInputs);
    }
    auto mlp1 = [&](int i, MoeKernel k) {
        Inputs& b = in[i % kInputs];
        cuda::moe_mlp1({.u = b.u.get(), .x = b.x.get(), .w = layers[i % kLayers]->mlp1.view(),
                        .expert_offsets = b.offsets.get(), .sorted_rows = b.sorted.get(), .n_tokens = n_tokens,
                        .n_experts = s.n_experts, .top_k = kTopK, .d_model = d_model, .d_ff = d_ff, .kernel = k,
                        .wgmma_variant = c.wgmma_variant},
                       nullptr);
    };
    auto mlp2 = [&](int i, MoeKernel k) {
        Inputs& b = in[i % kInputs];
        cuda::moe_mlp2({.y = b.y.get(), .u = b.u.get(), .w = layers[i % kLayers]->mlp2.view(),
                        .expert_offsets = b.offsets.get(), .sorted_rows = b.sorted.get(), .n_tokens = n_tokens,
                        .n_experts = s.n_experts, .top_k = kTopK, .d_model = d_model, .d_ff = d_ff, .kernel = k,
                        .wgmma_variant = c.wgmma_variant},
                       nullptr);
    };
    auto route = [&](int i) {
        Inputs& b = in[i % kInputs];
        cuda::moe_route_topk({.expert_ids = b.ids.get(), .expert_weights = b.w.get(), .logits = b.logits.get(),
                              .n_tokens = n_tokens, .n_experts = s.n_experts, .top_k = kTopK},
                             nullptr);
    };
    auto group = [&](int i) {
        Inputs& b = in[i % kInputs];
        cuda::moe_group_by_expert({.expert_offsets = b.offsets.get(), .sorted_rows = b.sorted.get(),
                                   .scratch = b.scratch.get(), .expert_ids = b.ids.get(), .n_tokens = n_tokens,
                                   .n_experts = s.n_experts, .top_k = kTopK},
                                  nullptr);
    };
    auto combine = [&](int i) {
        Inputs& b = in[i % kInputs];
        cuda::moe_combine({.out = b.out.get(), .y = b.y.get(), .expert_weights = b.w.get(), .n_tokens = n_tokens,
                           .d_model = d_model, .top_k = kTopK},
                          nullptr);
    };
    const int iters = iters_or(n_tokens >= 1024 ? 10 : 50);
    const double w1_bytes = 2.0 * d_ff * (d_model / 32) * 17 + 2.0 * 2 * d_ff;  // one expert: blocks+scales+bias
    const double w2_bytes = double(d_model) * (d_ff / 32) * 17 + 2.0 * d_model;
    const double act1 = 2.0 * n_tokens * d_model + 2.0 * n_rows * d_ff;  // x read, u written
    const double act2 = 2.0 * n_rows * d_ff + 4.0 * n_rows * d_model;     // u read, y written
    const double fl1 = 2.0 * n_rows * 2 * d_ff * d_model, fl2 = 2.0 * n_rows * d_model * d_ff;
    r.note("\n== gpt-oss-", s.name, " experts: ", s.n_experts, " experts, d_model ", d_model, ", d_ff ", d_ff, ", top-",
           kTopK, " ==");
    char line[160];
    std::snprintf(line, sizeof line,
                  "-- %d tokens (%d routed rows, %.1f active experts on average, automatic choice: %s)", n_tokens,
                  n_rows, n_active, cuda::moe_kernel_name(cuda::moe_choose_kernel(n_tokens, kTopK, s.n_experts)));
    r.note(line);
    auto label = [&](const char* what) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "%s %5d tok %s", s.name, n_tokens, what);
        return std::string(buf);
    };
    if (c.w4a8) {
        // The whole W4A8 pair (quantise x, mlp1, quantise u, mlp2) against the FP8 ceiling, and the two
        // quantisations alone (so that the GEMMs' share can be read off).
        cuda::DeviceBuffer<uint8_t> ws(cuda::moe_w4a8_workspace_bytes(n_tokens, kTopK, d_model, d_ff));
        auto pair = [&](int i) {
            Inputs& b = in[i % kInputs];
            const Experts& L = *layers[i % kLayers];
            cuda::moe_w4a8({.y = b.y.get(), .u = b.u.get(), .x = b.x.get(), .mlp1 = L.mlp1.view(), .mlp2 = L.mlp2.view(),
                            .expert_offsets = b.offsets.get(), .sorted_rows = b.sorted.get(), .workspace = ws.get(),
                            .n_tokens = n_tokens, .n_experts = s.n_experts, .top_k = kTopK, .d_model = d_model,
                            .d_ff = d_ff, .variant = c.wgmma_variant},
                           nullptr);
        };
        auto quant = [&](int i) {
            Inputs& b = in[i % kInputs];
            uint8_t* q = ws.get();  // the layout of moe_w4a8's workspace does not matter here
            float* sc = reinterpret_cast<float*>(ws.get() + size_t(n_rows) * d_ff);
            cuda::moe_w4a8_quantize(q, sc, b.x.get(), n_tokens, d_model, nullptr);
            cuda::moe_w4a8_quantize(q, sc, b.u.get(), n_rows, d_ff, nullptr);
        };
        const std::string v = c.wgmma_variant > 0 ? str(" v", c.wgmma_variant) : "";
        Timing t{label(("mlp1+mlp2 w4a8" + v).c_str()), time_us(pair, iters),
                 n_active * (w1_bytes + w2_bytes) + act1 + act2, fl1 + fl2};
        t.math = Math::fp8;
        r.timings.push_back(t);
        r.timings.push_back({label(("w4a8 quantise x+u" + v).c_str()), time_us(quant, iters),
                             3.0 * n_tokens * d_model + 3.0 * n_rows * d_ff, 0.0});
        return r;
    }
    if (c.kernel != MoeKernel::automatic) {
        const std::string kn = str(cuda::moe_kernel_name(c.kernel),
                                   c.kernel == MoeKernel::wgmma && c.wgmma_variant > 0 ? str(" v", c.wgmma_variant) : "");
        r.timings.push_back({label(("mlp1 " + kn).c_str()), time_us([&](int i) { mlp1(i, c.kernel); }, iters),
                             n_active * w1_bytes + act1, fl1});
        r.timings.push_back({label(("mlp2 " + kn).c_str()), time_us([&](int i) { mlp2(i, c.kernel); }, iters),
                             n_active * w2_bytes + act2, fl2});
        return r;
    }
    r.timings.push_back({label("route"), time_us(route, iters), 4.0 * n_tokens * s.n_experts + 8.0 * n_rows, 0.0});
    r.timings.push_back({label("group"), time_us(group, iters), 8.0 * n_rows, 0.0});
    r.timings.push_back(
        {label("combine"), time_us(combine, iters), 4.0 * n_rows * d_model + 8.0 * n_tokens * d_model, 0.0});
    const double whole = time_us(
        [&](int i) {
            route(i), group(i), mlp1(i, MoeKernel::automatic), mlp2(i, MoeKernel::automatic), combine(i);
        },
        iters);
    r.timings.push_back({label("whole step (auto)"), whole, n_active * (w1_bytes + w2_bytes) + act1 + act2, fl1 + fl2});
    return r;
}

inline Result run(const Case& c, Mode mode) {
    Result r;
    r.seed = case_seed(mode);
    return mode == Mode::check ? check(c, std::move(r)) : perf(c, std::move(r));
}

inline std::vector<Case> cases() {
    std::vector<Case> t;
    // A wgmma case runs once per kernel variant (named _v1, _v2, ... after the first); bench_moe times the
    // variants other than 0 from 1024 tokens only (where they are meant to differ).
    auto add = [&](const Shape& s, int n, MoeKernel k, Use use, int experts_used = 0, const char* prefix = "") {
        Case c{.use = use, .shape = s, .n_tokens = n, .kernel = k, .experts_used = experts_used,
               .wgmma_variant = k == MoeKernel::wgmma ? 0 : -1};
        c.name = str(prefix, s.name, "_", n, "_", cuda::moe_kernel_name(k));
        t.push_back(c);
        if (k != MoeKernel::wgmma) return;
        for (int v = 1; v < cuda::moe_wgmma_variants(); ++v) {
            Case cv = c;
            cv.wgmma_variant = v;
            cv.name = str(c.name, "_v", v);
            if (cv.use == Use::both && n < 1024) cv.use = Use::check_only;
            t.push_back(cv);
        }
    };
    // W4A8 (moe_w4a8): one case per variant (the first unsuffixed), like wgmma's.
    auto add_w4a8 = [&](const Shape& s, int n, Use use, int experts_used = 0, const char* prefix = "") {
        for (int v = 0; v < cuda::moe_w4a8_variants(); ++v) {
            Case cv{.use = use, .shape = s, .n_tokens = n, .kernel = MoeKernel::wgmma, .experts_used = experts_used,
                    .wgmma_variant = v, .w4a8 = true};
            cv.name = str(prefix, s.name, "_", n, "_w4a8", v > 0 ? str("_v", v) : std::string());
            if (v > 0 && cv.use == Use::both && n < 1024) cv.use = Use::check_only;
            t.push_back(cv);
        }
    };
    const MoeKernel forced[] = {MoeKernel::gemv, MoeKernel::narrow, MoeKernel::gemm, MoeKernel::wgmma};
    auto in = [](int n, std::initializer_list<int> l) { return std::find(l.begin(), l.end(), n) != l.end(); };

    for (int n : {1, 3, 8, 64, 333, 2048})
        for (MoeKernel k : forced) add(kTiny, n, k, Use::check_only);
    // 20b and 120b: bench_moe's token counts (every tiling, gemv only up to 1024, then the automatic
    // choice with the other stages), interleaved with the tests' odd ones, in increasing order.
    for (const Shape& s : {k20b, k120b})
        for (int n : {1, 3, 8, 64, 128, 256, 300, 333, 1024, 1500, 2048, 8192}) {
            const bool bench = in(n, {1, 8, 64, 128, 256, 1024, 8192});
            for (MoeKernel k : forced) {
                const bool b = bench && !(k == MoeKernel::gemv && n > 1024);
                const bool test = in(n, {1, 3, 8, 64, 333, 2048});
                if (b || test) add(s, n, k, b ? Use::both : Use::check_only);
            }
            if (bench) {
                add(s, n, MoeKernel::automatic, Use::both);
            } else if (s.n_experts == k20b.n_experts && in(n, {300, 1500})) {
                add(s, n, MoeKernel::automatic, Use::check_only);
            }
        }
    // Rows per expert around the token-tile sizes (less than one, one, one plus a remainder, several),
    // with the whole batch on 4 experts so that each gets n_tokens rows.
    for (int n : {kGemvRows - 1, kGemvRows, kGemvRows + 1, 3 * kGemvRows + 5})
        add(k20b, n, MoeKernel::gemv, Use::check_only, 4, "tiles_");
    for (int n : {kNarrowRows - 1, kNarrowRows, kNarrowRows + 1, 2 * kNarrowRows + 7})
        add(k20b, n, MoeKernel::narrow, Use::check_only, 4, "tiles_");
    for (int n : {kGemmRows - 1, kGemmRows, kGemmRows + 1, 2 * kGemmRows + 7})
        add(k20b, n, MoeKernel::gemm, Use::check_only, 4, "tiles_");
    for (int n : {kWgmmaRows - 1, kWgmmaRows, kWgmmaRows + 1, 2 * kWgmmaRows + 7})
        add(k20b, n, MoeKernel::wgmma, Use::check_only, 4, "tiles_");
    // One row past the 160- and 256-row tiles of the SS variants (a second tile of one row).
    for (int n : {kWgmmaSsRows160 + 1, 2 * kWgmmaRows + 1})
        add(k20b, n, MoeKernel::wgmma, Use::check_only, 4, "tiles_");
    // wgmma's m-tile and ring edges, ragged experts (1..~200 rows, some with none), one to many tiles.
    for (int n : {1, 40, 300}) add(kWgmmaEdges, n, MoeKernel::wgmma, Use::check_only);
    // Partial weight blocks and a K shorter than the pipeline.
    for (MoeKernel k : forced)
        for (int n : {1, 5, 300}) add(kEdges, n, k, Use::check_only);
    // W4A8: the tiny model; 20b and 120b at bench_moe's prefill sizes (timed at 1024 and 8192 next to
    // wgmma) and odd ones; 128-row token tiles with one row less, exactly, one more, two plus a rest (the
    // batch on 4 experts); wgmma_edges (mlp1 448 inputs = 3.5 k-blocks, 640 rows = 5 m-tiles of 128;
    // mlp2 320 = 2.5 k-blocks, 448 rows: a warpgroup idle); edges (mlp2 K = 64: half a k-block).
    for (int n : {1, 3, 64, 333, 2048}) add_w4a8(kTiny, n, Use::check_only);
    for (const Shape& s : {k20b, k120b})
        for (int n : {64, 333, 1024, 2048, 8192}) add_w4a8(s, n, in(n, {1024, 8192}) ? Use::both : Use::check_only);
    for (int n : {kWgmmaRows - 1, kWgmmaRows, kWgmmaRows + 1, 2 * kWgmmaRows + 7})
        add_w4a8(k20b, n, Use::check_only, 4, "tiles_");
    for (int n : {1, 40, 300}) add_w4a8(kWgmmaEdges, n, Use::check_only);
    for (int n : {1, 5, 300}) add_w4a8(kEdges, n, Use::check_only);
    return t;
}

}  // namespace osprey::cases::moe_mlp
