// The matrix-expert MoE GEMMs (kernels/cuda/moe_mlp_matrix.h: FP8 W8A8 and BF16) at gpt-oss-20b (32
// experts) and 120b (128 experts) shapes in perf mode: mlp1 + mlp2 (FP8: with both activation
// quantisations) for 1, 8, 64, 1024 and 8192 tokens, the automatic variant and, from 1024 tokens, every
// variant the format takes; TFLOP/s against 1470 (FP8) / 790 (BF16) and GB/s against 4640. The cases
// test_moe_matrix checks (tests/kernels/cases/moe_matrix_cases.h).
//   usage: bench_moe_matrix [20b|120b|all] [flags of bench/kernel_bench.h]
#include <cstring>
#include <string>
#include <vector>

#include "bench/kernel_bench.h"
#include "kernels/cases/moe_matrix_cases.h"

int main(int argc, char** argv) {
    using namespace osprey;
    std::string which = "all";
    if (argc > 1 && (!std::strcmp(argv[1], "20b") || !std::strcmp(argv[1], "120b") || !std::strcmp(argv[1], "all"))) {
        which = argv[1];
        argv[1] = argv[0];
        --argc, ++argv;
    }
    std::vector<cases::moe_matrix::Case> table;
    for (const auto& c : cases::moe_matrix::cases())
        if (which == "all" || (which == "20b" && c.shape.n_experts == 32) || (which == "120b" && c.shape.n_experts == 128))
            table.push_back(c);
    return bench::main(argc, argv, "bench_moe_matrix", {{"moe_matrix", cases::entries(table, cases::moe_matrix::run)}});
}
