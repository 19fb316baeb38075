// Which data-parallel group a new request goes to (attention DP: every group has its own batch and
// KV cache, docs/architecture.md "Parallelism"). The engine asks each group's cache how much of the
// prompt it holds and each group's scheduler how loaded it is; the request then stays in that group
// (its samples fork there, a preemption recomputes there). Pure policy: tests/engine/test_dp_router.cpp.
#pragma once

#include <cstdint>
#include <span>

namespace osprey::engine {

struct DpCandidate {
    int hit_tokens = 0;       // prompt tokens the group's prefix cache holds (KvCacheManager::prefix_hit_tokens)
    int64_t load_tokens = 0;  // tokens of the group's live sequences, running and waiting (Scheduler::load_tokens)
};

// The group with the longest prefix hit; among equal hits the least loaded; then the lowest index.
// A prefix hit saves its compute and its pages, so it outweighs load (a miss elsewhere would store
// the prefix twice); load decides the rest, which spreads unrelated requests over the groups.
int pick_dp_group(std::span<const DpCandidate> groups);

}  // namespace osprey::engine
