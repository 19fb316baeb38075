// The MoE step of the CUDA forward (spec §3.6) as a sequence of the MoE kernels' launches:
//   router logits (f32, from the forward's GEMM) -> top-4 + softmax -> group rows by expert
//   -> mlp1 (MXFP4, bias, clamped SwiGLU) -> mlp2 (MXFP4, bias) -> weighted combine into `moe`.
// Matrix experts (DeviceLayer::experts fp8 or bf16) take route -> group -> moe_matrix (mlp1 + mlp2 on
// wgmma, kernels/cuda/moe_mlp_matrix.h) for every batch size; the decode, mid-batch and W4A8 paths
// are MXFP4 kernels.
// Owns nothing: its buffers are carved from the runner's workspace for the largest batch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/bf16.h"
#include "kernels/cuda/runtime.h"
#include "model/config.h"
#include "model/cuda/device_weights.h"

namespace osprey::model {

// The MoE output as its per-slot parts: moe[t] = Σ_{k<top_k} w[t * top_k + k] · y[t * top_k + k, :]
// (summed by the next rmsnorm, moe_y / moe_w, or by moe_combine).
struct MoeOutputs {
    const float* y = nullptr;  // [T * top_k, d_model] f32, bias included
    const float* w = nullptr;  // [T * top_k] f32
};

// The experts a rank applies (expert parallelism, and tensor parallelism over the intermediate
// dimension): ids [first, first + count) of the router's n_experts, each with d_ff columns (this rank's
// share, padded with zero weights to whole tiles). The whole layer: {0, n_experts, d_ff}.
struct MoeExperts {
    int first = 0, count = 0, d_ff = 0;
    static MoeExperts whole(const Config& c) { return {0, c.n_experts, c.d_ff}; }
    bool is_whole(const Config& c) const { return first == 0 && count == c.n_experts && d_ff == c.d_ff; }
};

struct MoeStep {
    int32_t* expert_ids = nullptr;      // [T, top_k]
    float* expert_weights = nullptr;    // [T, top_k]
    int32_t* expert_offsets = nullptr;  // [n_experts + 1]
    int32_t* sorted_rows = nullptr;     // [T * top_k]
    int32_t* group_scratch = nullptr;   // [moe_group_scratch_elems(T, top_k, n_experts)]
    bf16* u = nullptr;                  // [T * top_k, d_ff]
    float* y = nullptr;                 // [T * top_k, d_model]
    void* decode_workspace = nullptr;   // moe_decode_workspace_bytes(): the decode path's
    void* mid_workspace = nullptr;      // moe_mid_workspace_bytes(mid_max_tokens): the mid-batch path's
    int mid_min_tokens = 1, mid_max_tokens = 0;  // run() takes the mid path for batches in this range
    void* w4a8_workspace = nullptr;     // moe_w4a8_workspace_bytes() when carved with w4a8
    WeightFormat experts = WeightFormat::mxfp4;  // the layers' expert format (carve's)
    void* matrix_workspace = nullptr;   // FP8 matrix experts: moe_matrix_workspace_bytes() (quantised x, u)

    // w4a8: also the quantised activations of the W4A8 path (kernels/cuda/moe_mlp_w4a8.h), which then
    // runs mlp1 + mlp2 of prefill-sized batches (moe_w4a8_wanted) in place of the W4A16 kernels.
    // experts: the weights' expert format; matrix experts (fp8, bf16) need neither the decode nor the
    // mid-batch workspace nor W4A8's, FP8 ones the W8A8 quantised activations.
    static size_t workspace_bytes(const Config& c, int max_tokens, bool w4a8 = false,
                                  WeightFormat experts = WeightFormat::mxfp4);
    static MoeStep carve(const Config& c, int max_tokens, cuda::Workspace& ws, bool w4a8 = false,
                         WeightFormat experts = WeightFormat::mxfp4);

    // The parts of moe[t, :] = Σ_{e in top4(router[t])} w_e · expert_e(h[t, :]) (see MoeOutputs; the
    // sum itself is fused into the consumer).
    // router: [T, n_experts] f32 logits with the bias already added; h: [T, d_model] bf16.
    // route -> group -> mlp1 -> mlp2; with use_decode_path (and up to kMoeDecodeMaxTokens tokens) the
    // two-launch decode path of kernels/cuda/moe_decode.h (routing inside the kernels).
    // On by default ($OSPREY_MOE_DECODE=0 turns it off): on the H200 (bench_moe_decode 20b, commit
    // after 0cd92cf) 37.2 against 45.1 us at 1 token, 61.3 against 64.2 at 2, level at 4-8; 20b decode
    // batch 1 432 against 404 tokens/s (docs/performance.md).
    // With $OSPREY_MOE_MID=1, from kMoeMidMinTokens (9) to kMoeMidMaxTokens (128) tokens (and when the
    // decode path is off or smaller) the two-launch mid-batch path of kernels/cuda/moe_mid.h, after
    // route and group. Off by default: its first version measured 3.5x slower than narrow on the H200
    // (992 against 284 us at 20b, 128 tokens; docs/performance.md); the restructured one (whole-chunk
    // copies) 353 us there, level with narrow up to 32 tokens and never faster than the automatic choice
    // (20b batch 16/64/128 end to end 2085/5857/10410 against 2613/7389/13189 tokens/s); $OSPREY_MOE_MID_MIN / $OSPREY_MOE_MID_MAX move the range (read
    // by workspace_bytes and carve; the workspace is sized for min(max_tokens, the range's top)).
    bool use_decode_path = true;  // see run(); carve() reads $OSPREY_MOE_DECODE
    bool use_w4a8 = false;        // carve(..., w4a8 = true): FP8 wgmma experts in prefill
    MoeOutputs run(const Config& c, const DeviceLayer& w, const bf16* h, const float* router, int n_tokens,
                   cudaStream_t stream) const;
    // A rank's share, the dense sum overwritten into `moe` [T, d_model] f32 (the runner all-reduces
    // it). Experts not whole: every token is routed over all experts, the rows routed to other ranks'
    // experts are left out of the groups, and their expert outputs count as zero, so `moe` is this
    // rank's partial sum. Never the decode path. Whole: run() above, then moe_combine.
    void run(const Config& c, const MoeExperts& experts, const DeviceLayer& w, const bf16* h, const float* router,
             float* moe, int n_tokens, cudaStream_t stream) const;

private:
    // route -> group -> mlp1 -> mlp2 over `experts` (both run()s' launches outside the decode path).
    MoeOutputs launch_experts(const Config& c, const MoeExperts& experts, const DeviceLayer& w, const bf16* h,
                              const float* router, int n_tokens, cudaStream_t stream) const;
};

}  // namespace osprey::model
