#include "kernels/cuda/reduce_sum.h"

#include <algorithm>

#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) sum_kernel(const SumArgs a) {
    for (size_t i = size_t(blockIdx.x) * kThreads + threadIdx.x; i < a.n; i += size_t(gridDim.x) * kThreads) {
        float s = a.accumulate ? a.out[i] : a.in[0][i];
        for (int k = a.accumulate ? 0 : 1; k < a.n_inputs; ++k) s += a.in[k][i];
        a.out[i] = s;
    }
}

}  // namespace

void sum_f32(float* out, const float* const* inputs, int n_inputs, size_t n, cudaStream_t stream) {
    OSPREY_CHECK(n_inputs > 0 && out && inputs, "sum_f32: ", n_inputs, " inputs");
    if (n == 0) return;
    const int blocks = int(std::min<size_t>((n + kThreads - 1) / kThreads, 4096));
    for (int first = 0; first < n_inputs; first += kSumMaxInputs) {
        SumArgs a;
        a.out = out;
        a.n_inputs = std::min(kSumMaxInputs, n_inputs - first);
        for (int k = 0; k < a.n_inputs; ++k) {
            OSPREY_CHECK(inputs[first + k] && inputs[first + k] != out, "sum_f32: input ", first + k,
                         " is null or the output");
            a.in[k] = inputs[first + k];
        }
        a.accumulate = first > 0;
        a.n = n;
        sum_kernel<<<blocks, kThreads, 0, stream>>>(a);
        CUDA_CHECK(cudaGetLastError());
    }
}

}  // namespace osprey::cuda
