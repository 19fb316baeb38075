// The whole MoE step on the GPU (route -> group -> mlp1 -> mlp2 -> combine) against the CPU reference
// kernels: every checked case of the MoE table (tests/kernels/cases/moe_mlp_cases.h, shared with
// bench/bench_moe.cu: tiny, 20b and 120b shapes, 1 to 8192 tokens, each tiling and the automatic
// choice, tile edges), plus the automatic choice's crossovers and the argument checks.
#include <gtest/gtest.h>

#include "kernels/cases/gtest_cases.h"
#include "kernels/cases/moe_mlp_cases.h"
#include "kernels/cpu/w4a8_matmul.h"
#include "kernels/cuda/moe_mlp_w4a8.h"

namespace osprey {
namespace {

using cuda::MoeKernel;
using namespace cases::moe_mlp;

class MoeMlpTable : public cases::CaseTest {};
TEST_P(MoeMlpTable, matches_reference) { cases::check_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(cases, MoeMlpTable, cases::checked(cases::moe_mlp::cases(), cases::moe_mlp::run),
                         cases::case_name);

TEST(MoeMlpTiles, automatic_choice) {
    EXPECT_EQ(cuda::moe_choose_kernel(1, 4, 32), MoeKernel::gemv);
    EXPECT_EQ(cuda::moe_choose_kernel(32, 4, 32), MoeKernel::gemv);      // 4 rows per expert
    EXPECT_EQ(cuda::moe_choose_kernel(33, 4, 32), MoeKernel::narrow);    // just above
    EXPECT_EQ(cuda::moe_choose_kernel(1024, 4, 32), MoeKernel::narrow);  // 128
    EXPECT_EQ(cuda::moe_choose_kernel(1025, 4, 32), MoeKernel::gemm);
    EXPECT_EQ(cuda::moe_choose_kernel(128, 4, 128), MoeKernel::gemv);    // 120b decode, batch 128
    EXPECT_EQ(cuda::moe_choose_kernel(1024, 4, 128), MoeKernel::narrow); // 120b, 1k prefill
    EXPECT_EQ(cuda::moe_choose_kernel(8192, 4, 32), MoeKernel::gemm);
}

TEST(MoeMlpErrors, rejects_bad_shapes) {
    Experts& ex = experts_for(kTiny, 0, 1);
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
                                    .d_model = 128, .top_k = 3},
                                   nullptr),
                 Error);
}

// moe_w4a8_quantize against the CPU reference, bit for bit (codes at their MMA positions, scales):
// one row, many, K of 64 (half a block), 192, 2880 (22.5 blocks), an all-zero block, large and tiny values.
TEST(MoeW4a8, quantize_matches_reference) {
    for (auto [n_rows, n] : std::vector<std::pair<int, int>>{{1, 64}, {3, 192}, {333, 2880}, {17, 128}}) {
        auto d_x = cases::device_uniform<bf16>(size_t(n_rows) * n, 77 + n, -3.f, 3.f);
        std::vector<bf16> x = d_x.download(size_t(n_rows) * n);
        for (int k = 0; k < std::min(n, 128); ++k) x[k] = float_to_bf16(0.0f);               // row 0, block 0: zeros
        if (n_rows > 1) x[size_t(n)] = float_to_bf16(3.0e4f), x[size_t(n) + 1] = float_to_bf16(1e-30f);  // row 1
        d_x.upload(x);
        const int nb = cpu::w4a8::n_blocks(n);
        auto d_q = cases::poisoned<uint8_t>(size_t(n_rows) * n);
        auto d_s = cases::poisoned<float>(size_t(n_rows) * nb);
        cuda::moe_w4a8_quantize(d_q.get(), d_s.get(), d_x.get(), n_rows, n, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<uint8_t> q = d_q.download(size_t(n_rows) * n);
        const std::vector<float> sc = d_s.download(size_t(n_rows) * nb);
        std::vector<float> xf(x.size());
        for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_float(x[i]);
        std::vector<uint8_t> q_ref(x.size());
        std::vector<float> s_ref(sc.size());
        cpu::w4a8::quantize_rows(q_ref, s_ref, xf, n_rows, n);
        int bad = 0;
        for (size_t i = 0; i < sc.size(); ++i)
            if (sc[i] != s_ref[i] && bad++ < 5) ADD_FAILURE() << "n " << n << " scale " << i << ": " << sc[i] << " vs " << s_ref[i];
        for (int r = 0; r < n_rows; ++r)
            for (int k = 0; k < n; ++k) {
                const uint8_t got = q[size_t(r) * n + cuda::moe_w4a8_position(k)], want = q_ref[size_t(r) * n + k];
                if (got != want && bad++ < 5)
                    ADD_FAILURE() << "n " << n << " row " << r << " k " << k << ": code " << int(got) << " vs " << int(want);
            }
        EXPECT_EQ(bad, 0) << "n " << n;
    }
}

TEST(MoeW4a8, supports_and_rejects) {
    EXPECT_TRUE(cuda::moe_w4a8_supports(2880, 2880));
    EXPECT_TRUE(cuda::moe_w4a8_supports(128, 128));
    EXPECT_FALSE(cuda::moe_w4a8_supports(100, 128));
    EXPECT_FALSE(cuda::moe_w4a8_supports(128, 96));
    for (int v = 0; v < cuda::moe_w4a8_variants(); ++v) EXPECT_TRUE(cuda::moe_w4a8_supports(2880, 2880, v)) << v;
    cuda::MoeW4a8Args a{.n_tokens = 1, .n_experts = 8, .d_model = 128, .d_ff = 128};
    EXPECT_THROW(cuda::moe_w4a8(a, nullptr), Error);  // null pointers
    a.d_model = 100;
    EXPECT_THROW(cuda::moe_w4a8(a, nullptr), Error);  // width
}

}  // namespace
}  // namespace osprey
