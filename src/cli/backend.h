// Flags shared by the commands that load a model onto a backend (bench, generate, serve): the model
// folder (--model, else the built-in tiny model), --backend auto|cpu|cuda (made by the factory in
// backends/runner_factory.h), --page-size (bounds in model/kv_spec.h) and the parallel layout
// (--tp/--ep/--dp, model/parallel_layout.h).
#pragma once

#include <filesystem>
#include <string>

#include "backends/runner_factory.h"
#include "cli/builtin_model.h"
#include "cli/command.h"
#include "core/check.h"
#include "model/kv_spec.h"
#include "model/parallel_layout.h"

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

}  // namespace osprey::cli
