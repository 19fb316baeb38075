// Tensor and expert parallelism on the CUDA backend: the ParallelRunner (model/parallel_runner.h) over
// one CudaRunner shard per rank, each on its worker thread (one thread per GPU), its device set on
// that thread, its activations' collectives on device communicators and the small host exchanges
// (argmax candidates) on in-process ones.
//   NCCL (comm/nccl.h): rank r on CUDA device r, a group made by ncclCommInitAll.
//   same_device (comm/same_device.h): every rank on the current device, each with its own stream and
//     shard, collectives through device memory; for testing a layout on one GPU (slow: host
//     synchronisation in every collective). Its KV budget is the GPU's shared out over the ranks.
// A rank holds the same ModelShard as on the CPU backend; with data parallelism each DP group has its
// batch and KV cache and the MoE runs on every group's tokens, as on the CPU. Parallel layouts run
// without CUDA graphs for now (docs/architecture.md, "Parallelism").
// TP=EP=DP=1 never comes here: the factory makes a plain CudaRunner.
#pragma once

#include <memory>

#include "model/cuda/gpt_oss_cuda.h"
#include "model/parallel_layout.h"
#include "model/runner.h"
#include "model/weights.h"

namespace osprey::model {

struct CudaParallelOptions {
    ParallelLayout layout = {};
    CudaRunnerOptions runner = {};  // every rank's (its shard is set here)
    bool same_device = false;       // all ranks on the current GPU (tests) instead of one GPU each
};

std::unique_ptr<ModelRunner> make_cuda_parallel_runner(const Weights& weights, const CudaParallelOptions& options);

}  // namespace osprey::model
