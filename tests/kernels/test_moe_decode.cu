// The decode MoE block (kernels/cuda/moe_decode.h) against the CPU reference (routing.h,
// mxfp4_matmul.h, swiglu.h) and against the existing MoE step (route -> group -> mlp1 -> mlp2 ->
// combine), for every batch size up to kMoeDecodeMaxTokens, the tiny / 20b / 120b expert shapes
// and an odd one (rows of 3 and 5 MXFP4 groups: partial k-steps), realistic and extreme scale
// bytes, routings with ties, shared experts and disjoint experts. Also: bit-identical results
// across runs, with and without programmatic dependent launch, and when replayed from a CUDA graph.
//
// Tolerances are error bounds computed per element, not global fudge factors (see Reference).
// A failure prints the worst element relative to its bound: which token, which channel, got,
// want, bound, and how many elements failed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>

#include "kernels/cpu/mxfp4_matmul.h"
#include "kernels/cpu/routing.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/moe_decode.h"
#include "kernels/cuda/moe_group.h"
#include "kernels/cuda/moe_mlp_mxfp4.h"
#include "kernels/cuda/moe_route.h"
#include "kernels/cuda_test_util.h"
#include "kernels/cases/moe_mlp_cases.h"  // Mxfp4Projection: random MXFP4 experts and their CPU reference

namespace osprey::test {
namespace {

using cases::mix64;
using cases::moe_mlp::Mxfp4Projection;

constexpr int kTopK = 4;
constexpr int kMaxT = cuda::kMoeDecodeMaxTokens;

struct Shape {
    const char* name;
    int n_experts, d_model, d_ff;
};
constexpr Shape kTiny{"tiny", 8, 128, 128};
constexpr Shape k20b{"20b", 32, 2880, 2880};
constexpr Shape k120b{"120b", 128, 2880, 2880};
// d_model = 96 (3 groups: one k-step, lanes c = 3 idle), d_ff = 160 (5 groups: a second k-step
// with one group); 6 experts; 20 / 6 m-tiles of 16 rows.
constexpr Shape kOdd{"odd", 6, 96, 160};

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
Experts& experts_for(const Shape& s, bool extreme) {
    static auto* cache = new std::map<std::string, std::unique_ptr<Experts>>;
    auto& p = (*cache)[std::string(s.name) + (extreme ? "/extreme" : "")];
    if (!p) p = std::make_unique<Experts>(s, mix64(fresh_seed()), extreme);
    return *p;
}

enum class Routing { random, shared, disjoint, ties };
const char* routing_name(Routing r) {
    switch (r) {
        case Routing::random:
            return "random";
        case Routing::shared:
            return "shared";
        case Routing::disjoint:
            return "disjoint";
        case Routing::ties:
            return "ties";
    }
    return "?";
}

// Router logits [T, E] (bias included) for a routing scenario.
std::vector<float> make_logits(const Shape& s, int n_tokens, Routing r, uint32_t seed) {
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
        }
    }
    return l;
}

// |W| of expert e as MXFP4 (sign bits cleared), for the error bounds.
std::vector<uint8_t> abs_blocks(const Mxfp4Projection& p, int e) {
    const size_t n = size_t(p.n_out) * (p.n_in / 2);
    std::vector<uint8_t> b(p.blocks.begin() + e * n, p.blocks.begin() + (e + 1) * n);
    for (uint8_t& v : b) v &= 0x77;
    return b;
}

// y[n, n_out] = x[n, n_in] · |W_e|ᵀ + |b_e|.
void abs_matmul(const Mxfp4Projection& p, int e, const std::vector<float>& x, int n, std::vector<float>& y) {
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
    std::vector<float> out, out_tol;  // [T, d_model]
};

Reference reference(const Shape& s, const Experts& ex, const std::vector<bf16>& h, const std::vector<float>& logits,
                    int n_tokens) {
    Reference r;
    const int rows = n_tokens * kTopK;
    r.ids.resize(rows), r.w.resize(rows);
    cpu::route_topk_softmax(r.ids, r.w, logits, n_tokens, s.n_experts, kTopK);
    r.u.assign(size_t(rows) * s.d_ff, 0.0f), r.u_tol.assign(r.u.size(), 0.0f);
    std::vector<float> y(size_t(rows) * s.d_model), y_tol(y.size());
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
void expect_within(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& tol,
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

struct DecodeRun {
    const Shape& s;
    const Experts& ex;
    int n_tokens;
    cuda::DeviceBuffer<bf16> h;
    cuda::DeviceBuffer<float> logits, out;
    cuda::DeviceBuffer<uint8_t> ws;

    DecodeRun(const Shape& s_, const Experts& ex_, const std::vector<bf16>& h_, const std::vector<float>& logits_,
              int t)
        : s(s_),
          ex(ex_),
          n_tokens(t),
          h(to_device(h_)),
          logits(to_device(logits_)),
          out(size_t(std::max(t, 1)) * s_.d_model),
          ws(cuda::moe_decode_workspace_bytes(s_.n_experts, s_.d_model, s_.d_ff)) {
        ws.fill_bytes(0);  // the arrival counters start at zero (once)
    }
    cuda::MoeDecodeArgs args(bool pdl = true) {
        return {.out = out.get(),
                .router = logits.get(),
                .h = h.get(),
                .mlp1 = ex.mlp1.view(),
                .mlp2 = ex.mlp2.view(),
                .workspace = ws.get(),
                .n_tokens = n_tokens,
                .n_experts = s.n_experts,
                .top_k = kTopK,
                .d_model = s.d_model,
                .d_ff = s.d_ff,
                .pdl = pdl};
    }
    // Poisons out and u with NaN, runs, returns out (and u through *u).
    std::vector<float> run(bool pdl = true, std::vector<bf16>* u = nullptr, cudaStream_t stream = nullptr) {
        out.fill_bytes(0xFF, stream);
        CUDA_CHECK(cudaMemsetAsync(ws.get(), 0xFF, sizeof(bf16) * kMaxT * kTopK * s.d_ff, stream));
        cuda::moe_decode(args(pdl), stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        if (u) {
            u->resize(size_t(kMaxT) * kTopK * s.d_ff);
            CUDA_CHECK(cudaMemcpy(u->data(), ws.get(), u->size() * sizeof(bf16), cudaMemcpyDeviceToHost));
        }
        return out.download(size_t(n_tokens) * s.d_model);
    }
};

// The existing path (MoeStep's launches) on the same inputs: out = Σ w · y (overwrite).
std::vector<float> moe_step_path(const Shape& s, const Experts& ex, DecodeRun& r) {
    const int rows = r.n_tokens * kTopK;
    cuda::DeviceBuffer<int32_t> ids(rows), offsets(s.n_experts + 1), sorted(rows),
        scratch(std::max<size_t>(1, cuda::moe_group_scratch_elems(r.n_tokens, kTopK, s.n_experts)));
    cuda::DeviceBuffer<float> w(rows), y(size_t(rows) * s.d_model);
    cuda::DeviceBuffer<bf16> u(size_t(rows) * s.d_ff);
    auto out = poisoned<float>(size_t(r.n_tokens) * s.d_model);
    cuda::moe_route_topk({.expert_ids = ids.get(),
                          .expert_weights = w.get(),
                          .logits = r.logits.get(),
                          .n_tokens = r.n_tokens,
                          .n_experts = s.n_experts,
                          .top_k = kTopK},
                         nullptr);
    cuda::moe_group_by_expert({.expert_offsets = offsets.get(),
                               .sorted_rows = sorted.get(),
                               .scratch = scratch.get(),
                               .expert_ids = ids.get(),
                               .n_tokens = r.n_tokens,
                               .n_experts = s.n_experts,
                               .top_k = kTopK},
                              nullptr);
    cuda::moe_mlp1({.u = u.get(),
                    .x = r.h.get(),
                    .w = ex.mlp1.view(),
                    .expert_offsets = offsets.get(),
                    .sorted_rows = sorted.get(),
                    .n_tokens = r.n_tokens,
                    .n_experts = s.n_experts,
                    .top_k = kTopK,
                    .d_model = s.d_model,
                    .d_ff = s.d_ff},
                   nullptr);
    cuda::moe_mlp2({.y = y.get(),
                    .u = u.get(),
                    .w = ex.mlp2.view(),
                    .expert_offsets = offsets.get(),
                    .sorted_rows = sorted.get(),
                    .n_tokens = r.n_tokens,
                    .n_experts = s.n_experts,
                    .top_k = kTopK,
                    .d_model = s.d_model,
                    .d_ff = s.d_ff},
                   nullptr);
    cuda::moe_combine({.out = out.get(),
                       .y = y.get(),
                       .expert_weights = w.get(),
                       .n_tokens = r.n_tokens,
                       .d_model = s.d_model,
                       .top_k = kTopK,
                       .mode = cuda::MoeCombineMode::overwrite},
                      nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    return out.download();
}

void check_decode(const Shape& s, int n_tokens, Routing routing, bool extreme = false) {
    std::ostringstream name;
    name << s.name << (extreme ? " (extreme scales)" : "") << ", " << n_tokens << " tokens, " << routing_name(routing)
         << " routing";
    SCOPED_TRACE(name.str());
    const Experts& ex = experts_for(s, extreme);
    const uint32_t seed = fresh_seed();
    const std::vector<bf16> h = random_bf16(size_t(n_tokens) * s.d_model, seed + 1, -2.0f, 2.0f);
    const std::vector<float> logits = make_logits(s, n_tokens, routing, seed + 2);
    const Reference ref = reference(s, ex, h, logits, n_tokens);
    DecodeRun r(s, ex, h, logits, n_tokens);

    std::vector<bf16> u_dev;
    const std::vector<float> out = r.run(true, &u_dev);

    // u of every routed row (t, slot), read back in moe_u_column order.
    std::vector<float> u(size_t(n_tokens) * kTopK * s.d_ff);
    for (int i = 0; i < n_tokens * kTopK; ++i)
        for (int j = 0; j < s.d_ff; ++j)
            u[size_t(i) * s.d_ff + j] = bf16_to_float(u_dev[size_t(i) * s.d_ff + cuda::moe_u_column(j)]);
    expect_within(u, ref.u, ref.u_tol, s.d_ff, "routed row (token * 4 + slot)", "u = SwiGLU(h · W1ᵀ + b1) (mlp1)");
    expect_within(out, ref.out, ref.out_tol, s.d_model, "token", "moe output vs the CPU reference");

    // Determinism: the same inputs again, and without PDL: bit-identical.
    const std::vector<float> again = r.run(true);
    EXPECT_EQ(0, std::memcmp(again.data(), out.data(), out.size() * sizeof(float))) << "second run differs";
    const std::vector<float> no_pdl = r.run(false);
    EXPECT_EQ(0, std::memcmp(no_pdl.data(), out.data(), out.size() * sizeof(float))) << "run without PDL differs";

    // The existing MoE step: each path is within ref.out_tol of the reference, so within 2x of each other.
    // Its kernels need d_model and d_ff in multiples of 64 (moe_mlp_mxfp4.h): the odd shape has none.
    if (s.d_model % 64 != 0 || s.d_ff % 64 != 0) return;
    const std::vector<float> step = moe_step_path(s, ex, r);
    std::vector<float> tol2(ref.out_tol);
    for (float& v : tol2) v *= 2.0f;
    expect_within(out, step, tol2, s.d_model, "token", "moe output vs MoeStep (route, group, mlp1, mlp2, combine)");
}

class MoeDecode : public ::testing::TestWithParam<std::tuple<Shape, int>> {};

TEST_P(MoeDecode, random_routing) {
    const auto& [shape, n_tokens] = GetParam();
    check_decode(shape, n_tokens, Routing::random);
}

std::string name_of(const ::testing::TestParamInfo<MoeDecode::ParamType>& info) {
    const auto& [shape, n_tokens] = info.param;
    return std::string(shape.name) + "_" + std::to_string(n_tokens);
}

static_assert(kMaxT == 8, "update the batch sizes below");
INSTANTIATE_TEST_SUITE_P(shapes, MoeDecode,
                         ::testing::Combine(::testing::Values(kTiny, kOdd, k20b, k120b),
                                            ::testing::Values(1, 2, 3, 4, 5, kMaxT)),
                         name_of);

TEST(MoeDecodeRouting, shared_disjoint_and_tied_experts) {
    for (const Shape& s : {kTiny, kOdd, k20b, k120b})
        for (Routing r : {Routing::shared, Routing::disjoint, Routing::ties})
            for (int t : {2, kMaxT}) check_decode(s, t, r);
    check_decode(k120b, 5, Routing::ties);
}

TEST(MoeDecodeScales, extreme_scale_bytes) {
    for (const Shape& s : {kTiny, kOdd})
        for (int t : {1, 3, kMaxT}) check_decode(s, t, Routing::random, true);
    for (int t : {1, kMaxT}) check_decode(k20b, t, Routing::random, true);
}

// Captured once into a CUDA graph (as the forward does) and replayed: the same bits as eager runs.
TEST(MoeDecodeGraph, replay_matches_eager) {
    const Shape& s = k20b;
    const Experts& ex = experts_for(s, false);
    const uint32_t seed = fresh_seed();
    for (int n_tokens : {1, kMaxT}) {
        SCOPED_TRACE("tokens " + std::to_string(n_tokens));
        const std::vector<bf16> h = random_bf16(size_t(n_tokens) * s.d_model, seed + n_tokens, -2.0f, 2.0f);
        const std::vector<float> logits = make_logits(s, n_tokens, Routing::random, seed + 100 + n_tokens);
        DecodeRun r(s, ex, h, logits, n_tokens);
        const std::vector<float> eager = r.run(true);
        cuda::Stream stream;
        cuda::Graph graph;
        graph.capture(stream, [&] { cuda::moe_decode(r.args(true), stream); });
        for (int rep = 0; rep < 3; ++rep) {
            r.out.fill_bytes(0xFF, stream);
            graph.replay(stream);
            stream.sync();
            const std::vector<float> got = r.out.download(size_t(n_tokens) * s.d_model);
            EXPECT_EQ(0, std::memcmp(got.data(), eager.data(), got.size() * sizeof(float))) << "replay " << rep;
        }
    }
}

TEST(MoeDecodeErrors, rejects_bad_arguments) {
    const Experts& ex = experts_for(kTiny, false);
    DecodeRun r(kTiny, ex, random_bf16(size_t(kMaxT) * kTiny.d_model, 1),
                random_floats(size_t(kMaxT) * kTiny.n_experts, 2), 1);
    cuda::MoeDecodeArgs a = r.args();
    a.n_tokens = kMaxT + 1;
    EXPECT_THROW(cuda::moe_decode(a, nullptr), Error);
    a = r.args(), a.d_model = 100;  // not a multiple of 32
    EXPECT_THROW(cuda::moe_decode(a, nullptr), Error);
    a = r.args(), a.d_ff = 48;
    EXPECT_THROW(cuda::moe_decode(a, nullptr), Error);
    a = r.args(), a.top_k = 2;
    EXPECT_THROW(cuda::moe_decode(a, nullptr), Error);
    a = r.args(), a.n_experts = 3;
    EXPECT_THROW(cuda::moe_decode(a, nullptr), Error);
    a = r.args(), a.workspace = nullptr;
    EXPECT_THROW(cuda::moe_decode(a, nullptr), Error);
    a = r.args(), a.mlp2.bias = nullptr;
    EXPECT_THROW(cuda::moe_decode(a, nullptr), Error);
    a = r.args(), a.n_tokens = 0;  // a no-op
    EXPECT_NO_THROW(cuda::moe_decode(a, nullptr));
}

}  // namespace
}  // namespace osprey::test
