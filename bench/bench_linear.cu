// Dense linears (kernels/cuda/linear.h: cuBLASLt and our GEMV) in perf mode over the linear table
// (tests/kernels/cases/linear_cases.h, the cases test_linear checks): qkv, out (+ residual), router,
// unembedding at decode and prefill token counts, weights rotated beyond the L2. Flags: bench/kernel_bench.h.
#include "bench/kernel_bench.h"
#include "kernels/cases/linear_cases.h"

int main(int argc, char** argv) {
    using namespace osprey;
    namespace t = cases::linear;
    return bench::main(argc, argv, "bench_linear", {{"linear", cases::entries(t::cases(), t::run)}});
}
