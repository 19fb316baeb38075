// Parallel layouts and model shards (see parallel_layout.h).
#include "model/parallel_layout.h"

#include <algorithm>

#include "core/check.h"

namespace osprey::model {

int ParallelLayout::group_size() const {
    return std::max(tp, ep);
}
int ParallelLayout::world() const {
    return group_size() * dp;
}
int ParallelLayout::moe_tp() const {
    return world() / ep;
}

std::string ParallelLayout::label() const {
    std::string s = "TP" + std::to_string(tp);
    if (ep > 1) s += " EP" + std::to_string(ep);
    if (dp > 1) s += " DP" + std::to_string(dp);
    return s;
}

void ParallelLayout::check() const {
    const std::pair<const char*, int> degrees[] = {{"--tp", tp}, {"--ep", ep}, {"--dp", dp}};
    for (const auto& [flag, v] : degrees) OSPREY_CHECK(v >= 1 && v <= 1024, flag, " must be in [1, 1024], got ", v);
    OSPREY_CHECK(tp % ep == 0 || ep % tp == 0, "--tp ", tp, " and --ep ", ep,
                 " must divide one another (expert parallelism uses the tensor-parallel group's ranks)");
    OSPREY_CHECK(world() <= 1024, "layout ", label(), " needs ", world(), " ranks, more than 1024");
}

void ParallelLayout::check(const Config& c) const {
    check();
    OSPREY_CHECK(c.n_kv_heads % tp == 0, "--tp ", tp, ": the model's ", c.n_kv_heads,
                 " KV heads do not split into whole heads per rank (tensor parallelism up to ", c.n_kv_heads, ")");
    OSPREY_CHECK(c.n_experts % ep == 0, "--ep ", ep, ": the model's ", c.n_experts,
                 " experts do not split evenly over the ranks");
}

ShardRange split_range(int total, int parts, int part) {
    const int q = total / parts, rem = total % parts;
    return {part * q + std::min(part, rem), q + (part < rem ? 1 : 0)};
}

ModelShard ModelShard::whole(const Config& c) {
    ModelShard s;
    s.kv_heads = {0, c.n_kv_heads};
    s.heads = {0, c.n_heads};
    s.experts = {0, c.n_experts};
    s.ff = {0, c.d_ff};
    s.vocab = {0, c.vocab_size};
    return s;
}

bool ModelShard::is_whole(const Config& c) const {
    return heads.count == c.n_heads && experts.count == c.n_experts && ff.count == c.d_ff &&
           vocab.count == c.vocab_size && out_bias && down_bias;
}

RankPlace rank_place(const ParallelLayout& layout, int rank) {
    OSPREY_CHECK(rank >= 0 && rank < layout.world(), "rank ", rank, " outside [0, ", layout.world(), ")");
    RankPlace p;
    const int G = layout.group_size(), moe_tp = layout.moe_tp();
    p.dp_group = rank / G;
    p.group_rank = rank % G;
    p.tp_rank = p.group_rank % layout.tp;
    p.attn_replica = p.group_rank / layout.tp;
    p.ep_rank = rank / moe_tp;
    p.moe_tp_rank = rank % moe_tp;
    return p;
}

ModelShard model_shard(const Config& c, const ParallelLayout& layout, int rank) {
    layout.check(c);
    const RankPlace p = rank_place(layout, rank);
    ModelShard s;
    const int kv_per_rank = c.n_kv_heads / layout.tp;
    s.kv_heads = {p.tp_rank * kv_per_rank, kv_per_rank};
    s.heads = {s.kv_heads.first * c.group(), s.kv_heads.count * c.group()};
    const int experts_per_rank = c.n_experts / layout.ep;
    s.experts = {p.ep_rank * experts_per_rank, experts_per_rank};
    // Whole MXFP4 groups: mlp2's input dimension is blocked by 32, and mlp1's gate/up rows come in
    // interleaved pairs (2j, 2j + 1) per column j, so a column range keeps both halves together.
    const ShardRange groups = split_range(c.d_ff / 32, layout.moe_tp(), p.moe_tp_rank);
    s.ff = {groups.first * 32, groups.count * 32};
    s.vocab = split_range(c.vocab_size, layout.group_size(), p.group_rank);
    s.out_bias = p.tp_rank == 0;
    s.down_bias = p.moe_tp_rank == 0;
    return s;
}

}  // namespace osprey::model
