// The mid-batch MoE path (kernels/cuda/moe_mid.h, after moe_route_topk and moe_group_by_expert, as
// MoeStep runs it) against the CPU reference (routing.h, mxfp4_matmul.h, swiglu.h; per-element error
// bounds from moe_block_check.h) and against the grouped GEMM path (route -> group -> mlp1 -> mlp2
// -> combine), for 9..128 tokens, the tiny / 20b / 120b expert shapes and an odd one (rows of 3 and
// 5 MXFP4 groups: partial k-steps; 320 and 96 weight rows: 10 and 3 chunks), realistic and extreme
// scale bytes, and routings with ties, shared experts (4 experts with every token: several token
// blocks per expert at 25+ tokens), one expert with every token (skewed), disjoint experts and
// experts with no tokens. Also: bit-identical results across runs, with and without programmatic
// dependent launch, and when replayed from a CUDA graph.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/moe_group.h"
#include "kernels/cuda/moe_mid.h"
#include "kernels/cuda/moe_route.h"
#include "kernels/cuda_test_util.h"
#include "kernels/moe_block_check.h"

namespace osprey::test {
namespace {

using namespace moe_block;

struct MidRun {
    const Shape& s;
    const Experts& ex;
    int n_tokens;
    int variant = -1;  // MoeMidArgs::variant
    cuda::DeviceBuffer<bf16> h;
    cuda::DeviceBuffer<float> logits, w, y, out;
    cuda::DeviceBuffer<int32_t> ids, offsets, sorted, scratch;
    cuda::DeviceBuffer<uint8_t> ws;

    MidRun(const Shape& s_, const Experts& ex_, const std::vector<bf16>& h_, const std::vector<float>& logits_, int t)
        : s(s_),
          ex(ex_),
          n_tokens(t),
          h(to_device(h_)),
          logits(to_device(logits_)),
          w(size_t(t) * kTopK),
          y(size_t(t) * kTopK * s_.d_model),
          out(size_t(t) * s_.d_model),
          ids(size_t(t) * kTopK),
          offsets(s_.n_experts + 1),
          sorted(size_t(t) * kTopK),
          scratch(std::max<size_t>(1, cuda::moe_group_scratch_elems(t, kTopK, s_.n_experts))),
          ws(cuda::moe_mid_workspace_bytes(t, s_.d_model, s_.d_ff)) {}

    cuda::MoeMidArgs args(bool pdl = true) {
        return {.y = y.get(),
                .h = h.get(),
                .mlp1 = ex.mlp1.view(),
                .mlp2 = ex.mlp2.view(),
                .expert_offsets = offsets.get(),
                .sorted_rows = sorted.get(),
                .workspace = ws.get(),
                .max_tokens = n_tokens,
                .n_tokens = n_tokens,
                .n_experts = s.n_experts,
                .top_k = kTopK,
                .d_model = s.d_model,
                .d_ff = s.d_ff,
                .pdl = pdl,
                .variant = variant};
    }
    // MoeStep's launches on the mid path: route, group, moe_mid; then moe_combine into out.
    void launch(bool pdl, cudaStream_t stream) {
        cuda::moe_route_topk({.expert_ids = ids.get(),
                              .expert_weights = w.get(),
                              .logits = logits.get(),
                              .n_tokens = n_tokens,
                              .n_experts = s.n_experts,
                              .top_k = kTopK},
                             stream);
        cuda::moe_group_by_expert({.expert_offsets = offsets.get(),
                                   .sorted_rows = sorted.get(),
                                   .scratch = scratch.get(),
                                   .expert_ids = ids.get(),
                                   .n_tokens = n_tokens,
                                   .n_experts = s.n_experts,
                                   .top_k = kTopK},
                                  stream);
        cuda::moe_mid(args(pdl), stream);
        cuda::moe_combine({.out = out.get(),
                           .y = y.get(),
                           .expert_weights = w.get(),
                           .n_tokens = n_tokens,
                           .d_model = s.d_model,
                           .top_k = kTopK,
                           .mode = cuda::MoeCombineMode::overwrite},
                          stream);
    }
    // Poisons y, out and the workspace (u) with NaN, runs, returns y (and out, u by sorted row).
    std::vector<float> run(bool pdl = true, std::vector<float>* out_host = nullptr, std::vector<bf16>* u = nullptr,
                           std::vector<int32_t>* sorted_host = nullptr, cudaStream_t stream = nullptr) {
        y.fill_bytes(0xFF, stream);
        out.fill_bytes(0xFF, stream);
        ws.fill_bytes(0xFF, stream);
        launch(pdl, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        if (out_host) *out_host = out.download();
        if (u) {
            u->resize(ws.size() / sizeof(bf16));
            CUDA_CHECK(cudaMemcpy(u->data(), ws.get(), u->size() * sizeof(bf16), cudaMemcpyDeviceToHost));
        }
        if (sorted_host) *sorted_host = sorted.download();
        return y.download();
    }
};

void check_mid(const Shape& s, int n_tokens, Routing routing, bool extreme = false, int variant = -1) {
    SCOPED_TRACE(case_name(s, n_tokens, routing, extreme) + ", variant " + std::to_string(variant));
    const Case c = make_case(s, n_tokens, routing, extreme);
    const Reference& ref = c.ref;
    MidRun r(s, c.ex, c.h, c.logits, n_tokens);
    r.variant = variant;

    std::vector<float> out;
    std::vector<bf16> u_dev;
    std::vector<int32_t> sorted;
    const std::vector<float> y = r.run(true, &out, &u_dev, &sorted);

    // u of every routed row, read from the tile layout (sorted position p holds routed row sorted[p]).
    const int rows = n_tokens * kTopK;
    std::vector<float> u(size_t(rows) * s.d_ff);
    for (int p = 0; p < rows; ++p)
        for (int j = 0; j < s.d_ff; ++j)
            u[size_t(sorted[p]) * s.d_ff + j] = bf16_to_float(u_dev[cuda::moe_mid_act_index(p, j, rows)]);
    expect_within(u, ref.u, ref.u_tol, s.d_ff, "routed row (token * 4 + slot)", "u = SwiGLU(h · W1ᵀ + b1) (mlp1)");
    expect_within(y, ref.y, ref.y_tol, s.d_model, "routed row (token * 4 + slot)", "y = u · W2ᵀ + b2 (mlp2)");
    expect_within(out, ref.out, ref.out_tol, s.d_model, "token", "moe output vs the CPU reference");

    // Determinism: the same inputs again, and without PDL: bit-identical.
    const std::vector<float> again = r.run(true);
    EXPECT_EQ(0, std::memcmp(again.data(), y.data(), y.size() * sizeof(float))) << "second run differs";
    const std::vector<float> no_pdl = r.run(false);
    EXPECT_EQ(0, std::memcmp(no_pdl.data(), y.data(), y.size() * sizeof(float))) << "run without PDL differs";

    // The grouped GEMM path (automatic tiling) on the same grouping: each within ref.out_tol of the
    // reference, so within 2x of each other.
    if (!grouped_gemm_fits(s)) return;
    expect_paths_agree(out, grouped_gemm_out(s, c.ex, r.h.get(), r.offsets.get(), r.sorted.get(), r.w.get(), n_tokens),
                       ref.out_tol, s.d_model, "moe output vs the grouped GEMM path (mlp1, mlp2, combine)");
}

class MoeMid : public ::testing::TestWithParam<std::tuple<Shape, int>> {};

TEST_P(MoeMid, random_routing) {
    const auto& [shape, n_tokens] = GetParam();
    check_mid(shape, n_tokens, Routing::random);
}

std::string name_of(const ::testing::TestParamInfo<MoeMid::ParamType>& info) {
    const auto& [shape, n_tokens] = info.param;
    return std::string(shape.name) + "_" + std::to_string(n_tokens);
}

INSTANTIATE_TEST_SUITE_P(shapes, MoeMid,
                         ::testing::Combine(::testing::Values(kTiny, kOdd, k20b, k120b),
                                            ::testing::Values(9, 16, 31, 64, 100, 128)),
                         name_of);

// skewed: one expert gets every token (65 / 128 tokens: 3 / 6 token blocks of 21-22 rows, each
// streaming the expert's weights once); shared: four experts get every token and the others none;
// disjoint: 4 tokens' experts apart (tiny / odd: every expert many times over); ties: the lowest ids
// win.
TEST(MoeMidRouting, skewed_shared_disjoint_and_tied_experts) {
    for (const Shape& s : {kTiny, kOdd, k20b, k120b})
        for (Routing r : {Routing::skewed, Routing::shared})
            for (int t : {9, 65, 128}) check_mid(s, t, r);
    for (const Shape& s : {kTiny, kOdd, k120b})
        for (Routing r : {Routing::disjoint, Routing::ties})
            for (int t : {16, 100}) check_mid(s, t, r);
}

TEST(MoeMidScales, extreme_scale_bytes) {
    for (const Shape& s : {kTiny, kOdd})
        for (int t : {9, 31, 128}) check_mid(s, t, Routing::random, true);
    for (int t : {16, 128}) check_mid(k20b, t, Routing::random, true);
}

// Every variant (chunks of 32 or 16 weight rows, token blocks of 24 or 16 routed rows): skewed experts
// split over several token blocks.
TEST(MoeMidVariants, every_variant) {
    for (int v = 0; v < cuda::kMoeMidVariants; ++v) {
        check_mid(k20b, 128, Routing::skewed, false, v);
        check_mid(k120b, 64, Routing::random, false, v);
        check_mid(kOdd, 31, Routing::skewed, false, v);
        check_mid(kTiny, 100, Routing::shared, false, v);
    }
}

// Captured once into a CUDA graph (as the forward does) and replayed: the same bits as eager runs.
TEST(MoeMidGraph, replay_matches_eager) {
    for (const Shape* s : {&k20b, &k120b}) {
        const Experts& ex = experts_for(*s, false);
        const uint32_t seed = fresh_seed();
        for (int n_tokens : {9, 128}) {
            SCOPED_TRACE(std::string(s->name) + ", tokens " + std::to_string(n_tokens));
            const std::vector<bf16> h = random_bf16(size_t(n_tokens) * s->d_model, seed + n_tokens, -2.0f, 2.0f);
            const std::vector<float> logits = make_logits(*s, n_tokens, Routing::random, seed + 100 + n_tokens);
            MidRun r(*s, ex, h, logits, n_tokens);
            std::vector<float> eager;
            r.run(true, &eager);
            expect_graph_replays_match([&](cudaStream_t stream) { r.launch(true, stream); }, r.out, eager);
        }
    }
}

TEST(MoeMidErrors, rejects_bad_arguments) {
    const Experts& ex = experts_for(kTiny, false);
    MidRun r(kTiny, ex, random_bf16(size_t(16) * kTiny.d_model, 1), random_floats(size_t(16) * kTiny.n_experts, 2), 16);
    cuda::MoeMidArgs a = r.args();
    a.n_tokens = 17;  // more than the workspace holds
    EXPECT_THROW(cuda::moe_mid(a, nullptr), Error);
    a = r.args(), a.d_model = 100;  // not a multiple of 32
    EXPECT_THROW(cuda::moe_mid(a, nullptr), Error);
    a = r.args(), a.d_ff = 48;
    EXPECT_THROW(cuda::moe_mid(a, nullptr), Error);
    a = r.args(), a.top_k = 2;
    EXPECT_THROW(cuda::moe_mid(a, nullptr), Error);
    a = r.args(), a.n_experts = 3;
    EXPECT_THROW(cuda::moe_mid(a, nullptr), Error);
    a = r.args(), a.workspace = nullptr;
    EXPECT_THROW(cuda::moe_mid(a, nullptr), Error);
    a = r.args(), a.mlp2.bias = nullptr;
    EXPECT_THROW(cuda::moe_mid(a, nullptr), Error);
    a = r.args(), a.variant = cuda::kMoeMidVariants;
    EXPECT_THROW(cuda::moe_mid(a, nullptr), Error);
    a = r.args(), a.n_tokens = 0;  // a no-op
    EXPECT_NO_THROW(cuda::moe_mid(a, nullptr));
}

}  // namespace
}  // namespace osprey::test
