// Groups the routed rows of a ragged batch by expert (counting sort, deterministic). A routed row
// is r = t * top_k + slot: token t's slot-th expert. After this step the rows of expert e are
// sorted_rows[expert_offsets[e] .. expert_offsets[e + 1]), in increasing r. The expert GEMMs
// (moe_mlp_mxfp4.h) read their work from these two arrays. Reference: a stable sort by expert id
// (tests/kernels/test_moe_group.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace osprey::cuda {

struct MoeGroupArgs {
    int32_t* expert_offsets = nullptr;    // [n_experts + 1] exclusive prefix sum of rows per expert
    int32_t* sorted_rows = nullptr;       // [n_tokens * top_k] routed rows, by expert then by r
    int32_t* scratch = nullptr;           // [moe_group_scratch_elems(n_tokens, top_k, n_experts)] device
    const int32_t* expert_ids = nullptr;  // [n_tokens, top_k] from moe_route_topk, each in [0, n_experts)
                                          // (a row with an id out of range is left out of every group)
    int n_tokens = 0;                     // any size, 0 is a no-op
    int n_experts = 0;                    // 1..kMoeMaxExperts
    // Expert parallelism: this rank's experts are ids [first_expert, first_expert + n_experts), grouped
    // as 0..n_experts-1; the rows routed to other ranks' experts are left out.
    int first_expert = 0;
    int top_k = 4;
};

// Elements of int32 device scratch moe_group_by_expert needs (0 for batches of at most 256 tokens).
size_t moe_group_scratch_elems(int n_tokens, int top_k, int n_experts);

// One launch for up to 1024 routed rows, three for more.
void moe_group_by_expert(const MoeGroupArgs& a, cudaStream_t stream);

}  // namespace osprey::cuda
