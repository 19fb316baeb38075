// The sum of several FP32 buffers in a fixed order, out[i] = ((in[0][i] + in[1][i]) + in[2][i]) + ...:
// the reduction of the same-device communicator (comm/same_device.h), whose ranks share one GPU, so
// that every rank computing it gets the same bits as the in-process communicator's rank-order sum.
// Reference: a loop in that order (tests/comm/test_device_comm.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace osprey::cuda {

inline constexpr int kSumMaxInputs = 8;  // per launch; sum_f32 chains launches for more

struct SumArgs {
    float* out = nullptr;                     // [n] f32, may alias none of the inputs
    const float* in[kSumMaxInputs] = {};      // [n_inputs][n] f32 device pointers, summed in this order
    int n_inputs = 0;                         // 1..kSumMaxInputs
    bool accumulate = false;                  // out = out + Σ in (the next chunk of a longer sum)
    size_t n = 0;
};

// out = Σ_k inputs[k] in order k = 0, 1, ..., for any number of inputs (host array of device pointers).
void sum_f32(float* out, const float* const* inputs, int n_inputs, size_t n, cudaStream_t stream);

}  // namespace osprey::cuda
