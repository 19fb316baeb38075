// Timing helper for the CUDA benchmarks: warm-up, then the median of many timed runs (CUDA events),
// each run on the next of several input sets so that the data read totals more than the 60 MB L2.
#pragma once

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "kernels/cuda/runtime.h"

namespace osprey::bench {

inline constexpr double kPeakGBps = 4300.0;    // measured device copy on our H200
inline constexpr double kPeakTflops = 790.0;   // measured bf16 dense GEMM on our H200

// Median microseconds of fn(i) over `iters` runs (i = run index, for rotating inputs).
inline double time_us(const std::function<void(int)>& fn, int iters = 50, int warmup = 5) {
    for (int i = 0; i < warmup; ++i) fn(i);
    CUDA_CHECK(cudaDeviceSynchronize());
    cuda::Event a, b;
    std::vector<double> us;
    for (int i = 0; i < iters; ++i) {
        a.record(nullptr);
        fn(i);
        b.record(nullptr);
        b.sync();
        us.push_back(1e3 * b.ms_since(a));
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
}

inline void report(const char* what, double us, double bytes, double flops) {
    const double gbps = bytes / (us * 1e3), tflops = flops / (us * 1e6);
    std::printf("%-48s %10.2f us %9.1f GB/s (%5.1f%%) %8.2f TFLOP/s (%5.1f%%)\n", what, us, gbps,
                100.0 * gbps / kPeakGBps, tflops, 100.0 * tflops / kPeakTflops);
}

}  // namespace osprey::bench
