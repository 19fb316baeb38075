// One warp's stamps in a decode kernel (kernels/cuda/timeline.cuh records them in a
// -DOSPREY_TIMELINE=ON build; bench/timeline_summary.h reads them). No CUDA here, so that the summary
// and its test build without the toolkit.
#pragma once

#include <cstdint>

namespace osprey::cuda {

struct TimelineRec {
    unsigned long long enter, wait, exit;  // ns, %globaltimer: entry, end of the PDL wait (or entry), exit
    const void* key;                       // tells the calls of one kernel apart (a weight pointer)
    uint32_t tag, block, smid, warp;       // tag: TimelineTag, GEMVs with n_out << 8
};

enum TimelineTag : uint32_t { kTlGemv = 1, kTlAttention = 2, kTlMoeMlp1 = 3, kTlMoeMlp2 = 4 };

}  // namespace osprey::cuda
