// Flags shared by the commands that load a model onto a backend (bench, generate, serve): the model
// folder (--model, else the built-in tiny model), --backend auto|cpu|cuda (made by the factory in
// backends/runner_factory.h), --page-size (bounds in model/kv_spec.h) and the parallel layout
// (--tp/--ep/--dp, model/parallel_layout.h), and the formats: --weights fp8|mxfp4|bf16 [--convert
// attention,experts,unembedding] and --kv-cache-dtype auto|fp8|f32|bf16 (docs/fp8.md).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "backends/runner_factory.h"
#include "cli/builtin_model.h"
#include "cli/command.h"
#include "core/check.h"
#include "model/kv_spec.h"
#include "model/parallel_layout.h"
#include "model/weight_convert.h"

namespace osprey::cli {

// --model DIR, else the built-in tiny model (written on first use).
inline std::filesystem::path model_dir_flag(const Args& args) {
    return args.has("model") ? std::filesystem::path(args.get("model")) : builtin_model_dir();
}

// --backend auto|cpu|cuda (default auto), checked.
inline std::string backend_flag(const Args& args) {
    const std::string backend = args.get("backend", "auto");
    backends::check_backend_name(backend);
    return backend;
}

// --page-size N (default `fallback`), within the KV spec's bounds.
inline int page_size_flag(const Args& args, int fallback) {
    const long long v = args.get_int("page-size", fallback);
    model::check_page_size(v >= INT32_MIN && v <= INT32_MAX ? int(v) : -1, "--page-size");
    return int(v);
}

// --tp N --ep N --dp N (default 1 each), checked for shape (the model check is the factory's).
inline model::ParallelLayout layout_flags(const Args& args) {
    model::ParallelLayout l;
    const std::pair<const char*, int*> flags[] = {{"tp", &l.tp}, {"ep", &l.ep}, {"dp", &l.dp}};
    for (const auto& [flag, v] : flags) {
        const long long x = args.get_int(flag, 1);
        OSPREY_CHECK(x >= 1 && x <= 1024, "--", flag, " must be in [1, 1024], got ", x);
        *v = int(x);
    }
    l.check();
    return l;
}

// The value flags format_flags() reads, for a command's flag list.
inline const std::vector<std::string>& format_flag_names() {
    static const std::vector<std::string> names = {"weights", "convert", "kv-cache-dtype", "moe-gemm"};
    return names;
}

// --moe-gemm w4a16|w4a8: whether the MoE's expert GEMMs run W4A8 (RunnerOptions::moe_w4a8).
inline bool parse_moe_gemm(const std::string& v, const char* flag) {
    OSPREY_CHECK(v == "w4a16" || v == "w4a8", flag, " '", v, "': expected w4a16 (BF16 activations) or w4a8 (E4M3)");
    return v == "w4a8";
}

// --weights fp8|mxfp4|bf16 (load-time conversion; default: the folder's own formats), --convert LIST
// (what --weights fp8 converts; default attention,experts,unembedding) and --kv-cache-dtype
// auto|fp8|f32|bf16, into `o`.
inline void format_flags(const Args& args, backends::RunnerOptions& o) {
    if (args.has("weights")) o.weights_format = model::parse_weight_format(args.get("weights"));
    if (args.has("convert")) {
        OSPREY_CHECK(o.weights_format == model::WeightFormat::fp8, "--convert chooses what --weights fp8 converts");
        o.fp8_parts = model::parse_fp8_parts(args.get("convert"));
    }
    if (args.has("kv-cache-dtype")) o.kv_dtype = model::parse_kv_dtype(args.get("kv-cache-dtype"));
    if (args.has("moe-gemm")) o.moe_w4a8 = parse_moe_gemm(args.get("moe-gemm"), "--moe-gemm");
}

// "weights fp8 (attention,experts,unembedding), KV fp8" for logs; empty when nothing was asked.
inline std::string format_summary(const backends::RunnerOptions& o) {
    std::string s;
    if (o.weights_format) {
        s = str("weights ", model::weight_format_name(*o.weights_format));
        if (*o.weights_format == model::WeightFormat::fp8) s += str(" (", model::fp8_parts_name(o.fp8_parts), ")");
    }
    if (o.kv_dtype) s += str(s.empty() ? "" : ", ", "KV ", model::kv_dtype_name(*o.kv_dtype));
    if (o.moe_w4a8) s += str(s.empty() ? "" : ", ", "MoE W4A8");
    return s;
}

}  // namespace osprey::cli
