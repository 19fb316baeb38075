// Shared-memory mbarriers for Hopper pipelines (PTX, sm_90): the decode MoE's bulk-copy ring
// (moe_decode.cu) and the wgmma MoE GEMM's producer/consumer stages (moe_mlp_wgmma.cu) use these.
// Their CPU emulations (tests/kernels/emu) provide the same names; the kernels' extracted device code
// never includes this header there.
#pragma once

#include <cstdint>

namespace osprey::cuda {

using mbar_t = uint64_t;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(mbar_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (bulk-copy completions).
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(mbar_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(mbar_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Returns once the phase of `bar` with this parity has completed.
__device__ __forceinline__ void mbar_wait(mbar_t* bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}

// mbar_wait with a suspend-time hint: a thread whose phase is not complete is suspended in hardware
// until it completes (or the hint, in ns, runs out) instead of looping on try_wait, so that waiting
// warps take fewer issue slots from the working ones (moe_decode: ncu counted ~10% of its issued
// instructions in the spin loops). Same semantics as mbar_wait.
__device__ __forceinline__ void mbar_wait_sleep(mbar_t* bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(smem_u32(bar)),
        "r"(parity), "r"(0x989680u)
        : "memory");
}

}  // namespace osprey::cuda
