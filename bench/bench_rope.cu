// RoPE (kernels/cuda/rope.h) in perf mode over the rope table (tests/kernels/cases/rope_cases.h, the cases
// test_rope_cuda checks): 64 q + 8 k heads of gpt-oss, decode to prefill token counts. Flags:
// bench/kernel_bench.h.
#include "bench/kernel_bench.h"
#include "kernels/cases/rope_cases.h"

int main(int argc, char** argv) {
    using namespace osprey;
    namespace t = cases::rope;
    return bench::main(argc, argv, "bench_rope", {{"rope", cases::entries(t::cases(), t::run)}});
}
