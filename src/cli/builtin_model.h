// The built-in tiny model folder used when a command gets no --model: a synthetic checkpoint (tiny
// preset, seed 0) written on first use to $OSPREY_CACHE/tiny (default ~/.cache/osprey/tiny), into a
// temporary folder renamed into place so a crash or a concurrent first use never leaves half a model.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "core/check.h"
#include "model/synthetic.h"

namespace osprey::cli {

inline std::filesystem::path cache_root() {
    if (const char* env = std::getenv("OSPREY_CACHE"); env && *env) return env;
    const char* home = std::getenv("HOME");
    OSPREY_CHECK(home && *home, "neither $OSPREY_CACHE nor $HOME is set: pass --model DIR");
    return std::filesystem::path(home) / ".cache" / "osprey";
}

inline std::filesystem::path builtin_model_dir() {
    namespace fs = std::filesystem;
    const fs::path dir = cache_root() / "tiny";
    if (fs::exists(dir / "config.json")) return dir;
    fs::create_directories(dir.parent_path());
    const fs::path tmp = dir.parent_path() / ("tiny.tmp-" + std::to_string(::getpid()));
    fs::remove_all(tmp);
    model::SyntheticOptions o;
    o.preset = "tiny";
    o.seed = 0;
    o.out = tmp;
    if (const char* tok = std::getenv("OSPREY_TIKTOKEN_FILE"); tok && *tok && fs::is_regular_file(tok))
        o.tokenizer_file = tok;
    std::fprintf(stderr, "writing the built-in tiny model to %s\n", dir.string().c_str());
    model::write_synthetic_checkpoint(o);
    std::error_code ec;
    fs::rename(tmp, dir, ec);
    if (ec) {  // another process got there first
        fs::remove_all(tmp);
        OSPREY_CHECK(fs::exists(dir / "config.json"), "could not create ", dir.string(), ": ", ec.message());
    }
    return dir;
}

}  // namespace osprey::cli
