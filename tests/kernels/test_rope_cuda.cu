// CUDA RoPE (kernels/cuda/rope.h) against the CPU reference (kernels/cpu/rope.h) with gpt-oss's
// YaRN table (model/rope.h), on q and k heads of the fused qkv row; v must stay untouched.
#include <gtest/gtest.h>

#include "kernels/cpu/rope.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda_test_util.h"
#include "model/rope.h"

namespace osprey {
namespace {

void run_case(int n_tokens, int n_q, int n_kv, int max_pos) {
    const uint32_t seed = test::fresh_seed();
    constexpr int kHeadDim = 64;
    model::Config cfg;
    model::RopeTable table(cfg, max_pos);
    const int ld = (n_q + 2 * n_kv) * kHeadDim;
    const std::vector<bf16> qkv = test::random_bf16(size_t(n_tokens) * ld, seed);
    std::mt19937 rng(seed);
    std::vector<int32_t> pos(n_tokens);
    for (int32_t& p : pos) p = int32_t(rng() % max_pos);
    pos[0] = max_pos - 1;

    // Reference: rotate the q and k heads (as floats of the same bf16 values).
    std::vector<float> qk(size_t(n_tokens) * (n_q + n_kv) * kHeadDim);
    for (int t = 0; t < n_tokens; ++t)
        for (int i = 0; i < (n_q + n_kv) * kHeadDim; ++i)
            qk[size_t(t) * (n_q + n_kv) * kHeadDim + i] = bf16_to_float(qkv[size_t(t) * ld + i]);
    cpu::rope(qk, pos, n_q + n_kv, kHeadDim, table.cos(), table.sin());

    auto d_qkv = test::to_device(qkv);
    auto d_pos = test::to_device(pos);
    auto d_cos = test::to_device(std::vector<float>(table.cos().begin(), table.cos().end()));
    auto d_sin = test::to_device(std::vector<float>(table.sin().begin(), table.sin().end()));
    cuda::rope({.qkv = d_qkv.get(), .positions = d_pos.get(), .cos = d_cos.get(), .sin = d_sin.get(),
                .n_tokens = n_tokens, .ld = ld, .n_q_heads = n_q, .n_kv_heads = n_kv, .head_dim = kHeadDim},
               nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<bf16> out = d_qkv.download();
    std::vector<float> got_qk(qk.size()), got_v, want_v;
    for (int t = 0; t < n_tokens; ++t) {
        for (int i = 0; i < (n_q + n_kv) * kHeadDim; ++i)
            got_qk[size_t(t) * (n_q + n_kv) * kHeadDim + i] = bf16_to_float(out[size_t(t) * ld + i]);
        for (int i = (n_q + n_kv) * kHeadDim; i < ld; ++i) {
            got_v.push_back(bf16_to_float(out[size_t(t) * ld + i]));
            want_v.push_back(bf16_to_float(qkv[size_t(t) * ld + i]));
        }
    }
    // Inputs |x| <= 1 times a table entry <= 1.35 (the YaRN concentration): outputs up to ~2.7,
    // rounded once to bf16 (half an ulp at 2..4 is 2^-7); f32 products are otherwise identical.
    test::expect_close(got_qk, test::to_double(qk), 1.0 / 128, 0.0, "rope q/k");
    test::expect_close(got_v, test::to_double(want_v), 0.0, 0.0, "rope leaves v alone");
}

TEST(cuda_rope, one_token) { run_case(1, 64, 8, 16); }
TEST(cuda_rope, fewer_pairs_than_threads) { run_case(3, 2, 1, 100); }
TEST(cuda_rope, gpt_oss_prefill) { run_case(300, 64, 8, 4096); }
TEST(cuda_rope, long_positions) { run_case(17, 64, 8, 131072); }
TEST(cuda_rope, rejects_short_row) {
    cuda::DeviceBuffer<bf16> qkv(64);
    cuda::DeviceBuffer<int32_t> pos(1);
    cuda::DeviceBuffer<float> cs(32);
    EXPECT_THROW(cuda::rope({.qkv = qkv.get(), .positions = pos.get(), .cos = cs.get(), .sin = cs.get(), .n_tokens = 1,
                             .ld = 64, .n_q_heads = 1, .n_kv_heads = 1, .head_dim = 64},
                            nullptr),
                 Error);
}

}  // namespace
}  // namespace osprey
