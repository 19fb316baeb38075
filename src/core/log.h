// Levelled logging to stderr. OSPREY_LOG=debug|info|warn|error sets the threshold (default info).
#pragma once

#include <string>

#include "core/check.h"

namespace osprey::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };

bool enabled(Level level);
void write(Level level, const std::string& message);

template <typename... Args>
void debug(const Args&... args) {
    if (enabled(Level::debug)) write(Level::debug, str(args...));
}
template <typename... Args>
void info(const Args&... args) {
    if (enabled(Level::info)) write(Level::info, str(args...));
}
template <typename... Args>
void warn(const Args&... args) {
    if (enabled(Level::warn)) write(Level::warn, str(args...));
}
template <typename... Args>
void error(const Args&... args) {
    if (enabled(Level::error)) write(Level::error, str(args...));
}

}  // namespace osprey::log
