#include "comm/peer_allreduce.h"

#include <cstdlib>
#include <string>

#include "core/check.h"
#include "kernels/cuda/runtime.h"

namespace osprey::comm {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocks = 32;  // all resident at once: every block spins on the peers' flags

struct KernelArgs {
    float* out;
    size_t n;
    int n_ranks, rank;
    const float* in[kPeerMaxRanks];  // each rank's staging buffer of this call
    uint64_t* flags[kPeerMaxRanks];  // each rank's flag array
    uint64_t call;
};

__global__ void __launch_bounds__(kThreads) one_shot_kernel(const KernelArgs a) {
    // Signal every rank (this one included) that this rank's staging buffer is ready: the copy into
    // it finished before this kernel started (stream order); the fence orders it before the flag.
    if (blockIdx.x == 0 && threadIdx.x < a.n_ranks) {
        __threadfence_system();
        volatile uint64_t* slot = a.flags[threadIdx.x] + a.rank;
        *slot = a.call;
    }
    // Wait for every rank's signal of this call (a peer may already be one call ahead).
    if (threadIdx.x < a.n_ranks) {
        volatile uint64_t* mine = a.flags[a.rank] + threadIdx.x;
        while (*mine < a.call) {
        }
    }
    __syncthreads();
    __threadfence_system();
    for (size_t i = size_t(blockIdx.x) * kThreads + threadIdx.x; i < a.n; i += size_t(gridDim.x) * kThreads) {
        float s = a.in[0][i];
        for (int r = 1; r < a.n_ranks; ++r) s += a.in[r][i];
        a.out[i] = s;
    }
}

}  // namespace

bool peer_allreduce_enabled() {
    static const bool on = [] {
        const char* v = std::getenv("OSPREY_PEER_ALLREDUCE");
        return v && std::string(v) == "1";
    }();
    return on;
}

void PeerBuffers::allocate() {
    CUDA_CHECK(cudaGetDevice(&device));
    for (float*& s : staging) CUDA_CHECK(cudaMalloc(&s, kPeerAllReduceMaxBytes));
    CUDA_CHECK(cudaMalloc(&flags, kPeerMaxRanks * sizeof(uint64_t)));
    CUDA_CHECK(cudaMemset(flags, 0, kPeerMaxRanks * sizeof(uint64_t)));
    CUDA_CHECK(cudaDeviceSynchronize());
}

void PeerBuffers::release() {
    for (float*& s : staging)
        if (s) cudaFree(s), s = nullptr;
    if (flags) cudaFree(flags), flags = nullptr;
}

void peer_allreduce(const PeerAllReduceArgs& a, cudaStream_t stream) {
    OSPREY_CHECK(a.n_ranks >= 1 && a.n_ranks <= kPeerMaxRanks && a.rank >= 0 && a.rank < a.n_ranks && a.call > 0,
                 "peer all-reduce: rank ", a.rank, " of ", a.n_ranks, ", call ", a.call);
    OSPREY_CHECK(a.n * sizeof(float) <= kPeerAllReduceMaxBytes, "peer all-reduce: ", a.n, " floats");
    if (a.n == 0) return;
    const int parity = int(a.call % 2);
    KernelArgs k{};
    k.out = a.data;
    k.n = a.n;
    k.n_ranks = a.n_ranks;
    k.rank = a.rank;
    k.call = a.call;
    for (int r = 0; r < a.n_ranks; ++r) {
        k.in[r] = a.ranks[r].staging[parity];
        k.flags[r] = a.ranks[r].flags;
    }
    CUDA_CHECK(cudaMemcpyAsync(a.ranks[a.rank].staging[parity], a.data, a.n * sizeof(float), cudaMemcpyDeviceToDevice,
                               stream));
    one_shot_kernel<<<kBlocks, kThreads, 0, stream>>>(k);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace osprey::comm
