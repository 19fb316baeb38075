// Several ranks on ONE GPU, for testing parallel layouts of the CUDA backend where only one GPU is
// available: each rank is a thread with its own stream and its own copy of its shard, and the
// collectives go through device memory in-process. Slow (every collective synchronises the rank's
// stream and meets the others on the host), so never used for serving, and not capturable in a CUDA
// graph; the CUDA runner turns its graphs off under it.
//
//   all_reduce_sum   every rank sums all ranks' buffers itself, in rank order, into its own scratch
//                    (kernels/cuda/reduce_sum.h), then copies the result back: the in-process
//                    communicator's exact arithmetic, the same bits on every rank
//   all_gather_bytes every rank copies the others' inputs (device to device)
//   broadcast_bytes  every rank copies the root's buffer
// Built on an in-process host group (comm/in_process.h), which carries the pointers, the barriers,
// split and abort.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace osprey::comm {

// One communicator per rank of a new group of n ranks sharing the current CUDA device.
std::vector<std::unique_ptr<Communicator>> make_same_device_group(int n);

}  // namespace osprey::comm
