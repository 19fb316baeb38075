// The GPU sampler (kernels/cuda/sampling.h) in perf mode over the sampling table
// (tests/kernels/cases/sampling_cases.h, the cases test_sampling_cuda checks): the real vocabulary
// (201088) for batches 1..128 and several parameter sets, the kernel alone (CUDA events) and the whole
// Sampler::sample call (wall clock).
//   usage: bench_sampling [iters] [flags of bench/kernel_bench.h]
#include "bench/kernel_bench.h"
#include "kernels/cases/sampling_cases.h"

int main(int argc, char** argv) {
    using namespace osprey;
    namespace t = cases::sampling;
    return bench::main(argc, argv, "bench_sampling", {{"sampling", cases::entries(t::cases(), t::run)}});
}
