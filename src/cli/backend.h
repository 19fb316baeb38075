// Flags shared by the commands that load a model onto a backend (bench, generate, serve): the model
// folder (--model, else the built-in tiny model), --backend auto|cpu|cuda (made by the factory in
// backends/runner_factory.h) and --page-size (bounds in model/kv_spec.h).
#pragma once

#include <filesystem>
#include <string>

#include "backends/runner_factory.h"
#include "cli/builtin_model.h"
#include "cli/command.h"
#include "core/check.h"
#include "model/kv_spec.h"

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

}  // namespace osprey::cli
