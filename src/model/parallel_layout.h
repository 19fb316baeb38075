// A parallel layout (tensor, expert and data parallel degrees) and the piece of the model each rank
// holds. Pure arithmetic, shared by the backends that shard (model/parallel_runner.h on the CPU,
// later CUDA/NCCL), the commands' --tp/--ep/--dp flags and the benchmark reports.
//
// Ranks. A data-parallel group has G = max(tp, ep) ranks; the world has W = G · dp ranks (the GPUs a
// layout uses). Rank r belongs to DP group r / G and has index l = r % G inside it.
//   - Attention is tensor parallel over tp ranks: rank l computes KV heads
//     [(l % tp) · n_kv_heads / tp, ...) with their query heads (n_heads / n_kv_heads each) and sinks.
//     When ep > tp the group holds G / tp replicas of the attention TP group (replica l / tp), each
//     computing the same values: attention's width is bounded by the KV heads, the experts' by ep.
//   - The MoE is split over the ep ranks' worth of experts and, inside each expert shard, over
//     moe_tp = W / ep ranks by the expert intermediate dimension (d_ff) in whole 32-wide MXFP4 groups:
//     rank r holds experts [(r / moe_tp) · E / ep, ...) and intermediate columns of group share
//     r % moe_tp. Every rank sees every token of the step (TP-style dispatch); the partial outputs
//     are summed over all ranks of the MoE group (combine).
//   - The unembedding is split by vocabulary rows over the G ranks of a DP group.
//   - Data parallelism is over attention: each DP group has its own batch and KV cache; the MoE is
//     shared (its group is all W ranks, so moe_tp counts the ranks of every DP group), and before it
//     the groups' tokens are all-gathered over the ranks with the same index l in each group.
// Example: TP4·EP4 = 4 ranks, each with 2 of 8 KV heads (gpt-oss) and 8 of 32 experts whole.
//          TP8 = 8 ranks, each with 1 KV head and 1/8 of every expert's columns (90 groups of 32: 12 or 11).
#pragma once

#include <string>

#include "model/config.h"

namespace osprey::model {

struct ParallelLayout {
    int tp = 1, ep = 1, dp = 1;

    int group_size() const;  // ranks of one data-parallel group: max(tp, ep)
    int world() const;       // all ranks: group_size() · dp (the GPUs the layout uses)
    int moe_tp() const;      // ranks sharing one expert shard: world() / ep
    int n_gpus() const { return world(); }  // what a benchmark's cost is computed for
    bool single() const { return world() == 1; }
    std::string label() const;  // "TP1", "TP4 EP4", "TP2 EP2 DP2" (degrees above 1 only, TP always)

    // Throws osprey::Error naming the flag (--tp, --ep, --dp) when a degree is outside [1, 1024] or
    // tp and ep do not divide one another.
    void check() const;
    // check(), and that the model splits this way: n_kv_heads % tp, n_experts % ep.
    void check(const Config& config) const;
};

// Half-open range [first, first + count) of some unit (heads, experts, columns, vocabulary rows).
struct ShardRange {
    int first = 0, count = 0;
    int end() const { return first + count; }
};
// `total` units split over `parts`: the first total % parts parts get one more.
ShardRange split_range(int total, int parts, int part);

// What one rank computes.
struct ModelShard {
    ShardRange kv_heads;  // whole KV heads; query heads and sinks follow (heads)
    ShardRange heads;     // query heads
    ShardRange experts;
    ShardRange ff;          // expert intermediate columns (d_ff), multiples of 32; may be empty
    ShardRange vocab;       // unembedding rows
    bool out_bias = true;   // adds the attention out-projection bias (attention TP rank 0 only)
    bool down_bias = true;  // adds the experts' mlp2 bias (first rank of its expert shard only)

    static ModelShard whole(const Config& config);
    bool is_whole(const Config& config) const;
};

// Where rank `rank` of `layout` sits.
struct RankPlace {
    int dp_group = 0;      // r / G
    int group_rank = 0;    // l = r % G
    int tp_rank = 0;       // l % tp: attention heads
    int attn_replica = 0;  // l / tp
    int ep_rank = 0;       // r / moe_tp: expert shard
    int moe_tp_rank = 0;   // r % moe_tp: columns inside the expert shard
};
RankPlace rank_place(const ParallelLayout& layout, int rank);
ModelShard model_shard(const Config& config, const ParallelLayout& layout, int rank);

}  // namespace osprey::model
