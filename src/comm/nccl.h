// NCCL behind comm::Communicator: one GPU per rank, device buffers, stream-ordered on the stream
// set_stream() names (comm/communicator.h). Osprey runs one process with one worker thread per GPU
// (model/parallel_runner.h), so a group is made at once with ncclCommInitAll; make_nccl_rank
// (ncclCommInitRank with an id from nccl_unique_id) is the entry point for a rank of a group that
// spans processes.
//
//   all_reduce_sum    ncclAllReduce (float, sum); with $OSPREY_PEER_ALLREDUCE=1, messages up to 512 KB
//                     take the one-shot peer-memory all-reduce instead (comm/peer_allreduce.h, untested)
//   all_gather_bytes  ncclAllGather when every rank sends the same count, else one ncclBroadcast per
//                     rank inside a group call (ragged counts: the DP token gather)
//   broadcast_bytes   ncclBroadcast
//   barrier           a one-element all-reduce, then the stream is synchronised
//   split             ncclCommSplit
//   abort             marks the root group and every group split from it failed and ncclCommAbort()s
//                     their communicators, so a peer waiting in a collective returns; the group cannot
//                     be used again (later collectives throw).
//
// Determinism: NCCL's sums are not in rank order (ring or tree, chosen by size), but every rank
// receives the same bits and a rerun with the same inputs, group and NCCL version gives the same
// result; equality with the in-process sum holds within the FP32 reordering bound only.
#pragma once

#include <array>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"

namespace osprey::comm {

// One communicator per rank, rank r on CUDA device devices[r] (ncclCommInitAll). Call from one thread;
// hand communicator r to the thread that drives device devices[r].
std::vector<std::unique_ptr<Communicator>> make_nccl_group(std::span<const int> devices);

// For groups spanning processes: the id made by rank 0 (nccl_unique_id) reaches every rank out of band.
using NcclId = std::array<char, 128>;
NcclId nccl_unique_id();
std::unique_ptr<Communicator> make_nccl_rank(const NcclId& id, int n_ranks, int rank, int device);

int nccl_version();  // e.g. 22809 for 2.28.9 (of the library loaded)

}  // namespace osprey::comm
