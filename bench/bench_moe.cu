// The MoE step at gpt-oss-20b (32 experts) and 120b (128 experts) shapes in perf mode: the MoE table
// (tests/kernels/cases/moe_mlp_cases.h: mlp1 and mlp2 of each tiling, then route, group, combine and the
// whole step with the automatic choice, for 1..8192 tokens), then the routing and grouping tables
// (moe_route_cases.h, moe_group_cases.h). The same cases test_moe_mlp, test_moe_route and test_moe_group
// check.
//   usage: bench_moe [20b|120b|all] [flags of bench/kernel_bench.h]
#include <cstring>
#include <string>
#include <vector>

#include "bench/kernel_bench.h"
#include "kernels/cases/moe_group_cases.h"
#include "kernels/cases/moe_mlp_cases.h"
#include "kernels/cases/moe_route_cases.h"

int main(int argc, char** argv) {
    using namespace osprey;
    // The model filter of the bench before the tables: its first argument, when it is one.
    std::string which = "all";
    if (argc > 1 && (!std::strcmp(argv[1], "20b") || !std::strcmp(argv[1], "120b") || !std::strcmp(argv[1], "all"))) {
        which = argv[1];
        argv[1] = argv[0];
        --argc, ++argv;
    }
    auto wanted = [&](int n_experts) {
        return which == "all" || (which == "20b" && n_experts == 32) || (which == "120b" && n_experts == 128);
    };
    std::vector<cases::moe_mlp::Case> mlp;
    for (const auto& c : cases::moe_mlp::cases())
        if (wanted(c.shape.n_experts)) mlp.push_back(c);
    std::vector<cases::moe_route::Case> route;
    for (const auto& c : cases::moe_route::cases())
        if (wanted(c.n_experts)) route.push_back(c);
    std::vector<cases::moe_group::Case> group;
    for (const auto& c : cases::moe_group::cases())
        if (wanted(c.n_experts)) group.push_back(c);
    return bench::main(argc, argv, "bench_moe",
                       {{"moe_mlp", cases::entries(mlp, cases::moe_mlp::run)},
                        {"moe_route", cases::entries(route, cases::moe_route::run)},
                        {"moe_group", cases::entries(group, cases::moe_group::run)}});
}
