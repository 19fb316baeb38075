// What every benchmark run records next to its numbers: the parallel layout, the model and its
// weight format, the checkpoint, the device (GPU or CPU model name), the commit and the date, and
// the price used for the cost columns.
#pragma once

#include <string>

#include "core/json.h"
#include "model/parallel_layout.h"

namespace osprey::benchtool {

// Tensor / expert / data parallel degrees (model/parallel_layout.h): GPUs used = max(tp, ep) · dp
// (expert parallelism spreads the experts over the same GPUs as the tensor-parallel group).
using ParallelLayout = model::ParallelLayout;

struct RunInfo {
    std::string command;            // "prefill", "decode", "serve"
    std::string commit;             // git describe at build time, or "unknown"
    std::string date;               // UTC, ISO 8601
    std::string host;               // hostname
    std::string device;             // "cuda:NVIDIA H200", "cpu-reference (AMD EPYC ..., 2 threads)", or a server URL
    std::string backend;            // "cuda", "cpu", "http"
    std::string checkpoint;         // model folder (absolute) or served model name
    std::string checkpoint_layout;  // "hf" | "original" | ""
    std::string model;              // "20b-like: 24 layers, d_model 2880, 32 experts" or the server's model id
    std::string weight_format;      // e.g. "MXFP4 experts, BF16 attention/router/embeddings"
    ParallelLayout layout;
    double price_per_gpu_hour = 3.0;  // USD
    double price_per_hour() const { return price_per_gpu_hour * layout.n_gpus(); }

    json::Value to_json() const;
    // Fills commit, date and host.
    static RunInfo now(std::string command);
};

std::string build_commit();    // the embedded git describe, "unknown" when there was none
std::string cpu_model_name();  // /proc/cpuinfo's "model name", else "unknown CPU"
std::string utc_now_iso();     // 2026-11-29T10:24:18Z

// USD per million tokens at `tokens_per_s` on hardware costing `price_per_hour` (0 when no rate).
double cost_per_million(double price_per_hour, double tokens_per_s);

}  // namespace osprey::benchtool
