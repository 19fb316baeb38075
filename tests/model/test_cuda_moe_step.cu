// MoeStep's choice of path by batch size (model/cuda/moe_step.cpp): decode (1-8 tokens), mid-batch
// (kernels/cuda/moe_mid.h, 9-128 by default) and the grouped GEMMs, each against the CPU reference
// (per-element bounds of tests/kernels/moe_block_check.h) through MoeStep's own carved workspace, at
// the edges of the ranges; and the environment switches: $OSPREY_MOE_MID=1 (the path is off by
// default), =0, and a moved range
// ($OSPREY_MOE_MID_MIN / _MAX) change the path, not the result beyond the bound.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cuda/moe_combine.h"
#include "kernels/moe_block_check.h"
#include "model/cuda/moe_step.h"

namespace osprey::test {
namespace {

using namespace moe_block;

// The experts of a moe_block shape as a DeviceLayer (device copies of the MXFP4 projections).
struct Layer {
    model::Config c;
    model::DeviceLayer w;
    Layer(const Shape& s, const Experts& ex) {
        c.n_experts = s.n_experts, c.d_model = s.d_model, c.d_ff = s.d_ff, c.top_k = kTopK;
        auto copy = [](auto& dst, const auto& src) {
            dst.resize(src.size());
            CUDA_CHECK(cudaMemcpy(dst.get(), src.get(), src.size() * sizeof(*src.get()), cudaMemcpyDeviceToDevice));
        };
        copy(w.mlp1_blocks, ex.mlp1.d_blocks), copy(w.mlp1_scales, ex.mlp1.d_scales), copy(w.mlp1_bias, ex.mlp1.d_bias);
        copy(w.mlp2_blocks, ex.mlp2.d_blocks), copy(w.mlp2_scales, ex.mlp2.d_scales), copy(w.mlp2_bias, ex.mlp2.d_bias);
    }
    // What DeviceWeights::add_decode_copies adds to each layer.
    void add_decode_copies() {
        model::add_decode_copy(w, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
    }
};

// MoeStep carved for max_tokens (reading the environment as the runner does), run on n_tokens:
// moe = Σ_slot w · y.
std::vector<float> run_step(const Layer& l, const std::vector<bf16>& h, const std::vector<float>& logits, int n_tokens,
                            int max_tokens) {
    cuda::Workspace ws(model::MoeStep::workspace_bytes(l.c, max_tokens));
    const model::MoeStep step = model::MoeStep::carve(l.c, max_tokens, ws);
    const auto d_h = to_device(h);
    const auto d_logits = to_device(logits);
    auto moe = poisoned<float>(size_t(n_tokens) * l.c.d_model);
    step.run(l.c, model::MoeExperts::whole(l.c), l.w, d_h.get(), d_logits.get(), moe.get(), n_tokens, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    return moe.download();
}

void check_step(const Shape& s, int n_tokens, int max_tokens, const char* env_note) {
    SCOPED_TRACE(std::string(s.name) + ", " + std::to_string(n_tokens) + " tokens (workspace for " +
                 std::to_string(max_tokens) + "), " + env_note);
    const Experts& ex = experts_for(s, false);
    const Layer l(s, ex);
    const uint32_t seed = fresh_seed();
    const std::vector<bf16> h = random_bf16(size_t(n_tokens) * s.d_model, seed + 1, -2.0f, 2.0f);
    const std::vector<float> logits = make_logits(s, n_tokens, Routing::random, seed + 2);
    const Reference ref = reference(s, ex, h, logits, n_tokens);
    const std::vector<float> out = run_step(l, h, logits, n_tokens, max_tokens);
    expect_within(out, ref.out, ref.out_tol, s.d_model, "token", "MoeStep output vs the CPU reference");
}

// Sets (or clears, value null) an environment variable for the scope.
struct EnvVar {
    std::string name;
    EnvVar(const char* n, const char* value) : name(n) {
        if (value) {
            setenv(n, value, 1);
        } else {
            unsetenv(n);
        }
    }
    ~EnvVar() { unsetenv(name.c_str()); }
};

TEST(CudaMoeStep, paths_by_batch_size) {
    for (int t : {9, 128}) check_step(k20b, t, 128, "mid path off (the default)");
    EnvVar on("OSPREY_MOE_MID", "1");
    for (const Shape& s : {kTiny, k20b, k120b})
        for (int t : {8, 9, 64, 128, 129}) check_step(s, t, 160, "OSPREY_MOE_MID=1, default range");
    check_step(k20b, 100, 100, "workspace exactly the batch");
}

// With the decode-layout copies the decode path (1-8 tokens) reads them and gives the same bits; the
// other paths read the published blocks (9 tokens: unchanged too).
TEST(CudaMoeStep, decode_layout_copies_give_the_same_bits) {
    for (const Shape& s : {kTiny, k20b}) {
        const Experts& ex = experts_for(s, false);
        const uint32_t seed = fresh_seed();
        for (int t : {1, 5, 8, 9}) {
            SCOPED_TRACE(std::string(s.name) + ", " + std::to_string(t) + " tokens");
            const std::vector<bf16> h = random_bf16(size_t(t) * s.d_model, seed + t, -2.0f, 2.0f);
            const std::vector<float> logits = make_logits(s, t, Routing::random, seed + 100 + t);
            Layer fresh(s, ex);
            const std::vector<float> pub = run_step(fresh, h, logits, t, 16);
            fresh.add_decode_copies();
            const std::vector<float> dec = run_step(fresh, h, logits, t, 16);
            ASSERT_EQ(pub.size(), dec.size());
            EXPECT_EQ(0, std::memcmp(pub.data(), dec.data(), pub.size() * sizeof(float)));
            const Reference ref = reference(s, ex, h, logits, t);
            expect_within(dec, ref.out, ref.out_tol, s.d_model, "token", "MoeStep with decode copies vs the reference");
        }
    }
}

TEST(CudaMoeStep, environment_switches) {
    {
        EnvVar off("OSPREY_MOE_MID", "0");
        for (int t : {9, 128}) check_step(k20b, t, 128, "OSPREY_MOE_MID=0");
    }
    EnvVar on("OSPREY_MOE_MID", "1");
    {
        EnvVar lo("OSPREY_MOE_MID_MIN", "2"), hi("OSPREY_MOE_MID_MAX", "40");
        EnvVar decode_off("OSPREY_MOE_DECODE", "0");
        for (int t : {2, 40, 41}) check_step(k20b, t, 64, "mid range 2-40, decode off");
    }
    {
        EnvVar hi("OSPREY_MOE_MID_MAX", "256");  // a workspace for 256 tokens; group needs its scratch
        for (int t : {200, 256}) check_step(kTiny, t, 256, "mid range 9-256");
    }
}

}  // namespace
}  // namespace osprey::test
