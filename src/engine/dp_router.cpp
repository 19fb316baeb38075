// Routing between data-parallel groups (see dp_router.h).
#include "engine/dp_router.h"

#include "core/check.h"

namespace osprey::engine {

int pick_dp_group(std::span<const DpCandidate> groups) {
    OSPREY_CHECK(!groups.empty(), "pick_dp_group: no data-parallel group");
    size_t best = 0;
    for (size_t g = 1; g < groups.size(); ++g) {
        const DpCandidate &a = groups[g], &b = groups[best];
        if (a.hit_tokens > b.hit_tokens || (a.hit_tokens == b.hit_tokens && a.load_tokens < b.load_tokens)) best = g;
    }
    return int(best);
}

}  // namespace osprey::engine
