// The decode MoE block (kernels/cuda/moe_decode.h) against the CPU reference (routing.h,
// mxfp4_matmul.h, swiglu.h) and against the existing MoE step (route -> group -> mlp1 -> mlp2 ->
// combine), for every batch size up to kMoeDecodeMaxTokens, the tiny / 20b / 120b expert shapes
// and an odd one (rows of 3 and 5 MXFP4 groups: partial k-steps), realistic and extreme scale
// bytes, routings with ties, shared experts and disjoint experts, with the weights in the published
// word layout and in the decode layout (mxfp4_words.h: a copy made by mxfp4_to_decode_layout, which
// must give the same bits). Also: bit-identical results across runs, with and without programmatic
// dependent launch, and when replayed from a CUDA graph.
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
#include <string>

#include "kernels/cpu/mxfp4_matmul.h"
#include "kernels/cpu/routing.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/moe_decode.h"
#include "kernels/cuda/moe_group.h"
#include "kernels/cuda/moe_route.h"
#include "kernels/cuda_test_util.h"
#include "kernels/moe_block_check.h"

namespace osprey::test {
namespace {

using namespace moe_block;
using cuda::Mxfp4WordLayout;
constexpr int kMaxT = cuda::kMoeDecodeMaxTokens;

const char* words_name(Mxfp4WordLayout w) {
    return w == Mxfp4WordLayout::decode ? "decode" : "published";
}


struct DecodeRun {
    const Shape& s;
    const Experts& ex;
    int n_tokens;
    Mxfp4WordLayout words;
    cuda::DeviceBuffer<bf16> h;
    cuda::DeviceBuffer<float> logits, out;
    cuda::DeviceBuffer<uint8_t> ws;

    DecodeRun(const Shape& s_, const Experts& ex_, const std::vector<bf16>& h_, const std::vector<float>& logits_,
              int t, Mxfp4WordLayout words_ = Mxfp4WordLayout::published)
        : s(s_),
          ex(ex_),
          n_tokens(t),
          words(words_),
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
                .mlp1 = ex.mlp1.view(words),
                .mlp2 = ex.mlp2.view(words),
                .workspace = ws.get(),
                .n_tokens = n_tokens,
                .n_experts = s.n_experts,
                .top_k = kTopK,
                .d_model = s.d_model,
                .d_ff = s.d_ff,
                .words = words,
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

// The existing path (MoeStep's launches) on the same inputs: route, group, then the grouped GEMM path.
std::vector<float> moe_step_path(const Shape& s, const Experts& ex, DecodeRun& r) {
    const int rows = r.n_tokens * kTopK;
    cuda::DeviceBuffer<int32_t> ids(rows), offsets(s.n_experts + 1), sorted(rows),
        scratch(std::max<size_t>(1, cuda::moe_group_scratch_elems(r.n_tokens, kTopK, s.n_experts)));
    cuda::DeviceBuffer<float> w(rows);
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
    return grouped_gemm_out(s, ex, r.h.get(), offsets.get(), sorted.get(), w.get(), r.n_tokens);
}

void check_decode(const Shape& s, int n_tokens, Routing routing, bool extreme = false,
                  Mxfp4WordLayout words = Mxfp4WordLayout::published) {
    SCOPED_TRACE(case_name(s, n_tokens, routing, extreme) + ", " + words_name(words) + " words");
    const Case c = make_case(s, n_tokens, routing, extreme);
    const Reference& ref = c.ref;
    DecodeRun r(s, c.ex, c.h, c.logits, n_tokens, words);

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

    // The other word layout decodes to the same BF16 weights: the same bits.
    if (words == Mxfp4WordLayout::decode) {
        DecodeRun pub(s, c.ex, c.h, c.logits, n_tokens, Mxfp4WordLayout::published);
        const std::vector<float> p = pub.run(true);
        EXPECT_EQ(0, std::memcmp(p.data(), out.data(), out.size() * sizeof(float)))
            << "decode-layout words differ from the published ones";
    }

    // The existing MoE step: each path is within ref.out_tol of the reference, so within 2x of each other.
    if (!grouped_gemm_fits(s)) return;
    expect_paths_agree(out, moe_step_path(s, c.ex, r), ref.out_tol, s.d_model,
                       "moe output vs MoeStep (route, group, mlp1, mlp2, combine)");
}

class MoeDecode : public ::testing::TestWithParam<std::tuple<Shape, int, Mxfp4WordLayout>> {};

TEST_P(MoeDecode, random_routing) {
    const auto& [shape, n_tokens, words] = GetParam();
    check_decode(shape, n_tokens, Routing::random, false, words);
}

std::string name_of(const ::testing::TestParamInfo<MoeDecode::ParamType>& info) {
    const auto& [shape, n_tokens, words] = info.param;
    return std::string(shape.name) + "_" + std::to_string(n_tokens) + "_" + words_name(words);
}

static_assert(kMaxT == 8, "update the batch sizes below");
INSTANTIATE_TEST_SUITE_P(shapes, MoeDecode,
                         ::testing::Combine(::testing::Values(kTiny, kOdd, k20b, k120b),
                                            ::testing::Values(1, 2, 3, 4, 5, kMaxT),
                                            ::testing::Values(Mxfp4WordLayout::published, Mxfp4WordLayout::decode)),
                         name_of);

TEST(MoeDecodeRouting, shared_disjoint_and_tied_experts) {
    for (const Shape& s : {kTiny, kOdd, k20b, k120b})
        for (Routing r : {Routing::shared, Routing::disjoint, Routing::ties})
            for (int t : {2, kMaxT}) check_decode(s, t, r);
    check_decode(k120b, 5, Routing::ties);
    for (const Shape& s : {kOdd, k120b}) check_decode(s, kMaxT, Routing::ties, false, Mxfp4WordLayout::decode);
}

TEST(MoeDecodeScales, extreme_scale_bytes) {
    for (const Shape& s : {kTiny, kOdd})
        for (int t : {1, 3, kMaxT}) check_decode(s, t, Routing::random, true);
    for (int t : {1, kMaxT}) check_decode(k20b, t, Routing::random, true);
    for (const Shape& s : {kOdd, k20b}) check_decode(s, 3, Routing::random, true, Mxfp4WordLayout::decode);
}

// The device conversion word for word against mxfp4_word_to_decode_layout, out of place and in place.
TEST(MoeDecodeWords, device_conversion_matches_the_host) {
    const size_t bytes = 4 * 16 * 1000 + 48;
    std::vector<uint8_t> src(bytes);
    std::mt19937 rng(fresh_seed());
    for (auto& b : src) b = uint8_t(rng());
    std::vector<uint8_t> want(bytes);
    cuda::mxfp4_blocks_to_decode_layout(src.data(), want.data(), bytes);
    cuda::DeviceBuffer<uint8_t> d_src(to_device(src)), d_dst(bytes);
    cuda::mxfp4_to_decode_layout(d_src.get(), d_dst.get(), bytes, nullptr);
    EXPECT_EQ(d_dst.download(), want) << "out of place";
    cuda::mxfp4_to_decode_layout(d_src.get(), d_src.get(), bytes, nullptr);
    EXPECT_EQ(d_src.download(), want) << "in place";
    EXPECT_THROW(cuda::mxfp4_to_decode_layout(d_src.get(), d_dst.get(), 20, nullptr), Error);
    EXPECT_THROW(cuda::mxfp4_to_decode_layout(d_src.get() + 4, d_dst.get(), 16, nullptr), Error);
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
        expect_graph_replays_match([&](cudaStream_t stream) { cuda::moe_decode(r.args(true), stream); }, r.out, eager);
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
