// The MoE step of the CUDA forward (spec §3.6) as a sequence of the MoE kernels' launches:
//   router logits (f32, from the forward's GEMM) -> top-4 + softmax -> group rows by expert
//   -> mlp1 (MXFP4, bias, clamped SwiGLU) -> mlp2 (MXFP4, bias) -> weighted combine into `moe`.
// Owns nothing: its buffers are carved from the runner's workspace for the largest batch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/bf16.h"
#include "kernels/cuda/runtime.h"
#include "model/config.h"
#include "model/cuda/device_weights.h"

namespace osprey::model {

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
    void* decode_workspace = nullptr;   // moe_decode_workspace_bytes(): the decode path's (zeroed once)
    bool use_decode_path = false;       // see run(); carve() sets it from $OSPREY_MOE_DECODE

    static size_t workspace_bytes(const Config& c, int max_tokens);
    static MoeStep carve(const Config& c, int max_tokens, cuda::Workspace& ws);

    // moe[t, :] = Σ_{e in top4(router[t])} w_e · expert_e(h[t, :])     [T, d_model] f32 (overwritten)
    // router: [T, n_experts] f32 logits with the bias already added; h: [T, d_model] bf16.
    // route -> group -> mlp1 -> mlp2 -> combine; with use_decode_path (and up to kMoeDecodeMaxTokens
    // tokens) the two-launch decode path of kernels/cuda/moe_decode.h (routing inside the kernels).
    // Off by default: on the H200 it measured slower than the five launches (20b batch 1, inside the
    // decode graph: 1266 against 1096 us per step; bench_moe_decode 0.91-0.96x) although it is correct
    // (test_moe_decode); $OSPREY_MOE_DECODE=1 turns it on for measurement.
    //
    // A rank's share (experts not whole): every token is routed over all experts, the rows routed to
    // other ranks' experts are left out of the groups, and their expert outputs count as zero, so
    // `moe` is this rank's partial sum (the runner all-reduces it). Never the decode path.
    void run(const Config& c, const DeviceLayer& w, const bf16* h, const float* router, float* moe, int n_tokens,
             cudaStream_t stream) const;
    void run(const Config& c, const MoeExperts& experts, const DeviceLayer& w, const bf16* h, const float* router,
             float* moe, int n_tokens, cudaStream_t stream) const;
};

}  // namespace osprey::model
