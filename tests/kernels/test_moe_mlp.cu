// The whole MoE step on the GPU (route -> group -> mlp1 -> mlp2 -> combine) against the CPU
// reference kernels, for the tiny, 20b and 120b expert shapes, batches from 1 to 2048 tokens, both
// kernel configurations (gemv and gemm), plus shapes cut at the kernels' tile constants.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "kernels/cpu/routing.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/moe_group.h"
#include "kernels/cuda/moe_mlp_mxfp4.h"
#include "kernels/cuda/moe_route.h"
#include "kernels/cuda_test_util.h"
#include "kernels/ref_moe.h"

namespace osprey::test {
namespace {

using cuda::MoeKernel;

// Mirrors the tile constants of kernels/cuda/moe_mlp_mxfp4.cu.
constexpr int kGemvRows = 8, kNarrowRows = 32, kGemmRows = 128;  // routed rows per token tile
constexpr int kGemvBM = 32, kGemmBM = 128;     // weight rows per block
constexpr int kBK = 64;                        // k per pipeline stage

struct Shape {
    const char* name;
    int n_experts, d_model, d_ff;
};
constexpr Shape kTiny{"tiny", 8, 128, 128};
constexpr Shape k20b{"20b", 32, 2880, 2880};
constexpr Shape k120b{"120b", 128, 2880, 2880};
// Output widths that leave partial blocks (mlp2: 192 rows = 1.5 gemm blocks, 3 gemv blocks) and an
// input width shorter than the pipeline depth (3 stages of kBK).
constexpr Shape kEdges{"edges", 4, 3 * kBK, kBK};

// Expert weights per shape, made once per process (the 120b set is 1.7 GB).
struct Experts {
    Mxfp4Projection mlp1, mlp2;
    Experts(const Shape& s, uint64_t seed)
        // Scale bytes 116..122: weights up to 6 * 2^-5, so mlp1's outputs land on both sides of the
        // SwiGLU clamp (±7) for x in [-2, 2].
        : mlp1(s.n_experts, 2 * s.d_ff, s.d_model, seed, 116), mlp2(s.n_experts, s.d_model, s.d_ff, seed + 1, 116) {}
};
// Never destroyed: device memory must not be freed after the CUDA runtime has shut down at exit.
Experts& experts_for(const Shape& s) {
    static auto* cache = new std::map<std::string, std::unique_ptr<Experts>>;
    auto& p = (*cache)[s.name];
    if (!p) p = std::make_unique<Experts>(s, mix64(fresh_seed()));
    return *p;
}

// |got - want| <= tol_max * max|want| + tol_rel * |want| over the listed values; NaN fails.
void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, double tol_max, double tol_rel,
                     const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double max_want = 0.0;
    for (float w : want) max_want = std::max(max_want, double(std::fabs(w)));
    size_t bad = 0, worst_i = 0;
    double worst = -1e300;
    for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::fabs(double(got[i]) - want[i]) - (tol_max * max_want + tol_rel * std::fabs(want[i]));
        if (std::isnan(got[i]) || err > 0) ++bad;
        if (std::isnan(got[i]) || err > worst) worst = std::isnan(got[i]) ? 1e300 : err, worst_i = i;
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " out of tolerance; worst at " << worst_i
                       << " got " << got[worst_i] << " want " << want[worst_i] << " (max |want| " << max_want << ")";
}

void run_moe(const Shape& s, int n_tokens, MoeKernel kernel, int experts_used = 0) {
    SCOPED_TRACE(std::string(s.name) + " tokens=" + std::to_string(n_tokens) + " " + cuda::moe_kernel_name(kernel));
    Experts& ex = experts_for(s);
    const int top_k = 4, n_rows = n_tokens * top_k;
    const uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);

    // Inputs: x ~ the normed hidden state (bf16), router logits, residual.
    const std::vector<bf16> x = random_bf16(size_t(n_tokens) * s.d_model, seed + 1, -2.0f, 2.0f);
    std::vector<float> logits = random_floats(size_t(n_tokens) * s.n_experts, seed + 2, -4.0f, 4.0f);
    if (experts_used > 0)  // concentrate the batch on a few experts (many rows per expert)
        for (int t = 0; t < n_tokens; ++t)
            for (int e = experts_used; e < s.n_experts; ++e) logits[size_t(t) * s.n_experts + e] -= 100.0f;
    const std::vector<float> residual = random_floats(size_t(n_tokens) * s.d_model, seed + 3);

    auto d_x = to_device(x);
    auto d_logits = to_device(logits);
    auto d_out = to_device(residual);
    auto d_ids = poisoned<int32_t>(n_rows);
    auto d_w = poisoned<float>(n_rows);
    auto d_offsets = poisoned<int32_t>(s.n_experts + 1);
    auto d_sorted = poisoned<int32_t>(n_rows);
    cuda::DeviceBuffer<int32_t> d_scratch(std::max<size_t>(1, cuda::moe_group_scratch_elems(n_tokens, top_k, s.n_experts)));
    auto d_u = poisoned<bf16>(size_t(n_rows) * s.d_ff);
    auto d_y = poisoned<float>(size_t(n_rows) * s.d_model);

    cuda::moe_route_topk({.expert_ids = d_ids.get(), .expert_weights = d_w.get(), .logits = d_logits.get(),
                          .n_tokens = n_tokens, .n_experts = s.n_experts, .top_k = top_k}, nullptr);
    cuda::moe_group_by_expert({.expert_offsets = d_offsets.get(), .sorted_rows = d_sorted.get(),
                               .scratch = d_scratch.get(), .expert_ids = d_ids.get(), .n_tokens = n_tokens,
                               .n_experts = s.n_experts, .top_k = top_k}, nullptr);
    cuda::moe_mlp1({.u = d_u.get(), .x = d_x.get(), .w = ex.mlp1.view(), .expert_offsets = d_offsets.get(),
                    .sorted_rows = d_sorted.get(), .n_tokens = n_tokens, .n_experts = s.n_experts, .top_k = top_k,
                    .d_model = s.d_model, .d_ff = s.d_ff, .kernel = kernel}, nullptr);
    cuda::moe_mlp2({.y = d_y.get(), .u = d_u.get(), .w = ex.mlp2.view(), .expert_offsets = d_offsets.get(),
                    .sorted_rows = d_sorted.get(), .n_tokens = n_tokens, .n_experts = s.n_experts, .top_k = top_k,
                    .d_model = s.d_model, .d_ff = s.d_ff, .kernel = kernel}, nullptr);
    cuda::moe_combine({.out = d_out.get(), .y = d_y.get(), .expert_weights = d_w.get(), .n_tokens = n_tokens,
                       .d_model = s.d_model, .top_k = top_k}, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());

    const std::vector<int32_t> ids = d_ids.download();
    const std::vector<float> w = d_w.download();
    const std::vector<int32_t> offsets = d_offsets.download(), sorted = d_sorted.download();
    const std::vector<bf16> u = d_u.download();
    const std::vector<float> y = d_y.download(), out = d_out.download();

    // Routing and grouping: exact.
    std::vector<int32_t> want_ids(n_rows);
    std::vector<float> want_w(n_rows);
    cpu::route_topk_softmax(want_ids, want_w, logits, n_tokens, s.n_experts, top_k);
    ASSERT_EQ(ids, want_ids);
    std::vector<int32_t> position(n_rows, -1);  // sorted position of each routed row
    for (int e = 0; e < s.n_experts; ++e)
        for (int p = offsets[e]; p < offsets[e + 1]; ++p) {
            ASSERT_EQ(ids[sorted[p]], e);
            position[sorted[p]] = p;
        }
    ASSERT_EQ(offsets[s.n_experts], n_rows);

    // Every output row written and finite.
    for (size_t i = 0; i < y.size(); ++i) ASSERT_TRUE(std::isfinite(y[i])) << "y[" << i << "] = " << y[i];
    for (size_t i = 0; i < out.size(); ++i) ASSERT_TRUE(std::isfinite(out[i])) << "out[" << i << "] = " << out[i];

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
        for (int k = 0; k < top_k; ++k) rows_of[ids[t * top_k + k]].push_back(t * top_k + k);

    std::vector<float> got_u, want_u, got_y, want_y, want_y_chain;
    std::map<int, std::vector<float>> y_chain;  // routed row -> reference y from the reference u
    for (const auto& [e, rows] : rows_of) {
        const int n = int(rows.size());
        std::vector<float> xe(size_t(n) * s.d_model), a, ue(size_t(n) * s.d_ff), ug(size_t(n) * s.d_ff), ye, yc;
        for (int i = 0; i < n; ++i)
            for (int c = 0; c < s.d_model; ++c) xe[size_t(i) * s.d_model + c] = bf16_to_float(x[size_t(rows[i] / top_k) * s.d_model + c]);
        ex.mlp1.ref(e, xe, n, a);
        cpu::swiglu_clamped(ue, a, n, s.d_ff, 1.702f, 7.0f);
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < s.d_ff; ++j)
                ug[size_t(i) * s.d_ff + j] = bf16_to_float(u[size_t(position[rows[i]]) * s.d_ff + cuda::moe_u_column(j)]);
        got_u.insert(got_u.end(), ug.begin(), ug.end());
        want_u.insert(want_u.end(), ue.begin(), ue.end());
        ex.mlp2.ref(e, ug, n, ye);  // mlp2 fed the GPU's own u: isolates mlp2's error
        ex.mlp2.ref(e, ue, n, yc);  // and the all-reference chain, for the end-to-end bound
        for (int i = 0; i < n; ++i) {
            got_y.insert(got_y.end(), y.begin() + size_t(rows[i]) * s.d_model, y.begin() + size_t(rows[i] + 1) * s.d_model);
            want_y.insert(want_y.end(), ye.begin() + size_t(i) * s.d_model, ye.begin() + size_t(i + 1) * s.d_model);
            y_chain[rows[i]].assign(yc.begin() + size_t(i) * s.d_model, yc.begin() + size_t(i + 1) * s.d_model);
        }
    }
    // u: FP32 accumulation of exact products (tiny error) then one BF16 rounding (2^-9 relative):
    // 2^-8 relative plus 1e-3 of the largest |u| for accumulation-order differences near zero.
    expect_near_all(got_u, want_u, 1e-3, 1.0 / 256, "mlp1 u");
    // y from identical bf16 inputs: only FP32 accumulation order differs (K = d_ff).
    expect_near_all(got_y, want_y, 1e-4, 1e-4, "mlp2 y");

    std::vector<float> got_out, want_out, want_out_chain;
    for (int t : tokens)
        for (int c = 0; c < s.d_model; ++c) {
            double sum = 0.0, sum_chain = 0.0;
            for (int k = 0; k < top_k; ++k) {
                sum += double(w[t * top_k + k]) * y[size_t(t * top_k + k) * s.d_model + c];
                sum_chain += double(want_w[t * top_k + k]) * y_chain[t * top_k + k][c];
            }
            got_out.push_back(out[size_t(t) * s.d_model + c] - residual[size_t(t) * s.d_model + c]);
            want_out.push_back(float(sum));
            want_out_chain.push_back(float(sum_chain));
        }
    // The combine itself: 4 FP32 products in slot order (the residual is subtracted back exactly enough).
    expect_near_all(got_out, want_out, 1e-5, 1e-5, "combine");
    // End to end against the all-FP32 reference: u's BF16 rounding propagates through mlp2
    // (BF16 activations: 1e-2 of the largest output).
    expect_near_all(got_out, want_out_chain, 1e-2, 0.0, "moe output vs reference chain");
}

class MoeMlp : public ::testing::TestWithParam<std::tuple<Shape, int, MoeKernel>> {};

TEST_P(MoeMlp, matches_reference) {
    const auto& [shape, n_tokens, kernel] = GetParam();
    run_moe(shape, n_tokens, kernel);
}

std::string name_of(const ::testing::TestParamInfo<MoeMlp::ParamType>& info) {
    const auto& [shape, n_tokens, kernel] = info.param;
    return std::string(shape.name) + "_" + std::to_string(n_tokens) + "_" + cuda::moe_kernel_name(kernel);
}

INSTANTIATE_TEST_SUITE_P(shapes, MoeMlp,
                         ::testing::Combine(::testing::Values(kTiny, k20b, k120b),
                                            ::testing::Values(1, 3, 8, 64, 333, 2048),
                                            ::testing::Values(MoeKernel::gemv, MoeKernel::narrow, MoeKernel::gemm)),
                         name_of);

// Rows per expert around the token-tile sizes (less than one, one, one plus a remainder, several),
// with the whole batch on 4 experts so that each gets n_tokens rows.
TEST(MoeMlpTiles, gemv_tile_edges) {
    for (int n : {kGemvRows - 1, kGemvRows, kGemvRows + 1, 3 * kGemvRows + 5}) run_moe(k20b, n, MoeKernel::gemv, 4);
}
TEST(MoeMlpTiles, narrow_tile_edges) {
    for (int n : {kNarrowRows - 1, kNarrowRows, kNarrowRows + 1, 2 * kNarrowRows + 7})
        run_moe(k20b, n, MoeKernel::narrow, 4);
}
TEST(MoeMlpTiles, gemm_tile_edges) {
    for (int n : {kGemmRows - 1, kGemmRows, kGemmRows + 1, 2 * kGemmRows + 7}) run_moe(k20b, n, MoeKernel::gemm, 4);
}
TEST(MoeMlpTiles, partial_weight_blocks_and_short_k) {
    static_assert(kEdges.d_model % kGemvBM == 0 && kEdges.d_model % kGemmBM != 0);
    for (MoeKernel k : {MoeKernel::gemv, MoeKernel::narrow, MoeKernel::gemm})
        for (int n : {1, 5, 300}) run_moe(kEdges, n, k);
}
TEST(MoeMlpTiles, automatic_choice) {
    EXPECT_EQ(cuda::moe_choose_kernel(1, 4, 32), MoeKernel::gemv);
    EXPECT_EQ(cuda::moe_choose_kernel(32, 4, 32), MoeKernel::gemv);      // 4 rows per expert
    EXPECT_EQ(cuda::moe_choose_kernel(33, 4, 32), MoeKernel::narrow);    // just above
    EXPECT_EQ(cuda::moe_choose_kernel(1024, 4, 32), MoeKernel::narrow);  // 128
    EXPECT_EQ(cuda::moe_choose_kernel(1025, 4, 32), MoeKernel::gemm);
    EXPECT_EQ(cuda::moe_choose_kernel(128, 4, 128), MoeKernel::gemv);    // 120b decode, batch 128
    EXPECT_EQ(cuda::moe_choose_kernel(1024, 4, 128), MoeKernel::narrow); // 120b, 1k prefill
    EXPECT_EQ(cuda::moe_choose_kernel(8192, 4, 32), MoeKernel::gemm);
    for (int n : {1, 64, 300, 1500}) run_moe(k20b, n, MoeKernel::automatic);
}

TEST(MoeMlpErrors, rejects_bad_shapes) {
    Experts& ex = experts_for(kTiny);
    cuda::DeviceBuffer<int32_t> offsets(9), sorted(4);
    cuda::DeviceBuffer<bf16> x(128), u(128);
    cuda::MoeMlp1Args a{.u = u.get(), .x = x.get(), .w = ex.mlp1.view(), .expert_offsets = offsets.get(),
                        .sorted_rows = sorted.get(), .n_tokens = 1, .n_experts = 8, .top_k = 4, .d_model = 100,
                        .d_ff = 128};
    EXPECT_THROW(cuda::moe_mlp1(a, nullptr), Error);  // d_model not a multiple of 64
    a.d_model = 128;
    a.w.blocks = nullptr;
    EXPECT_THROW(cuda::moe_mlp1(a, nullptr), Error);
    cuda::MoeMlp2Args b{.y = nullptr, .u = u.get(), .w = ex.mlp2.view(), .expert_offsets = offsets.get(),
                        .sorted_rows = sorted.get(), .n_tokens = 1, .n_experts = 8, .top_k = 4, .d_model = 128,
                        .d_ff = 128};
    EXPECT_THROW(cuda::moe_mlp2(b, nullptr), Error);  // null y
    EXPECT_THROW(cuda::moe_combine({.out = nullptr, .y = nullptr, .expert_weights = nullptr, .n_tokens = 1,
                                    .d_model = 128, .top_k = 3}, nullptr), Error);
}

}  // namespace
}  // namespace osprey::test
