// What kernels/cuda/moe_mlp_w4a8.cu needs beyond moe_wgmma_emulation.h, for running its device code on
// the CPU (scripts/emulate_moe_w4a8.sh):
//   - wgmma.mma_async m64nNk32 e4m3 x e4m3 -> f32 (A from registers, or from shared memory (the SS form of
//     moe_mlp_matrix.cu), B through a K-major 128B-swizzle descriptor, scale-d 0 or 1), recorded into moe_wgmma_emulation.h's lazy queue with e4m3 = true
//     and executed at wait_group from the PTX fragment layouts;
//   - cp.async of 4 bytes (zero-fill) as an immediate copy; 32-bit shared loads;
//   - cvt.rn.satfinite.e4m3x2.f32 as fp8::float_to_e4m3 (round to nearest even, saturating), rintf;
//   - blockDim (the quantisation kernel is an ordinary grid of warps).
#pragma once

#include <cmath>

#include "core/fp8.h"
#include "moe_wgmma_emulation.h"

inline dim3 blockDim;
struct float2 {
    float x, y;
};
struct uint2 {
    uint32_t x, y;
};

namespace osprey::cuda {

template <int N>
void wgmma_e4m3(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256);
    g_wgmma[threadIdx.x].ops.push_back({d, a, desc, N, 0, true, scale_d != 0});
}
// The SS form (kernels/cuda/moe_mlp_matrix.cu): A from shared memory through desc_a, as B.
template <int N>
void wgmma_m64nNk32_e4m3_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256);
    g_wgmma[threadIdx.x].ops.push_back({d, nullptr, desc_b, N, desc_a, true, scale_d != 0});
}
// d = a · b (scale-d 0 with d an output only on the GPU; the same operation here).
template <int N>
void wgmma_m64nNk32_e4m3_ss_set(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b) {
    wgmma_m64nNk32_e4m3_ss<N>(d, desc_a, desc_b, 0);
}
inline void cp_async4_zfill(void* dst, const void* src, bool valid) {
    if (reinterpret_cast<uintptr_t>(dst) % 4 || (valid && reinterpret_cast<uintptr_t>(src) % 4)) {
        std::fprintf(stderr, "cp.async 4: misaligned\n");
        std::abort();
    }
    if (valid) std::memcpy(dst, src, 4);
    else std::memset(dst, 0, 4);
}
inline uint32_t ld_shared32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t sel) { return __byte_perm(lo, hi, sel); }
inline float round_even(float x) { return std::nearbyint(x); }
inline uint32_t e4m3x4(float a, float b, float c, float d) {
    return uint32_t(fp8::float_to_e4m3(a)) | uint32_t(fp8::float_to_e4m3(b)) << 8 |
           uint32_t(fp8::float_to_e4m3(c)) << 16 | uint32_t(fp8::float_to_e4m3(d)) << 24;
}

// The activation quantisation (moe_mlp_w4a8.cu's quantize_kernel, passed as `kernel`: a callable taking
// its arguments) over n_rows rows of n BF16 values: q [n_rows, n] codes and s [n_rows, ceil(n / 128)]
// scales, both poisoned first; its grid of 256-thread CTAs (32 threads per 128-value block) run one by one.
template <class Kernel>
void emu_quantize_rows(Kernel&& kernel, std::vector<uint8_t>& q, std::vector<float>& s, const std::vector<bf16>& x,
                       int n_rows, int n) {
    const int n_kb = (n + 127) / 128;
    q.assign(size_t(n_rows) * n, 0xEE);
    s.assign(size_t(n_rows) * n_kb, NAN);
    const int block = 256;
    const int grid = int((int64_t(n_rows) * n_kb * 32 + block - 1) / block);
    blockDim.x = unsigned(block);
    for (int b = 0; b < grid; ++b)
        emu_run_cta(b, grid, block, [&] {
            kernel(q.data(), s.data(), reinterpret_cast<const __nv_bfloat16*>(x.data()), n_rows, n, n_kb);
        });
}

}  // namespace osprey::cuda
