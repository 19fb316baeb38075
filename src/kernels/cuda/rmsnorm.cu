#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/launch.cuh"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rmsnorm_row.cuh"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(const RmsNormArgs a) {
    // A handful of blocks: let the next kernel (a GEMV that prefetches its weights before waiting)
    // launch now; it cannot crowd this one out.
    pdl_trigger();
    pdl_enter();  // launch.cuh: before any early return or global access
    const int t = blockIdx.x;
    const size_t r = size_t(a.rows ? a.rows[t] : t);
    float* x = a.x + r * a.d;
    rmsnorm_row<kThreads>(x, a.delta ? a.delta + r * a.d : nullptr, a.moe_y ? a.moe_y + r * 4 * a.d : nullptr,
                          a.moe_w ? a.moe_w + r * 4 : nullptr, a.delta || a.moe_y ? x : nullptr, a.gain, a.d, a.eps,
                          reinterpret_cast<__nv_bfloat162*>(a.y + size_t(t) * a.d));
}

}  // namespace

void rmsnorm(const RmsNormArgs& a, cudaStream_t stream) {
    OSPREY_CHECK(a.n_tokens > 0 && a.d > 0 && a.d % 4 == 0 && a.d <= kRmsNormMaxChannels, "rmsnorm: d = ", a.d,
                 " must be a positive multiple of 4 up to ", kRmsNormMaxChannels, " (n_tokens ", a.n_tokens, ")");
    OSPREY_CHECK(a.y && a.x && a.gain, "rmsnorm: null pointer");
    OSPREY_CHECK(!a.moe_y || (a.moe_w && !a.delta), "rmsnorm: moe_y needs moe_w and excludes delta");
    cuda::launch(rmsnorm_kernel, a.n_tokens, kThreads, 0, stream, a);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::cuda
