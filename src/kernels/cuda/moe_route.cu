// Top-4 routing: one warp per token, each lane holding n_experts / 32 logits in registers.
#include "kernels/cuda/moe_route.h"
#include "kernels/cuda/launch.cuh"

#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/moe_topk.cuh"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kPerLane = kMoeMaxExperts / kWarpSize;  // logits held by each lane

template <int kTopK>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarpSize) moe_route_topk_kernel(const MoeRouteArgs a) {
    pdl_enter();  // launch.cuh: before any early return or global access
    const int t = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
    if (t >= a.n_tokens) return;
    int32_t* ids = a.expert_ids + size_t(t) * kTopK;
    float* w = a.expert_weights + size_t(t) * kTopK;
    static_assert(sizeof(int32_t) == sizeof(int));
    warp_route_topk_fit<kTopK, kPerLane>(a.logits + size_t(t) * a.n_experts,
                                         reinterpret_cast<const __nv_bfloat16*>(a.bias), a.n_experts,
                                         reinterpret_cast<int*>(ids), w);
}

}  // namespace

void moe_route_topk(const MoeRouteArgs& a, cudaStream_t stream) {
    OSPREY_CHECK(a.n_tokens >= 0, "moe_route_topk: n_tokens = ", a.n_tokens);
    OSPREY_CHECK(a.n_experts >= a.top_k && a.n_experts <= kMoeMaxExperts, "moe_route_topk: n_experts = ",
                 a.n_experts, " must be in [top_k, ", kMoeMaxExperts, "]");
    if (a.n_tokens == 0) return;
    OSPREY_CHECK(a.expert_ids && a.expert_weights && a.logits, "moe_route_topk: null pointer");
    const int blocks = (a.n_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
    dispatch_int<4>("moe_route_topk top_k", a.top_k, [&]<int kTopK>() {
        cuda::launch(moe_route_topk_kernel<kTopK>, blocks, kWarpsPerBlock * kWarpSize, 0, stream, a);
    });
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::cuda
