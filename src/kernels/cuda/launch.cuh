// Kernel launches with programmatic dependent launch (PDL, Hopper): a kernel may start launching
// while the kernel before it in the stream is still finishing, so the ~1 µs of launch latency and
// block ramp-up between consecutive kernels overlaps the previous kernel's tail. A decode step is
// hundreds of short kernels, where those gaps add up (bench_forward --trace shows them).
//
// The contract, for every kernel launched through launch():
//   - its first statement is pdl_enter(), executed by every block before any early return and
//     before any global memory access (reads of the previous kernels' outputs AND writes to buffers
//     they may still read). pdl_enter() waits until every kernel before this one has completed and
//     its writes are visible. Since every kernel waits before it finishes, the chain stays
//     transitive: when kernel N passes its wait, all kernels before N-1 are complete too.
//   - the dependent kernel may launch when every block of this one has called pdl_trigger() or
//     exited. Measured on the H200 (20b decode, batch 1): triggering at the top of every kernel made
//     the step slower (2.85 ms against 2.72 ms without PDL: the next kernels' waiting blocks crowd
//     the SMs), so pdl_enter() does not trigger. Small kernels whose successor prefetches its weights
//     before waiting (rmsnorm before the GEMVs) call pdl_trigger() first. Triggering at the tail
//     (each GEMV block after its last weight loads, mlp2's producer after its last copy) was slower
//     too: 411.9 against 468.8 tokens/s at batch 1, 1282 against 1623 at batch 8 (20b, 1k context,
//     2026-12-01): the waiting blocks of the next kernel still hold SM slots the tail needs.
//   - a kernel may read constant data (weights) before pdl_enter(), never data a kernel writes.
//   - kernels launched any other way (cuBLASLt, the <<<>>> syntax) get the ordinary full dependency.
// $OSPREY_PDL=0 launches without the attribute (pdl_enter() then returns at once): for A/B timing.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/runtime.h"

namespace osprey::cuda {

__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

bool pdl_enabled();  // false when $OSPREY_PDL is "0" (read once)

// kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute (see above).
template <typename... KernelArgs, typename... Args>
void launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl_enabled() ? 1 : 0;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace osprey::cuda
