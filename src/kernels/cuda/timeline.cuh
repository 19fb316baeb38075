// Per-warp timestamps of the decode step's kernels, for finding where a layer's time goes between
// kernels (launch, landing, the PDL wait, the tail), which a per-kernel trace cannot show.
//
// Off unless the build defines OSPREY_TIMELINE (cmake -DOSPREY_TIMELINE=ON): then the macros compile
// to nothing. With it, lane 0 of every warp of an instrumented kernel writes one record when the warp
// leaves: its entry, the end of its PDL wait (the entry where it has none) and its exit, read from
// %globaltimer, plus %smid, the block, a tag naming the kernel and a key telling its calls apart (a
// weight pointer: one per layer). `bench_forward --timeline` replays the decode graph and prints, per
// kernel, when its warps land, pass their wait and leave, measured from the previous kernel's last exit.
//
// Each .cu file that includes this header with OSPREY_TIMELINE gets its own record buffer (no
// relocatable device code), registered at static-initialisation time; timeline_collect_all() reads
// and clears every buffer.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cuda/timeline_rec.h"

namespace osprey::cuda {

using TimelineCollect = void (*)(std::vector<TimelineRec>&);
inline std::vector<TimelineCollect>& timeline_registry() {
    static std::vector<TimelineCollect> r;
    return r;
}
// Appends every buffer's records to `out` and clears the buffers (empty without OSPREY_TIMELINE).
inline void timeline_collect_all(std::vector<TimelineRec>& out) {
    for (TimelineCollect f : timeline_registry()) f(out);
}

}  // namespace osprey::cuda

#if defined(OSPREY_TIMELINE) && defined(__CUDACC__) && !defined(OSPREY_CUDA_EMULATION)
namespace osprey::cuda::tl {
constexpr unsigned kMaxRecs = 1u << 19;
static __device__ TimelineRec g_recs[kMaxRecs];
static __device__ unsigned g_n;
__device__ __forceinline__ unsigned long long now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void record(unsigned long long t0, unsigned long long t1, const void* key, uint32_t tag) {
    if (threadIdx.x % 32 != 0) return;
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    const unsigned i = atomicAdd(&g_n, 1u);
    if (i < kMaxRecs)
        g_recs[i] = TimelineRec{t0, t1, now(), key, tag, blockIdx.x + blockIdx.y * gridDim.x, smid, threadIdx.x / 32};
}
static void collect(std::vector<TimelineRec>& out) {
    unsigned n = 0;
    cudaMemcpyFromSymbol(&n, g_n, sizeof n);
    n = std::min(n, kMaxRecs);
    const size_t at = out.size();
    out.resize(at + n);
    if (n > 0) cudaMemcpyFromSymbol(out.data() + at, g_recs, n * sizeof(TimelineRec));
    const unsigned zero = 0;
    cudaMemcpyToSymbol(g_n, &zero, sizeof zero);
}
[[maybe_unused]] static const bool g_registered = (timeline_registry().push_back(&collect), true);
}  // namespace osprey::cuda::tl
#define OSPREY_TL_ENTER() \
    unsigned long long osprey_tl_t0 = ::osprey::cuda::tl::now(), osprey_tl_t1 = osprey_tl_t0
#define OSPREY_TL_WAITED() (osprey_tl_t1 = ::osprey::cuda::tl::now())
#define OSPREY_TL_EXIT(key, tag) ::osprey::cuda::tl::record(osprey_tl_t0, osprey_tl_t1, (key), (tag))
#else
#define OSPREY_TL_ENTER() (void)0
#define OSPREY_TL_WAITED() (void)0
#define OSPREY_TL_EXIT(key, tag) (void)0
#endif
