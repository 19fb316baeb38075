// Parallel layouts on the CUDA backend (see parallel_cuda.h).
#include "model/cuda/parallel_cuda.h"

#include <cuda_runtime.h>

#include <vector>

#include "comm/nccl.h"
#include "comm/same_device.h"
#include "core/check.h"
#include "core/log.h"
#include "kernels/cuda/runtime.h"
#include "model/parallel_runner.h"

namespace osprey::model {

std::unique_ptr<ModelRunner> make_cuda_parallel_runner(const Weights& weights, const CudaParallelOptions& o) {
    const ParallelLayout layout = o.layout;
    layout.check(weights.config);
    cuda::require_device();
    const int n = layout.world();
    int n_devices = 0, current = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n_devices));
    CUDA_CHECK(cudaGetDevice(&current));
    OSPREY_CHECK(o.same_device || n <= n_devices, "layout ", layout.label(), " needs ", n, " GPUs, ", n_devices,
                 " visible (OSPREY_CUDA_SAME_DEVICE=1 runs every rank on one GPU, for testing)");
    if (o.same_device)
        log::info("cuda: layout ", layout.label(), ": ", n, " ranks on one GPU (same-device communicator)");
    else
        log::info("cuda: layout ", layout.label(), ": ", n, " GPUs, NCCL ", comm::nccl_version());

    ParallelRunnerOptions po;
    po.layout = layout;
    po.n_threads = n;
    const bool same = o.same_device;
    po.make_device_group = [same](int ranks) {
        if (same) return comm::make_same_device_group(ranks);
        std::vector<int> devices(static_cast<size_t>(ranks));
        for (int r = 0; r < ranks; ++r) devices[size_t(r)] = r;
        return comm::make_nccl_group(devices);
    };
    po.on_rank_thread = [same, current](int rank) { CUDA_CHECK(cudaSetDevice(same ? current : rank)); };
    po.make_rank = [&weights, &o, n](const RankContext& ctx) -> std::unique_ptr<ModelRunner> {
        CudaRunnerOptions ro = o.runner;
        ro.progress = o.runner.progress && ctx.rank == 0;
        ro.shard = CudaRunnerOptions::Shard{.piece = ctx.piece,
                                            .attn = ctx.attn,
                                            .moe = ctx.moe,
                                            .vocab = ctx.vocab,
                                            .host_vocab = ctx.host_vocab,
                                            .dp = ctx.dp,
                                            .host_dp = ctx.host_dp,
                                            .ranks_on_device = o.same_device ? n : 1};
        return std::make_unique<CudaRunner>(weights, ro);
    };
    return std::make_unique<ParallelRunner>(weights, std::move(po));
}

}  // namespace osprey::model
