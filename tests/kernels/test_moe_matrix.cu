// The MoE step with matrix experts on the GPU (route -> group -> moe_matrix: FP8 W8A8 and BF16) against
// the CPU references: every checked case of tests/kernels/cases/moe_matrix_cases.h (shared with
// bench/bench_moe_matrix.cu: tiny, 20b and 120b shapes, 1 to 8192 tokens, every variant, tile edges),
// plus the natural-order activation quantisation bit for bit, the variant choice and the argument checks.
#include <gtest/gtest.h>

#include "kernels/cases/gtest_cases.h"
#include "kernels/cases/moe_matrix_cases.h"
#include "kernels/cuda/moe_mlp_w4a8.h"

namespace osprey {
namespace {

using namespace cases::moe_matrix;

class MoeMatrixTable : public cases::CaseTest {};
TEST_P(MoeMatrixTable, matches_reference) { cases::check_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(cases, MoeMatrixTable, cases::checked(cases::moe_matrix::cases(), cases::moe_matrix::run),
                         cases::case_name);

// moe_w4a8_quantize in natural order (the W8A8 GEMM's B operand) against the CPU quantisation, bit for
// bit: one row, many, K of 64 (half a block), 192, 2880 (22.5 blocks), an all-zero block.
TEST(MoeMatrix, quantize_natural_order_matches_reference) {
    for (auto [n_rows, n] : std::vector<std::pair<int, int>>{{1, 64}, {3, 192}, {333, 2880}, {17, 128}}) {
        auto d_x = cases::device_uniform<bf16>(size_t(n_rows) * n, 91 + n, -3.f, 3.f);
        std::vector<bf16> x = d_x.download(size_t(n_rows) * n);
        for (int k = 0; k < std::min(n, 128); ++k) x[k] = float_to_bf16(0.0f);
        d_x.upload(x);
        const int nb = cpu::w4a8::n_blocks(n);
        auto d_q = cases::poisoned<uint8_t>(size_t(n_rows) * n);
        auto d_s = cases::poisoned<float>(size_t(n_rows) * nb);
        cuda::moe_w4a8_quantize(d_q.get(), d_s.get(), d_x.get(), n_rows, n, nullptr, /*mma_order=*/false);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<uint8_t> q = d_q.download(size_t(n_rows) * n);
        const std::vector<float> s = d_s.download(size_t(n_rows) * nb);
        std::vector<uint8_t> q_ref(q.size());
        std::vector<float> s_ref(s.size());
        cpu::w4a8::quantize_rows(q_ref, s_ref, cases::to_float(x), n_rows, n);
        EXPECT_EQ(q, q_ref) << n_rows << " x " << n;
        EXPECT_EQ(s, s_ref) << n_rows << " x " << n;
    }
}

TEST(MoeMatrix, variants_and_choice) {
    EXPECT_TRUE(cuda::moe_matrix_supports(2880, 2880));
    EXPECT_TRUE(cuda::moe_matrix_supports(128, 64));
    EXPECT_FALSE(cuda::moe_matrix_supports(100, 128));
    EXPECT_FALSE(cuda::moe_matrix_supports(128, 96));
    int fp8_variants = 0, bf16_variants = 0;
    for (int v = 0; v < cuda::moe_matrix_variants(); ++v) {
        const bool bf16 = cuda::moe_matrix_variant_takes(cuda::MatrixFormat::bf16, v);
        const bool fp8 = cuda::moe_matrix_variant_takes(cuda::MatrixFormat::fp8, v);
        EXPECT_TRUE(bf16 || fp8) << v;
        bf16_variants += bf16, fp8_variants += fp8;
    }
    EXPECT_GE(fp8_variants, 2);
    EXPECT_GE(bf16_variants, 4);
    // The automatic choice always takes a variant the format runs.
    for (auto f : {cuda::MatrixFormat::fp8, cuda::MatrixFormat::bf16})
        for (int n : {1, 64, 1024, 8192})
            for (int e : {8, 32, 128})
                EXPECT_TRUE(cuda::moe_matrix_variant_takes(f, cuda::moe_matrix_variant_for(f, n, 4, e))) << n << " " << e;
}

TEST(MoeMatrix, rejects_bad_arguments) {
    cuda::DeviceBuffer<int32_t> offsets(9), sorted(4);
    cuda::DeviceBuffer<bf16> x(128), u(128), bias(8 * 256);
    cuda::DeviceBuffer<float> y(512), scale(64);
    cuda::DeviceBuffer<uint8_t> w(8 * 256 * 128), ws(1 << 16);
    cuda::MoeMatrixArgs a{.y = y.get(), .u = u.get(), .x = x.get(), .format = cuda::MatrixFormat::fp8,
                          .mlp1 = {w.get(), scale.get(), bias.get()}, .mlp2 = {w.get(), scale.get(), bias.get()},
                          .expert_offsets = offsets.get(), .sorted_rows = sorted.get(), .workspace = ws.get(),
                          .n_tokens = 1, .n_experts = 8, .top_k = 4, .d_model = 100, .d_ff = 128};
    EXPECT_THROW(cuda::moe_matrix(a, nullptr), Error);  // d_model not a multiple of 64
    a.d_model = 128;
    a.mlp1.scale = nullptr;
    EXPECT_THROW(cuda::moe_matrix(a, nullptr), Error);  // FP8 without its multipliers
    a.mlp1.scale = scale.get();
    a.variant = 0;  // 256 x 128 tiles: main + partial accumulators do not fit
    EXPECT_THROW(cuda::moe_matrix(a, nullptr), Error);
    a.variant = cuda::moe_matrix_variants();
    EXPECT_THROW(cuda::moe_matrix(a, nullptr), Error);
}

}  // namespace
}  // namespace osprey
