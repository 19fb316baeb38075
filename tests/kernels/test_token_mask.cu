// Constrained decoding's mask on the device (kernels/cuda/token_mask.h): refused logits become -inf,
// allowed ones are untouched, rows without a mask are untouched; vocabularies that end mid-word, more
// words than one block's threads, and the real o200k_harmony vocabulary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/cuda/token_mask.h"
#include "kernels/cuda_test_util.h"

namespace osprey {
namespace {

void run_case(int n_rows, int vocab, int ld) {
    std::mt19937 rng(uint32_t(vocab + n_rows));
    std::vector<float> logits(size_t(n_rows) * ld);
    for (float& v : logits) v = float(int(rng() % 2000) - 1000) / 100.0f;
    const int words = (vocab + 31) / 32;
    std::vector<int32_t> rows;  // every other row is masked
    for (int r = 0; r < n_rows; r += 2) rows.push_back(r);
    std::vector<uint32_t> masks(rows.size() * words);
    for (auto& w : masks) w = rng() & rng();  // ~1/4 of the bits
    if (!masks.empty()) masks[0] = 0xFFFFFFFFu;   // a fully allowed word
    auto d_logits = test::to_device(logits);
    auto d_masks = test::to_device(masks);
    auto d_rows = test::to_device(rows);
    cuda::apply_token_mask({.logits = d_logits.get(), .ld = ld, .masks = d_masks.get(), .rows = d_rows.get(),
                            .n_masked = int(rows.size()), .vocab_size = vocab},
                           nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> got = d_logits.download();
    for (int r = 0; r < n_rows; ++r) {
        const auto m = std::find(rows.begin(), rows.end(), r);
        for (int t = 0; t < ld; ++t) {
            const float want_in = logits[size_t(r) * ld + t];
            const float g = got[size_t(r) * ld + t];
            bool allowed = true;
            if (m != rows.end() && t < vocab) {
                const uint32_t w = masks[size_t(m - rows.begin()) * words + t / 32];
                allowed = (w >> (t % 32)) & 1;
            }
            if (allowed) {
                ASSERT_EQ(g, want_in) << "row " << r << " token " << t;
            } else {
                ASSERT_TRUE(std::isinf(g) && g < 0) << "row " << r << " token " << t;
            }
        }
    }
}

TEST(token_mask_cuda, small_vocab_ending_mid_word) { run_case(3, 45, 45); }
TEST(token_mask_cuda, padded_rows) { run_case(4, 100, 128); }
TEST(token_mask_cuda, more_words_than_threads) { run_case(2, 256 * 32 + 7, 256 * 32 + 7); }
TEST(token_mask_cuda, o200k_vocab_batch) { run_case(9, 201088, 201088); }

}  // namespace
}  // namespace osprey
