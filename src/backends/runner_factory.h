// One factory for model backends: makes the runner a backend name and a parallel layout ask for, so that no command
// repeats the CUDA/CPU choice or its #ifdef. The CUDA backend exists when osprey was built with nvcc.
//   auto  the CUDA backend when it was built and this machine has an NVIDIA device, else the CPU one
//   cpu   the CPU reference backend (model/gpt_oss_ref.h)
//   cuda  the CUDA backend (model/cuda/gpt_oss_cuda.h); an error when it was not built
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "model/parallel_layout.h"
#include "model/runner.h"
#include "model/gpt_oss_ref.h"
#include "model/kv_spec.h"
#include "model/weight_convert.h"
#include "model/weights.h"

namespace osprey::backends {

// Throws osprey::Error naming `flag` unless `name` is auto, cpu or cuda.
void check_backend_name(const std::string& name, const std::string& flag = "--backend");
bool built_with_cuda();
bool have_gpu();  // an NVIDIA device node is present
// "cpu" or "cuda": what `name` resolves to on this machine (throws for cuda without the backend).
std::string resolve_backend(const std::string& name);

struct RunnerOptions {
    std::string backend = "auto";
    // auto only: when the CUDA backend fails to start (no usable device), warn and use the CPU one.
    bool fall_back_to_cpu = false;
    int cpu_threads = 0;  // 0: the process-wide pool
    // CUDA sizing (CudaRunnerOptions): tokens, logit rows and sequences per forward; 0 keeps the default.
    int max_tokens = 0;
    int max_logit_rows = 0;
    int max_slices = 0;
    bool progress = true;  // progress bar while loading weights to the device
    // --tp/--ep/--dp. Above 1: on the CPU backend a ParallelRunner (model/parallel_runner.h, one
    // thread per rank, cpu_threads shared out); on the CUDA backend one CudaRunner shard per GPU over
    // NCCL (model/cuda/parallel_cuda.h).
    model::ParallelLayout layout = {};
    // CUDA layouts: every rank on one GPU (the same-device communicator), for testing a layout where
    // fewer GPUs exist; also $OSPREY_CUDA_SAME_DEVICE=1.
    bool cuda_same_device = false;
    // --weights fp8|mxfp4|bf16: the weights converted at load (model/weight_convert.h) before the
    // runner is made; unset keeps the folder's own formats. fp8_parts: what fp8 converts.
    std::optional<model::WeightFormat> weights_format = std::nullopt;
    model::Fp8Parts fp8_parts = {};
    // --kv-cache-dtype: unset is the backend's own (CPU f32, CUDA bf16); fp8 on both.
    std::optional<model::KvDtype> kv_dtype = std::nullopt;
    // --moe-gemm w4a8: the MoE's expert GEMMs in W4A8 (E4M3 activations per 128-k block, FP8 tensor
    // cores; kernels/cuda/moe_mlp_w4a8.h) for prefill-sized batches on the CUDA backend, and for every
    // batch in the CPU reference (its W4A8 arithmetic, kernels/cpu/w4a8_matmul.h). w4a16 (false): as
    // published. The CUDA backend also takes $OSPREY_MOE_W4A8=1.
    bool moe_w4a8 = false;
};

struct Runner {
    std::unique_ptr<model::ModelRunner> runner;
    std::string backend;                    // "cpu" or "cuda"
    std::optional<model::Weights> weights;  // kept beside a CUDA runner (the CPU one owns its weights)
};

Runner make_runner(model::Weights weights, const RunnerOptions& options);

// A setter for `runner`'s intermediate dump (the CPU reference's or the single-GPU CUDA runner's
// set_dump), for layer-by-layer comparisons (model/format_accuracy.h); null for other runners.
std::function<void(model::DumpFn)> dump_hook(model::ModelRunner& runner);

// Throws naming the option when the CUDA backend cannot run these weights, this layout or this KV
// dtype: W4A8 with experts that are not MXFP4, FP8 attention under a tensor-parallel layout whose ranks'
// out-projection columns do not start on a 128-column block, a KV dtype other than bf16/fp8
// (docs/fp8.md). MXFP4, FP8 and BF16 experts and BF16 or FP8 attention and unembedding all run.
void check_cuda_supports(const model::Weights& weights, const RunnerOptions& options);

}  // namespace osprey::backends
