// Sink attention over the paged KV cache (kernels/cuda/attention.h) in perf mode over the attention
// table (tests/kernels/cases/attention_cases.h, the cases test_attention_cuda checks): gpt-oss's 64 query
// / 8 KV heads of dim 64, decode batches 1..128 at contexts 1k..131k (bytes: the K/V rows read), full
// and sliding layers, prefill chunks up to 32k tokens (FLOPs: 4 · heads · head_dim · causal pairs).
// Flags: bench/kernel_bench.h.
#include "bench/kernel_bench.h"
#include "kernels/cases/attention_cases.h"

int main(int argc, char** argv) {
    using namespace osprey;
    namespace t = cases::attention;
    return bench::main(argc, argv, "bench_attention", {{"attention", cases::entries(t::cases(), t::run)}});
}
