// The per-kernel table of bench_forward --timeline: what each decode kernel's warps do at the kernel
// boundaries, from the stamps of kernels/cuda/timeline.cuh (a -DOSPREY_TIMELINE=ON build).
//
// A call is the records of one (tag, key) within one graph replay (a jump of more than 100 us between
// consecutive entries starts the next replay's call). Calls are ordered by their first wait; each is
// measured from the latest warp exit of the call before it (t = 0): its warps' first / median / last
// entry, first / last end of the PDL wait, median / last exit, in us. A kernel's row has the medians of
// those over its calls in the middle replays (the first and last replay's calls are left out: their
// neighbours are not all recorded).
#pragma once

#include <string>
#include <vector>

#include "kernels/cuda/timeline_rec.h"

namespace osprey::bench {

struct TimelineRow {
    std::string kernel;  // "gemv n_out 5120", "attention", "moe mlp1", ...
    int calls = 0;
    double ctas = 0, sms = 0;  // distinct blocks and SMs of a call (medians)
    double enter0 = 0, enter50 = 0, enter1 = 0, wait0 = 0, wait1 = 0, exit50 = 0, exit1 = 0;
    std::string after;  // the kernels it followed, with counts
};

std::vector<TimelineRow> summarize_timeline(const std::vector<cuda::TimelineRec>& recs, int n_replays);

}  // namespace osprey::bench
