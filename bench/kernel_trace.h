// Kernel timeline of a stretch of GPU work, through CUPTI's activity API (concurrent-kernel records):
// every kernel's start and end as the GPU ran it, CUDA-graph replays included, without serialising
// or replaying anything (unlike a profiler that times kernels one by one). For bench_forward's
// per-kernel table of a decode step inside the graph. Benchmark code only: the product never links CUPTI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace osprey::bench {

struct TracedKernel {
    std::string name;  // demangled, template and argument lists dropped
    uint64_t start_ns = 0, end_ns = 0;
};

// One per process. start() enables kernel records, stop() synchronises the device, flushes CUPTI's
// buffers and returns the kernels that ran in between, in start order.
class KernelTrace {
public:
    KernelTrace();
    void start();
    std::vector<TracedKernel> stop();
};

// Per kernel name over `n_steps` equal steps: calls per step, GPU time per step, and the step's
// span (first start to last end) and busy time (union of kernel intervals), all in µs.
struct KernelTraceRow {
    std::string name;
    double calls_per_step = 0, us_per_step = 0;
    double busy_us_per_step = 0;  // what its calls add to the busy time (past every earlier-started kernel's end)
};
struct KernelTraceSummary {
    std::vector<KernelTraceRow> rows;  // by GPU time, largest first
    double span_us_per_step = 0, busy_us_per_step = 0, kernels_per_step = 0;
};
KernelTraceSummary summarize_trace(const std::vector<TracedKernel>& kernels, int n_steps);

}  // namespace osprey::bench
