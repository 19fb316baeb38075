// CUDA embedding gather (kernels/cuda/embed.h): exact copy of bf16 rows into the f32 residual.
#include <gtest/gtest.h>

#include "kernels/cuda/embed.h"
#include "kernels/cuda_test_util.h"

namespace osprey {
namespace {

void run_case(int vocab, int d, int n_tokens) {
    const uint32_t seed = test::fresh_seed();
    const std::vector<bf16> table = test::random_bf16(size_t(vocab) * d, seed);
    std::mt19937 rng(seed);
    std::vector<int32_t> tokens(n_tokens);
    for (int32_t& t : tokens) t = int32_t(rng() % vocab);
    tokens.back() = vocab - 1;  // the last row of the table
    auto d_table = test::to_device(table);
    auto d_tokens = test::to_device(tokens);
    auto d_x = test::poisoned<float>(size_t(n_tokens) * d);
    cuda::embed({.x = d_x.get(), .table = d_table.get(), .tokens = d_tokens.get(), .n_tokens = n_tokens, .d_model = d},
                nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> want(size_t(n_tokens) * d);
    for (int t = 0; t < n_tokens; ++t)
        for (int c = 0; c < d; ++c) want[size_t(t) * d + c] = bf16_to_float(table[size_t(tokens[t]) * d + c]);
    test::expect_close(d_x.download(), want, 0.0, 0.0, "embed");  // a copy: exact
}

TEST(cuda_embed, small) { run_case(50, 8, 3); }
TEST(cuda_embed, gpt_oss_width) { run_case(1000, 2880, 77); }
TEST(cuda_embed, real_vocab) { run_case(201088, 64, 4); }  // every row reachable; narrow to stay fast
TEST(cuda_embed, rejects_width_not_multiple_of_8) {
    cuda::DeviceBuffer<float> x(12);
    cuda::DeviceBuffer<bf16> table(12);
    cuda::DeviceBuffer<int32_t> tok(1);
    EXPECT_THROW(
        cuda::embed({.x = x.get(), .table = table.get(), .tokens = tok.get(), .n_tokens = 1, .d_model = 12}, nullptr),
        Error);
}

}  // namespace
}  // namespace osprey
