// A one-shot all-reduce over peer memory (NVLink) for the small messages of decode steps, where
// NCCL's ring/tree latency dominates: every rank copies its input into a staging buffer of its own,
// signals every peer with a flag written into the peer's memory, waits for all peers' flags, then
// sums all ranks' staging buffers directly over NVLink in rank order (every rank the same bits, and
// the in-process communicator's order). Double-buffered by call parity: a rank's call e waits for
// every peer's signal of call e, which each sends only after its call e - 1 (and so its reads of
// the buffers of call e - 2) finished, so a staging buffer is never overwritten while read.
// Peer access (cudaDeviceEnablePeerAccess) only, no NVLink multicast; one process, so device
// pointers are exchanged directly (no cudaIpc handles).
//
// OFF unless $OSPREY_PEER_ALLREDUCE=1, and UNTESTED: it needs two or more GPUs, which no test here
// has had (tests/comm/test_device_comm.cu runs it when the variable is set on a multi-GPU machine).
// Not capturable in a CUDA graph (the call counter is a kernel argument). comm/nccl.cpp uses it for
// all-reduces of at most kPeerAllReduceMaxBytes and falls back to NCCL above.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace osprey::comm {

inline constexpr int kPeerMaxRanks = 8;
inline constexpr size_t kPeerAllReduceMaxBytes = size_t(512) << 10;

bool peer_allreduce_enabled();  // $OSPREY_PEER_ALLREDUCE == "1" (read once)

// One rank's buffers; its peers' pointers are exchanged by the owner (comm/nccl.cpp).
struct PeerBuffers {
    float* staging[2] = {nullptr, nullptr};  // [kPeerAllReduceMaxBytes / 4] each, this device
    uint64_t* flags = nullptr;               // [kPeerMaxRanks] signals from each rank (this device)
    int device = -1;
    void allocate();  // on the current device
    void release();
};

struct PeerAllReduceArgs {
    float* data = nullptr;                        // [n] this rank's input and output (device)
    size_t n = 0;                                 // n * 4 <= kPeerAllReduceMaxBytes
    int n_ranks = 0, rank = 0;
    PeerBuffers ranks[kPeerMaxRanks];             // every rank's buffers, in rank order
    uint64_t call = 0;                            // 1, 2, ... the same on every rank
};

void peer_allreduce(const PeerAllReduceArgs& a, cudaStream_t stream);

}  // namespace osprey::comm
