#include "kernels/cuda/embed.h"
#include "kernels/cuda/launch.cuh"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) embed_kernel(const EmbedArgs a) {
    pdl_enter();  // launch.cuh: before any early return or global access
    const int t = blockIdx.x;
    const uint4* src = reinterpret_cast<const uint4*>(a.table + size_t(a.tokens[t]) * a.d_model);
    float* dst = a.x + size_t(t) * a.d_model;
    for (int v = threadIdx.x; v < a.d_model / 8; v += kThreads) {
        float f[8];
        bf16x8_to_float(src[v], f);
        reinterpret_cast<float4*>(dst)[2 * v] = make_float4(f[0], f[1], f[2], f[3]);
        reinterpret_cast<float4*>(dst)[2 * v + 1] = make_float4(f[4], f[5], f[6], f[7]);
    }
}

}  // namespace

void embed(const EmbedArgs& a, cudaStream_t stream) {
    OSPREY_CHECK(a.n_tokens > 0 && a.d_model > 0 && a.d_model % 8 == 0, "embed: d_model ", a.d_model,
                 " must be a positive multiple of 8 (n_tokens ", a.n_tokens, ")");
    OSPREY_CHECK(a.x && a.table && a.tokens, "embed: null pointer");
    cuda::launch(embed_kernel, a.n_tokens, kThreads, 0, stream, a);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::cuda
