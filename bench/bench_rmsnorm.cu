// RMSNorm (kernels/cuda/rmsnorm.h) in perf mode over the rmsnorm table (tests/kernels/cases/rmsnorm_cases.h,
// the cases test_rmsnorm_cuda checks): d = 2880 with the residual add fused, decode to prefill token
// counts, and the gathered final norm. Flags: bench/kernel_bench.h.
#include "bench/kernel_bench.h"
#include "kernels/cases/rmsnorm_cases.h"

int main(int argc, char** argv) {
    using namespace osprey;
    namespace t = cases::rmsnorm;
    return bench::main(argc, argv, "bench_rmsnorm", {{"rmsnorm", cases::entries(t::cases(), t::run)}});
}
