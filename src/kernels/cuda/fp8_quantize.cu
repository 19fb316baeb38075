// MXFP4 -> FP8 block requantisation on the GPU (see fp8_quantize.h for the exact rule).
#include "kernels/cuda/fp8_quantize.h"

#include "core/check.h"
#include "kernels/cuda/kv_fp8.cuh"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kBlock = 128;                    // weight block side
constexpr int kThreads = 256;
constexpr int kGroups = kBlock / 32;            // MXFP4 groups per block row
constexpr int kPerThread = kBlock * kGroups / kThreads;  // groups of one block per thread

// 2^(scale - 127) in FP32, exactly as core/mxfp4.h's ldexp: scale 0 is the subnormal 2^-127, 255 is inf.
__device__ __forceinline__ float scale_multiplier(uint32_t scale) {
    return scale == 0 ? __int_as_float(0x00400000) : __int_as_float(int(scale << 23));
}

// kFp4Values[n] (core/mxfp4.h), -0 included: exponent field e, mantissa bit m.
__device__ __forceinline__ float fp4_value(uint32_t n) {
    const uint32_t e = (n >> 1) & 3u, m = n & 1u;
    const float mag = e == 0 ? 0.5f * float(m) : (1.0f + 0.5f * float(m)) * float(1u << (e - 1));
    return (n & 8u) ? -mag : mag;
}

__device__ __forceinline__ void decode_group(const uint4 q, float m, float (&v)[32]) {
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) v[8 * i + j] = fp4_value((w[i] >> (4 * j)) & 0xFu) * m;  // byte order = element order
}

// One CTA per 128 x 128 block (blockIdx.x: column block, y: row band, z: matrix).
__global__ void __launch_bounds__(kThreads) mxfp4_to_fp8_kernel(const Mxfp4ToFp8Args a) {
    const int n_groups = a.cols / 32;
    const int r0 = blockIdx.y * kBlock, c0 = blockIdx.x * kBlock;
    const int nr = min(kBlock, a.rows - r0), ng = min(kGroups, (a.cols - c0) / 32);
    const size_t mat_row0 = size_t(blockIdx.z) * a.rows;

    float v[kPerThread][32];
    bool have[kPerThread];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
        const int g = threadIdx.x + i * kThreads;
        have[i] = g < nr * ng;
        if (!have[i]) continue;
        const size_t row = mat_row0 + r0 + g / ng;
        const size_t grp = row * n_groups + c0 / 32 + g % ng;
        decode_group(*reinterpret_cast<const uint4*>(a.blocks + grp * 16), scale_multiplier(a.scales[grp]), v[i]);
#pragma unroll
        for (int k = 0; k < 32; ++k) amax = fmaxf(amax, fabsf(v[i][k]));
    }
    // max over the CTA (order-free, so the host's sequential fmax gives the same value)
#pragma unroll
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    __shared__ float warp_max[kThreads / 32];
    __shared__ float s_scale;
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = 0.0f;
        for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
        const float s = kv_fp8_scale(m);  // fp8::block_scale_inv, as the FP8 KV rows
        s_scale = s;
        const int nbr = (a.rows + kBlock - 1) / kBlock, nbc = (a.cols + kBlock - 1) / kBlock;
        a.scale_inv[(size_t(blockIdx.z) * nbr + blockIdx.y) * nbc + blockIdx.x] = s;
    }
    __syncthreads();
    const float s = s_scale;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
        if (!have[i]) continue;
        const int g = threadIdx.x + i * kThreads;
        const size_t row = mat_row0 + r0 + g / ng;
        uint32_t packed[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            // IEEE division then round-to-nearest, saturating (kv_fp8.cuh): core/fp8.h's codes
            packed[k] = uint32_t(kv_fp8_encode2(v[i][4 * k], v[i][4 * k + 1], s)) |
                        uint32_t(kv_fp8_encode2(v[i][4 * k + 2], v[i][4 * k + 3], s)) << 16;
        }
        uint4* dst = reinterpret_cast<uint4*>(a.codes + row * a.cols + c0 + (g % ng) * 32);
        dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
    }
}

}  // namespace

void mxfp4_to_fp8_blocks(const Mxfp4ToFp8Args& a, cudaStream_t stream) {
    OSPREY_CHECK(a.n_mats > 0 && a.rows > 0 && a.cols > 0 && a.cols % 32 == 0 && a.n_mats <= 65535,
                 "mxfp4_to_fp8_blocks: ", a.n_mats, " matrices of ", a.rows, " x ", a.cols,
                 " (columns must be a positive multiple of 32)");
    OSPREY_CHECK(a.blocks && a.scales && a.codes && a.scale_inv, "mxfp4_to_fp8_blocks: null pointer");
    OSPREY_CHECK(reinterpret_cast<uintptr_t>(a.blocks) % 16 == 0 && reinterpret_cast<uintptr_t>(a.codes) % 16 == 0,
                 "mxfp4_to_fp8_blocks: blocks and codes must be 16-byte aligned");
    const dim3 grid((a.cols + kBlock - 1) / kBlock, (a.rows + kBlock - 1) / kBlock, a.n_mats);
    mxfp4_to_fp8_kernel<<<grid, kThreads, 0, stream>>>(a);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::cuda
