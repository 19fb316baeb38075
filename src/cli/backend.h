// Flags shared by the commands that load a model onto a backend (bench, generate, serve): the model
// folder (--model, else the built-in tiny model), --backend auto|cpu|cuda, and whether a GPU is there.
#pragma once

#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "cli/builtin_model.h"
#include "cli/command.h"
#include "core/check.h"

namespace osprey::cli {

// Whether this machine has an NVIDIA device node (what --backend auto looks for).
inline bool have_gpu() {
    struct stat st{};
    return ::stat("/dev/nvidia0", &st) == 0;
}

// --model DIR, else the built-in tiny model (written on first use).
inline std::filesystem::path model_dir_flag(const Args& args) {
    return args.has("model") ? std::filesystem::path(args.get("model")) : builtin_model_dir();
}

// --backend auto|cpu|cuda (default auto), checked.
inline std::string backend_flag(const Args& args) {
    const std::string backend = args.get("backend", "auto");
    OSPREY_CHECK(backend == "auto" || backend == "cpu" || backend == "cuda", "--backend must be auto, cpu or cuda, got '",
                 backend, "'");
    return backend;
}

// Whether `backend` (from backend_flag) asks for the CUDA backend: cuda, or auto with a GPU present.
inline bool wants_cuda(const std::string& backend) { return backend == "cuda" || (backend == "auto" && have_gpu()); }

}  // namespace osprey::cli
