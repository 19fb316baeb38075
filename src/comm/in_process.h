// The in-process communicator: the ranks are threads of one process (one thread per rank), sharing
// a small state object per group. A collective posts each rank's buffer pointer, meets at a barrier,
// and each rank reads the others' buffers directly (no copies into a staging area except the
// all-reduce's result). all_reduce_sum is two-shot: rank r sums slice r of the buffer over all ranks
// in rank order into a shared result, then every rank copies the result back, so every element is
// added in the same order whoever computes it: bit-for-bit reproducible, and the same on each rank.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace osprey::comm {

// One communicator per rank of a new group of `n` ranks; hand communicator r to the thread of rank r.
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int n);

}  // namespace osprey::comm
