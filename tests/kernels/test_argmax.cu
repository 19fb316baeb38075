// CUDA greedy argmax (kernels/cuda/argmax.h): lowest index on ties, NaN never wins, rows split
// over kArgmaxChunks CTAs (row lengths below, at and above the chunking, and the real vocab).
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cuda/argmax.h"
#include "kernels/cuda_test_util.h"

namespace osprey {
namespace {

std::vector<int32_t> run(const std::vector<float>& logits, int n_rows, int n_cols) {
    auto d_logits = test::to_device(logits);
    auto d_out = test::poisoned<int32_t>(n_rows);
    cuda::DeviceBuffer<float> sv(size_t(n_rows) * cuda::kArgmaxChunks);
    cuda::DeviceBuffer<int32_t> si(size_t(n_rows) * cuda::kArgmaxChunks);
    cuda::argmax({.out = d_out.get(), .logits = d_logits.get(), .n_rows = n_rows, .n_cols = n_cols,
                  .scratch_val = sv.get(), .scratch_idx = si.get()},
                 nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    return d_out.download();
}

void run_case(int n_rows, int n_cols, bool ties, bool nans) {
    const uint32_t seed = test::fresh_seed();
    std::vector<float> logits = test::random_floats(size_t(n_rows) * n_cols, seed, -10.f, 10.f);
    std::mt19937 rng(seed);
    for (int r = 0; r < n_rows; ++r) {
        float* row = logits.data() + size_t(r) * n_cols;
        if (ties) {  // the max appears twice: the lower index must win
            const int a = int(rng() % n_cols), b = int(rng() % n_cols);
            row[a] = row[b] = 50.f;
        }
        if (nans) row[rng() % n_cols] = NAN;
    }
    const std::vector<int32_t> got = run(logits, n_rows, n_cols);
    for (int r = 0; r < n_rows; ++r) {
        const float* row = logits.data() + size_t(r) * n_cols;
        int best = -1;
        for (int c = 0; c < n_cols; ++c)
            if (!std::isnan(row[c]) && (best < 0 || row[c] > row[best])) best = c;
        EXPECT_EQ(got[r], best) << "row " << r;
    }
}

TEST(cuda_argmax, short_row) { run_case(3, 5, false, false); }
TEST(cuda_argmax, one_chunk_per_cta) { run_case(2, cuda::kArgmaxChunks, true, false); }
TEST(cuda_argmax, ties_lowest_index) { run_case(7, 1000, true, false); }
TEST(cuda_argmax, nan_never_wins) { run_case(4, 5000, false, true); }
TEST(cuda_argmax, real_vocab) { run_case(5, 201088, true, true); }
TEST(cuda_argmax, all_nan_row_is_minus_one) {
    const std::vector<float> logits(64, NAN);
    EXPECT_EQ(run(logits, 1, 64)[0], -1);
}

}  // namespace
}  // namespace osprey
