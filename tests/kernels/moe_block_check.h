// The MoE block's CPU reference with per-element error bounds, the expert weights and routing
// scenarios, a case's inputs, the grouped GEMM path the fused paths are compared with, and the
// CUDA-graph replay check, shared by the tests of the fused MoE paths (test_moe_decode.cu: 1-8
// tokens, test_moe_mid.cu: 9-128 tokens). Test-only (GoogleTest assertions).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cases/moe_mlp_cases.h"  // Mxfp4Projection: random MXFP4 experts and their CPU reference
#include "kernels/cpu/mxfp4_matmul.h"
#include "kernels/cpu/routing.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/moe_mlp_mxfp4.h"
#include "kernels/cuda_test_util.h"

namespace osprey::test::moe_block {

using cases::mix64;
using cases::moe_mlp::Mxfp4Projection;

inline constexpr int kTopK = 4;

struct Shape {
    const char* name;
    int n_experts, d_model, d_ff;
};
inline constexpr Shape kTiny{"tiny", 8, 128, 128};
inline constexpr Shape k20b{"20b", 32, 2880, 2880};
inline constexpr Shape k120b{"120b", 128, 2880, 2880};
// d_model = 96 (3 groups: one k-step, lanes c = 3 idle), d_ff = 160 (5 groups: a second k-step
// with one group); 6 experts; 20 / 6 m-tiles of 16 rows.
inline constexpr Shape kOdd{"odd", 6, 96, 160};

// Expert weights: scale bytes 116..122 (as test_moe_mlp: mlp1 outputs on both sides of the SwiGLU
// clamp), or the same plus one group in 61 with an extreme scale byte from the exact range 34..160
// (weights from 2^-94 to 6 * 2^33).
struct Experts {
    Mxfp4Projection mlp1, mlp2;
    Experts(const Shape& s, uint64_t seed, bool extreme)
        : mlp1(s.n_experts, 2 * s.d_ff, s.d_model, seed, 116), mlp2(s.n_experts, s.d_model, s.d_ff, seed + 1, 116) {
        mlp1.download_host();
        mlp2.download_host();
        if (!extreme) return;
        constexpr uint8_t kExtremes[] = {34, 35, 50, 90, 104, 130, 140, 150, 159, 160};
        for (Mxfp4Projection* p : {&mlp1, &mlp2}) {
            for (size_t i = 0; i < p->scales.size(); ++i) {
                const uint64_t h = mix64(seed ^ (i * 7 + 5));
                if (h % 61 == 0) p->scales[i] = kExtremes[(h >> 8) % std::size(kExtremes)];
            }
            p->d_scales.upload(p->scales);
        }
    }
};
// Never destroyed: device memory must not be freed after the CUDA runtime has shut down at exit.
inline Experts& experts_for(const Shape& s, bool extreme) {
    static auto* cache = new std::map<std::string, std::unique_ptr<Experts>>;
    auto& p = (*cache)[std::string(s.name) + (extreme ? "/extreme" : "")];
    if (!p) p = std::make_unique<Experts>(s, mix64(fresh_seed()), extreme);
    return *p;
}

// skewed: every token has expert n_experts / 2 among its four (that expert gets all tokens, the others
// share the remaining three slots at random).
enum class Routing { random, shared, disjoint, ties, skewed };
inline const char* routing_name(Routing r) {
    switch (r) {
        case Routing::random:
            return "random";
        case Routing::shared:
            return "shared";
        case Routing::disjoint:
            return "disjoint";
        case Routing::ties:
            return "ties";
        case Routing::skewed:
            return "skewed";
    }
    return "?";
}

// Router logits [T, E] (bias included) for a routing scenario.
inline std::vector<float> make_logits(const Shape& s, int n_tokens, Routing r, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-4.0f, 4.0f);
    const int E = s.n_experts;
    std::vector<float> l(size_t(n_tokens) * E);
    for (float& v : l) v = uni(rng);
    for (int t = 0; t < n_tokens; ++t) {
        float* row = l.data() + size_t(t) * E;
        switch (r) {
            case Routing::random:
                break;
            case Routing::shared:  // every token picks the same 4 experts, in its own order
                for (int k = 0; k < kTopK; ++k) row[(3 * k + 1) % E] += 20.0f;
                break;
            case Routing::disjoint:  // token t picks experts 4t..4t+3 (mod E: disjoint while 4T <= E)
                for (int k = 0; k < kTopK; ++k) row[(kTopK * t + k) % E] += 20.0f;
                break;
            case Routing::ties:  // integer logits: many ties, broken towards the lower id
                for (int e = 0; e < E; ++e) row[e] = std::round(row[e] / 2.0f);
                if (t == 0) std::fill(row, row + E, 0.0f);  // all tied: experts 0..3
                if (t == 1)                                 // a 5-way tie for the top: the 4 lowest win
                    for (int e : {E - 1, E - 2, E / 2, 3, 1}) row[e] = 7.0f;
                break;
            case Routing::skewed:
                row[E / 2] += 20.0f;
                break;
        }
    }
    return l;
}

// |W| of expert e as MXFP4 (sign bits cleared), for the error bounds.
inline std::vector<uint8_t> abs_blocks(const Mxfp4Projection& p, int e) {
    const size_t n = size_t(p.n_out) * (p.n_in / 2);
    std::vector<uint8_t> b(p.blocks.begin() + e * n, p.blocks.begin() + (e + 1) * n);
    for (uint8_t& v : b) v &= 0x77;
    return b;
}

// y[n, n_out] = x[n, n_in] · |W_e|ᵀ + |b_e|.
inline void abs_matmul(const Mxfp4Projection& p, int e, const std::vector<float>& x, int n, std::vector<float>& y) {
    const std::vector<uint8_t> b = abs_blocks(p, e);
    std::vector<float> bias(p.bias.begin() + size_t(e) * p.n_out, p.bias.begin() + size_t(e + 1) * p.n_out);
    for (float& v : bias) v = std::fabs(v);
    y.assign(size_t(n) * p.n_out, 0.0f);
    const size_t sc = size_t(p.n_out) * (p.n_in / 32);
    cpu::mxfp4_matmul(y, x, b, std::span(p.scales).subspan(size_t(e) * sc, sc), bias, n, p.n_in, p.n_out);
}

// The reference and, for every compared value, a bound on |GPU - reference|:
// - mlp1 pre-activations a: both sides sum K = d_model exact products in FP32 (in different
//   orders); the error is bounded by 2^-14 of Σ|w·x| (A1, from |W1|·|x|). Random-order rounding
//   gives ~√K · 2^-24 ≈ 2^-18; the GPU adds ~92 partial sums per accumulator (23 k-steps x 4 mma)
//   and a tensor core may truncate rather than round each: ≤ 92 · 2^-23 ≈ 2^-16.5; 2^-14 leaves
//   ~6x over that. (K · 2^-24 = 2^-12.5 would be the worst case of any order, never approached.)
// - u = SwiGLU(a), GPU rounded to BF16 (half an ulp: 2^-8 |u|) and computed with __expf (~2^-21):
//   tol_u = (2^-8 + 2^-20) |u| + 16 · 2^-14 · max(A1 gate, A1 up)  (16 bounds SwiGLU's slope in
//   gate and up together inside the clamp: ≤ 1.1 · 8 + 7).
// - y = u_bf16 · W2ᵀ + b2 with the reference u rounded to BF16 like the GPU's. The two u differ by
//   at most tol_u + 2^-8 |u| (a rounding flip is one ulp); W2 spreads that and adds its own FP32
//   error: tol_y = |W2| · (tol_u + (2^-8 + 2^-14) |u|) + 2^-14 |b2|.
// - out = Σ_slot w · y (the same FP32 weights on both sides): tol = Σ_slot w · tol_y + 2^-20 Σ w |y|.
struct Reference {
    std::vector<int32_t> ids;         // [T, 4]
    std::vector<float> w;             // [T, 4]
    std::vector<float> u, u_tol;      // [T * 4, d_ff] routed row t * 4 + slot, natural column order
    std::vector<float> y, y_tol;      // [T * 4, d_model] routed row t * 4 + slot: W2 · u + b2
    std::vector<float> out, out_tol;  // [T, d_model]
};

inline Reference reference(const Shape& s, const Experts& ex, const std::vector<bf16>& h,
                           const std::vector<float>& logits, int n_tokens) {
    Reference r;
    const int rows = n_tokens * kTopK;
    r.ids.resize(rows), r.w.resize(rows);
    cpu::route_topk_softmax(r.ids, r.w, logits, n_tokens, s.n_experts, kTopK);
    r.u.assign(size_t(rows) * s.d_ff, 0.0f), r.u_tol.assign(r.u.size(), 0.0f);
    std::vector<float>& y = r.y;
    std::vector<float>& y_tol = r.y_tol;
    y.assign(size_t(rows) * s.d_model, 0.0f), y_tol.assign(y.size(), 0.0f);
    std::map<int, std::vector<int>> rows_of;  // expert -> routed rows
    for (int i = 0; i < rows; ++i) rows_of[r.ids[i]].push_back(i);
    constexpr double kSum = 1.0 / 16384, kHalfUlp = 1.0 / 256, kExp = 1.0 / (1 << 20);
    for (const auto& [e, rr] : rows_of) {
        const int n = int(rr.size());
        std::vector<float> x(size_t(n) * s.d_model), xa(x.size()), a, a_abs, u(size_t(n) * s.d_ff);
        for (int i = 0; i < n; ++i)
            for (int c = 0; c < s.d_model; ++c) {
                x[size_t(i) * s.d_model + c] = bf16_to_float(h[size_t(rr[i] / kTopK) * s.d_model + c]);
                xa[size_t(i) * s.d_model + c] = std::fabs(x[size_t(i) * s.d_model + c]);
            }
        ex.mlp1.ref(e, x, n, a);
        abs_matmul(ex.mlp1, e, xa, n, a_abs);
        cpu::swiglu_clamped(u, a, n, s.d_ff, 1.702f, 7.0f);
        std::vector<float> ub(u.size()), v(u.size());  // u rounded to bf16; |W2| multiplier of the bound
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < s.d_ff; ++j) {
                const size_t k = size_t(i) * s.d_ff + j;
                const double a_bound =
                    std::max(a_abs[size_t(i) * 2 * s.d_ff + 2 * j], a_abs[size_t(i) * 2 * s.d_ff + 2 * j + 1]);
                const double tol = (kHalfUlp + kExp) * std::fabs(u[k]) + 16 * kSum * a_bound;
                r.u[size_t(rr[i]) * s.d_ff + j] = u[k];
                r.u_tol[size_t(rr[i]) * s.d_ff + j] = float(tol);
                ub[k] = round_to_bf16(u[k]);
                v[k] = float(tol + (kHalfUlp + kSum) * std::fabs(u[k]));
            }
        std::vector<float> ye, ye_tol;
        ex.mlp2.ref(e, ub, n, ye);
        abs_matmul(ex.mlp2, e, v, n, ye_tol);  // |W2| · v + |b2|: the |b2| term overcounts, harmless
        for (int i = 0; i < n; ++i)
            for (int c = 0; c < s.d_model; ++c) {
                y[size_t(rr[i]) * s.d_model + c] = ye[size_t(i) * s.d_model + c];
                y_tol[size_t(rr[i]) * s.d_model + c] = ye_tol[size_t(i) * s.d_model + c];
            }
    }
    r.out.assign(size_t(n_tokens) * s.d_model, 0.0f), r.out_tol.assign(r.out.size(), 0.0f);
    for (int t = 0; t < n_tokens; ++t)
        for (int c = 0; c < s.d_model; ++c) {
            double sum = 0, tol = 0, mag = 0;
            for (int k = 0; k < kTopK; ++k) {
                const size_t i = size_t(t * kTopK + k) * s.d_model + c;
                sum += double(r.w[t * kTopK + k]) * y[i];
                tol += double(r.w[t * kTopK + k]) * y_tol[i];
                mag += double(r.w[t * kTopK + k]) * std::fabs(y[i]);
            }
            r.out[size_t(t) * s.d_model + c] = float(sum);
            r.out_tol[size_t(t) * s.d_model + c] = float(tol + kExp * mag);
        }
    return r;
}

// Checks |got - want| <= tol element-wise over [rows, cols]; reports the worst element relative to
// its bound (and any NaN) with its (row, column).
inline void expect_within(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& tol,
                          int cols, const char* row_name, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    size_t bad = 0, worst_i = 0;
    double worst = -1.0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::fabs(double(got[i]) - want[i]);
        const double ratio = std::isfinite(got[i]) ? err / std::max(double(tol[i]), 1e-30) : INFINITY;
        if (!(ratio <= 1.0)) ++bad;
        if (!(ratio <= worst)) worst = ratio, worst_i = i;
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements outside their bound; worst at "
                       << row_name << " " << worst_i / cols << ", column " << worst_i % cols << ": got " << got[worst_i]
                       << ", want " << want[worst_i]
                       << ", |error| = " << std::fabs(double(got[worst_i]) - want[worst_i]) << " = " << worst
                       << " x the bound " << tol[worst_i];
}

// A case's name for SCOPED_TRACE: shape (and extreme scales), tokens, routing.
inline std::string case_name(const Shape& s, int n_tokens, Routing routing, bool extreme) {
    std::ostringstream name;
    name << s.name << (extreme ? " (extreme scales)" : "") << ", " << n_tokens << " tokens, " << routing_name(routing)
         << " routing";
    return name.str();
}

// A case's inputs from a fresh seed: h [T, d_model] BF16 in [-2, 2), the routing's logits, and the
// CPU reference with its bounds.
struct Case {
    const Experts& ex;
    std::vector<bf16> h;
    std::vector<float> logits;
    Reference ref;
};
inline Case make_case(const Shape& s, int n_tokens, Routing routing, bool extreme) {
    const Experts& ex = experts_for(s, extreme);
    const uint32_t seed = fresh_seed();
    std::vector<bf16> h = random_bf16(size_t(n_tokens) * s.d_model, seed + 1, -2.0f, 2.0f);
    std::vector<float> logits = make_logits(s, n_tokens, routing, seed + 2);
    Reference ref = reference(s, ex, h, logits, n_tokens);
    return {ex, std::move(h), std::move(logits), std::move(ref)};
}

// The grouped GEMM kernels (moe_mlp1 / moe_mlp2, automatic tiling) need d_model and d_ff in multiples
// of 64 (moe_mlp_mxfp4.h): the odd shape has none.
inline bool grouped_gemm_fits(const Shape& s) { return s.d_model % 64 == 0 && s.d_ff % 64 == 0; }

// The grouped GEMM path on a grouping already made (route and group: expert_offsets, sorted_rows, the
// routing weights w): moe_mlp1, moe_mlp2, moe_combine (overwrite): out = Σ w · y, [T, d_model].
inline std::vector<float> grouped_gemm_out(const Shape& s, const Experts& ex, const bf16* h,
                                           const int32_t* expert_offsets, const int32_t* sorted_rows, const float* w,
                                           int n_tokens) {
    const int rows = n_tokens * kTopK;
    cuda::DeviceBuffer<float> y(size_t(rows) * s.d_model);
    cuda::DeviceBuffer<bf16> u(size_t(rows) * s.d_ff);
    auto out = poisoned<float>(size_t(n_tokens) * s.d_model);
    cuda::moe_mlp1({.u = u.get(),
                    .x = h,
                    .w = ex.mlp1.view(),
                    .expert_offsets = expert_offsets,
                    .sorted_rows = sorted_rows,
                    .n_tokens = n_tokens,
                    .n_experts = s.n_experts,
                    .top_k = kTopK,
                    .d_model = s.d_model,
                    .d_ff = s.d_ff},
                   nullptr);
    cuda::moe_mlp2({.y = y.get(),
                    .u = u.get(),
                    .w = ex.mlp2.view(),
                    .expert_offsets = expert_offsets,
                    .sorted_rows = sorted_rows,
                    .n_tokens = n_tokens,
                    .n_experts = s.n_experts,
                    .top_k = kTopK,
                    .d_model = s.d_model,
                    .d_ff = s.d_ff},
                   nullptr);
    cuda::moe_combine({.out = out.get(),
                       .y = y.get(),
                       .expert_weights = w,
                       .n_tokens = n_tokens,
                       .d_model = s.d_model,
                       .top_k = kTopK,
                       .mode = cuda::MoeCombineMode::overwrite},
                      nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    return out.download();
}

// Two paths each within out_tol of the reference are within twice that of each other.
inline void expect_paths_agree(const std::vector<float>& got, const std::vector<float>& other,
                               const std::vector<float>& out_tol, int d_model, const std::string& what) {
    std::vector<float> tol2(out_tol);
    for (float& v : tol2) v *= 2.0f;
    expect_within(got, other, tol2, d_model, "token", what);
}

// launch captured once into a CUDA graph (as the forward does) and replayed 3 times over a poisoned
// out: every replay gives the eager run's bits (eager.size() elements of out).
inline void expect_graph_replays_match(const std::function<void(cudaStream_t)>& launch,
                                       cuda::DeviceBuffer<float>& out, const std::vector<float>& eager) {
    cuda::Stream stream;
    cuda::Graph graph;
    graph.capture(stream, [&] { launch(stream); });
    for (int rep = 0; rep < 3; ++rep) {
        out.fill_bytes(0xFF, stream);
        graph.replay(stream);
        stream.sync();
        const std::vector<float> got = out.download(eager.size());
        EXPECT_EQ(0, std::memcmp(got.data(), eager.data(), got.size() * sizeof(float))) << "replay " << rep;
    }
}

}  // namespace osprey::test::moe_block
