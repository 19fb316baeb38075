// Test-side helpers for the MoE kernels: random MXFP4 expert weights made on the GPU (fast enough for
// the 120b shapes) and copied to the host, and the CPU reference of one expert's rows built from the
// CPU kernels (kernels/cpu/mxfp4_matmul.h, swiglu.h). Used by tests/kernels/test_moe_*.cu and
// bench/bench_moe.cu.
#pragma once

#include <cstdint>
#include <vector>

#include "core/bf16.h"
#include "kernels/cpu/mxfp4_matmul.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/moe_mlp_mxfp4.h"
#include "kernels/cuda/runtime.h"

namespace osprey::test {

// splitmix64: a counter-based generator, the same on host and device.
__host__ __device__ inline uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Fills an MXFP4 projection: uniformly random nibbles, scale bytes in [scale_lo, scale_lo + 6],
// bias uniform in [-bias_range, bias_range] (rounded to bf16).
__global__ void fill_mxfp4_kernel(uint8_t* blocks, size_t n_blocks_bytes, uint8_t* scales, size_t n_scales,
                                  bf16* bias, size_t n_bias, uint64_t seed, int scale_lo, float bias_range) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n_blocks_bytes / 8; i += stride)
        reinterpret_cast<uint64_t*>(blocks)[i] = mix64(seed ^ (i * 3 + 0));
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n_scales; i += stride)
        scales[i] = uint8_t(scale_lo + mix64(seed ^ (i * 3 + 1)) % 7);
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n_bias; i += stride) {
        const float u = float(mix64(seed ^ (i * 3 + 2)) >> 40) / float(1 << 24);  // [0, 1)
        const float v = (2.0f * u - 1.0f) * bias_range;
        const uint32_t bits = __float_as_uint(v);
        bias[i].bits = uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    }
}

// One projection of every expert, on the device and (copied) on the host.
struct Mxfp4Projection {
    int n_experts = 0, n_out = 0, n_in = 0;
    cuda::DeviceBuffer<uint8_t> d_blocks, d_scales;  // [n_experts, n_out, n_in/32, 16], [n_experts, n_out, n_in/32]
    cuda::DeviceBuffer<bf16> d_bias;                 // [n_experts, n_out]
    std::vector<uint8_t> blocks, scales;
    std::vector<float> bias;                         // as float for the CPU reference

    Mxfp4Projection(int n_experts_, int n_out_, int n_in_, uint64_t seed, int scale_lo, bool keep_host = true)
        : n_experts(n_experts_), n_out(n_out_), n_in(n_in_) {
        const size_t rows = size_t(n_experts) * n_out;
        d_blocks.resize(rows * (n_in / 2));
        d_scales.resize(rows * (n_in / 32));
        d_bias.resize(rows);
        fill_mxfp4_kernel<<<1024, 256>>>(d_blocks.get(), d_blocks.size(), d_scales.get(), d_scales.size(),
                                         d_bias.get(), d_bias.size(), seed, scale_lo, 0.5f);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaDeviceSynchronize());
        if (keep_host) {
            blocks = d_blocks.download();
            scales = d_scales.download();
            const std::vector<bf16> b = d_bias.download();
            bias.resize(b.size());
            for (size_t i = 0; i < b.size(); ++i) bias[i] = bf16_to_float(b[i]);
        }
    }
    cuda::Mxfp4Experts view() const { return {d_blocks.get(), d_scales.get(), d_bias.get()}; }

    // y[n_rows, n_out] = x[n_rows, n_in] · W[e]ᵀ + b[e] with the CPU reference kernel.
    void ref(int e, const std::vector<float>& x, int n_rows, std::vector<float>& y) const {
        const size_t row0 = size_t(e) * n_out;
        y.assign(size_t(n_rows) * n_out, 0.0f);
        cpu::mxfp4_matmul(y, x, std::span(blocks).subspan(row0 * (n_in / 2), size_t(n_out) * (n_in / 2)),
                          std::span(scales).subspan(row0 * (n_in / 32), size_t(n_out) * (n_in / 32)),
                          std::span(bias).subspan(row0, n_out), n_rows, n_in, n_out);
    }
};

}  // namespace osprey::test
