#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace osprey::log {

namespace {
Level threshold() {
    static const Level level = [] {
        const char* env = std::getenv("OSPREY_LOG");
        if (!env) return Level::info;
        if (!std::strcmp(env, "debug")) return Level::debug;
        if (!std::strcmp(env, "warn")) return Level::warn;
        if (!std::strcmp(env, "error")) return Level::error;
        return Level::info;
    }();
    return level;
}
}  // namespace

bool enabled(Level level) { return int(level) >= int(threshold()); }

void write(Level level, const std::string& message) {
    static std::mutex mu;
    static const char* kNames[] = {"debug", "info", "warn", "error"};
    std::lock_guard lock(mu);
    std::fprintf(stderr, "[osprey %s] %s\n", kNames[int(level)], message.c_str());
}

}  // namespace osprey::log
