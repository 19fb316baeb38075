// The CUDA runner with the W4A8 MoE (CudaRunnerOptions::moe_w4a8, kernels/cuda/moe_mlp_w4a8.h) on the
// synthetic tiny checkpoint (8 experts, top-4): a 180-token prefill (90 routed rows per expert: the
// W4A8 path) compared step by step with the CPU reference running the same W4A8 arithmetic
// (CpuReferenceOptions::moe_w4a8), and its logits with the GPU's own W4A16 run.
//
// Bounds: as test_cuda_forward (BF16 GEMM inputs and K/V on the GPU against FP32 on the CPU: 3e-2 per
// step, 2e-2 per logit row), except the MoE output itself: the two sides quantise slightly different
// activations (BF16-rounded on the GPU), so some elements land one E4M3 step apart; bounded by twice
// the RMS of one E4M3 rounding (2 · 2^-4 / sqrt(3)). W4A8 against W4A16 on the GPU: the CPU measures
// 2.7e-3 on the logits of this model (docs/fp8.md); bound 2e-2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "kernels/cuda/moe_mlp_w4a8.h"
#include "model/cuda/gpt_oss_cuda.h"
#include "model/gpt_oss_ref.h"
#include "model/synthetic.h"
#include "model/test_reference_util.h"
#include "model/cuda_test_util.h"

namespace osprey::model {
namespace {

using test::rel_l2;
using test::tiny_weights;

CudaRunnerOptions gpu_options(bool w4a8) {
    return CudaRunnerOptions{.max_tokens = 1024, .max_logit_rows = 16, .max_slices = 16, .progress = false,
                             .graphs = false, .moe_w4a8 = w4a8};
}

using test::random_prompt;

using test::prefill_batch;

TEST(cuda_w4a8, prefill_steps_match_the_w4a8_reference) {
    test::CudaCpuPair p(tiny_weights(), {.moe_w4a8 = true}, gpu_options(true));
    test::expect_steps_match(p, prefill_batch(random_prompt(180, 5)), [](const std::string& name) {
        return name.rfind("moe@", 0) == 0 ? 2 * 0.0625 / std::sqrt(3.0) : 3e-2;
    });
    std::vector<float> lc, lg;
    p.cpu.logits_to_host(lc);
    p.gpu.logits_to_host(lg);
    ASSERT_EQ(lc.size(), lg.size());
    EXPECT_LT(rel_l2(lg, lc), 2e-2);
}

TEST(cuda_w4a8, logits_close_to_w4a16) {
    if (cuda::moe_w4a8_env()) GTEST_SKIP() << "$OSPREY_MOE_W4A8=1 turns W4A8 on in both runners";
    CudaRunner a(tiny_weights(), gpu_options(false)), w(tiny_weights(), gpu_options(true));
    a.allocate_kv(kv_layout_for(a, 16, 256, 8));
    w.allocate_kv(kv_layout_for(w, 16, 256, 8));
    const ForwardBatch b = prefill_batch(random_prompt(256, 9));  // 128 routed rows per expert
    a.forward(b);
    w.forward(b);
    std::vector<float> la, lw;
    a.logits_to_host(la);
    w.logits_to_host(lw);
    ASSERT_EQ(la.size(), lw.size());
    const double err = rel_l2(lw, la);
    std::printf("  W4A8 vs W4A16 logits: rel err %.2e\n", err);
    EXPECT_GT(err, 0.0);  // the W4A8 path really ran
    EXPECT_LT(err, 2e-2);
}

}  // namespace
}  // namespace osprey::model
