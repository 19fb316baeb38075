// The backend factory (see runner_factory.h): the one place that knows whether CUDA was built.
#include "backends/runner_factory.h"

#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "core/check.h"
#include "core/log.h"
#include "model/gpt_oss_ref.h"
#include "model/parallel_runner.h"
#ifdef OSPREY_HAVE_CUDA
#include "model/cuda/gpt_oss_cuda.h"
#include "model/cuda/parallel_cuda.h"
#endif

namespace osprey::backends {

void check_backend_name(const std::string& name, const std::string& flag) {
    OSPREY_CHECK(name == "auto" || name == "cpu" || name == "cuda", flag, " must be auto, cpu or cuda, got '", name,
                 "'");
}

bool built_with_cuda() {
#ifdef OSPREY_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

bool have_gpu() {
    struct stat st {};
    return ::stat("/dev/nvidia0", &st) == 0;
}

std::string resolve_backend(const std::string& name) {
    check_backend_name(name);
    if (name == "cuda") {
        OSPREY_CHECK(built_with_cuda(), "--backend cuda: this osprey was built without the CUDA backend");
        return "cuda";
    }
    return name == "auto" && built_with_cuda() && have_gpu() ? "cuda" : "cpu";
}

std::function<void(model::DumpFn)> dump_hook(model::ModelRunner& runner) {
    if (auto* cpu = dynamic_cast<model::CpuReference*>(&runner))
        return [cpu](model::DumpFn fn) { cpu->set_dump(std::move(fn)); };
#ifdef OSPREY_HAVE_CUDA
    if (auto* cuda = dynamic_cast<model::CudaRunner*>(&runner))
        return [cuda](model::DumpFn fn) { cuda->set_dump(std::move(fn)); };
#endif
    return nullptr;
}

void check_cuda_supports(const model::Weights& w, const RunnerOptions& o) {
    const std::string weights_flag =
        o.weights_format ? str("--weights ", model::weight_format_name(*o.weights_format)) : std::string("the model");
    // Experts: MXFP4 (published), FP8 (W8A8) or BF16 matrices (kernels/cuda/moe_mlp_matrix.h). Attention
    // and the unembedding: BF16 or FP8 blocks (kernels/cuda/linear.h).
    for (const model::LayerWeights& L : w.layers)
        OSPREY_CHECK(!o.moe_w4a8 || L.experts_format() == model::WeightFormat::mxfp4, "--moe-gemm w4a8 (",
                     w.formats(), "): W4A8 runs the published MXFP4 experts; FP8 experts always run W8A8 on the GPU");
    // A tensor-parallel rank reads its heads' columns of the out-projection: with FP8 multipliers per 128
    // inputs, those columns must start on a 128-column block (device_weights.cpp).
    if (!o.layout.single() && !w.layers.empty() && w.layers[0].attention_format() == model::WeightFormat::fp8) {
        o.layout.check(w.config);
        for (int r = 0; r < o.layout.world(); ++r) {
            const model::ModelShard s = model::model_shard(w.config, o.layout, r);
            const int64_t col0 = int64_t(s.heads.first) * w.config.head_dim;
            OSPREY_CHECK(col0 % 128 == 0, o.layout.label(), " with FP8 attention: rank ", r,
                         "'s out-projection columns start at ", col0,
                         ", inside a 128-column block of FP8 multipliers; on the CUDA backend each rank's query "
                         "heads must start on a multiple of 128 columns. Use a smaller --tp, or BF16 attention "
                         "(--convert without attention)");
        }
    }
    OSPREY_CHECK(!o.kv_dtype || *o.kv_dtype == model::KvDtype::bf16 || *o.kv_dtype == model::KvDtype::fp8_e4m3,
                 "--kv-cache-dtype ", model::kv_dtype_name(*o.kv_dtype),
                 ": the CUDA backend keeps a BF16 or FP8 KV cache (use auto, bf16 or fp8)");
}

Runner make_runner(model::Weights weights, const RunnerOptions& o) {
    Runner r;
    r.backend = resolve_backend(o.backend);
    o.layout.check(weights.config);
    // --weights fp8 on one GPU: the MXFP4 experts are requantised on the device as they load
    // (DeviceWeights::load, kernels/cuda/fp8_quantize.h: the same codes as the host conversion), since the
    // host would have to hold their FP8 form, 1.9x the bytes (120b: 115 GB beside the mapped checkpoint).
    const bool experts_on_device = r.backend == "cuda" && o.layout.single() && o.weights_format &&
                                   *o.weights_format == model::WeightFormat::fp8 && o.fp8_parts.experts &&
                                   !weights.layers.empty() &&
                                   weights.layers[0].experts_format() == model::WeightFormat::mxfp4;
    if (o.weights_format) {
        model::Fp8Parts host_parts = o.fp8_parts;
        host_parts.experts = host_parts.experts && !experts_on_device;
        if (!experts_on_device || host_parts.attention || host_parts.unembedding)  // anything left for the host
            weights = model::convert_weights(std::move(weights), *o.weights_format, host_parts);
    }
    model::KvDtype cpu_kv = model::KvDtype::f32;
    if (o.kv_dtype) {
        OSPREY_CHECK(r.backend == "cuda" || *o.kv_dtype != model::KvDtype::bf16,
                     "--kv-cache-dtype bf16: the CPU backend keeps f32 or fp8 (use auto, f32 or fp8)");
        cpu_kv = *o.kv_dtype;
    }
    OSPREY_CHECK(!o.moe_w4a8 || o.layout.single() || r.backend == "cuda",
                 "--moe-gemm w4a8: the CPU backend runs it without a parallel layout only");
    if (!o.layout.single() && r.backend == "cpu") {
        r.runner = std::make_unique<model::ParallelRunner>(
            weights, model::ParallelRunnerOptions{.layout = o.layout, .n_threads = o.cpu_threads, .kv_dtype = cpu_kv});
        return r;
    }
#ifdef OSPREY_HAVE_CUDA
    if (r.backend == "cuda") {
        check_cuda_supports(weights, o);
        OSPREY_CHECK(!(experts_on_device && o.moe_w4a8), "--moe-gemm w4a8 with --weights fp8: W4A8 runs the ",
                     "published MXFP4 experts; FP8 experts always run W8A8 on the GPU");
        model::CudaRunnerOptions co;
        co.experts_to_fp8 = experts_on_device;
        if (o.max_tokens > 0) co.max_tokens = o.max_tokens;
        if (o.max_logit_rows > 0) co.max_logit_rows = o.max_logit_rows;
        if (o.max_slices > 0) co.max_slices = o.max_slices;
        co.progress = o.progress;
        if (o.kv_dtype) co.kv_dtype = *o.kv_dtype;  // bf16 (auto) or fp8 (kernels/cuda/kv_fp8.h)
        co.moe_w4a8 = o.moe_w4a8;
        if (!o.layout.single()) {
            // One CudaRunner shard per GPU over NCCL (model/cuda/parallel_cuda.h); no CPU fallback.
            const char* env = std::getenv("OSPREY_CUDA_SAME_DEVICE");
            r.runner = model::make_cuda_parallel_runner(
                weights, {.layout = o.layout, .runner = co, .same_device = o.cuda_same_device || (env && env == std::string("1"))});
            r.weights = std::move(weights);
            return r;
        }
        try {
            r.runner = std::make_unique<model::CudaRunner>(weights, co);
            r.weights = std::move(weights);
            return r;
        } catch (const Error& e) {
            OSPREY_CHECK(o.backend == "auto" && o.fall_back_to_cpu, "--backend ", o.backend, ": ", e.what());
            log::warn("no usable CUDA device (", e.what(), "): using the CPU reference backend");
            r.backend = "cpu";
            if (experts_on_device)  // the experts the device would have converted, on the host now
                weights = model::convert_weights(std::move(weights), model::WeightFormat::fp8,
                                                 {.attention = false, .experts = true, .unembedding = false});
        }
    }
#endif
    r.runner = std::make_unique<model::CpuReference>(
        std::move(weights), model::CpuReferenceOptions{.n_threads = o.cpu_threads, .kv_dtype = cpu_kv, .moe_w4a8 = o.moe_w4a8});
    return r;
}

}  // namespace osprey::backends
