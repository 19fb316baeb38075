// Device queries of the runtime layer (the RAII types are header-only templates).
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/launch.cuh"

#include <cstdlib>
#include <string>

namespace osprey::cuda {

void require_device() {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        OSPREY_FAIL("no usable CUDA device: ", cudaGetErrorString(err));
    }
    OSPREY_CHECK(n > 0, "no CUDA device found");
}

MemInfo mem_info() {
    MemInfo m;
    CUDA_CHECK(cudaMemGetInfo(&m.free, &m.total));
    return m;
}

std::string device_name() {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    return prop.name;
}

bool pdl_enabled() {
    static const bool on = [] {
        const char* env = std::getenv("OSPREY_PDL");
        return !(env && std::string(env) == "0");
    }();
    return on;
}

int device_attribute(cudaDeviceAttr attr) {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
    return v;
}

int sm_count() {
    static const int count = device_attribute(cudaDevAttrMultiProcessorCount);
    return count;
}

}  // namespace osprey::cuda
