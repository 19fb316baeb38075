// Error handling for the whole engine.
//
//   OSPREY_CHECK(cond, msg...)  a broken precondition at a module boundary (bad shape, bad config,
//                               malformed file, bad request). Throws osprey::Error; the server turns
//                               it into a 4xx, the CLI prints it.
//   OSPREY_FAIL(msg...)         unconditional version, for `default:` branches of dispatch switches.
//   CUDA_CHECK(expr)            (kernels/cuda/runtime.h) every CUDA runtime call; aborts.
//   assert(cond)                internal invariants inside a module; compiled out in release.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace osprey {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Concatenates anything streamable into a string: str("layer ", i, ": ", name).
template <typename... Args>
std::string str(const Args&... args) {
    std::ostringstream os;
    (os << ... << args);
    return os.str();
}

// A message meant for users says what is wrong with which value; without one, the failed condition
// and its place in the source are reported (an internal error).
template <typename... Args>
[[noreturn]] void fail_check(const char* file, int line, const char* cond, const Args&... args) {
    if constexpr (sizeof...(Args) == 0) {
        throw Error(str("check failed: ", cond, " (", file, ":", line, ")"));
    } else {
        throw Error(str(args...));
    }
}

}  // namespace osprey

#define OSPREY_CHECK(cond, ...)                                                                  \
    do {                                                                                         \
        if (!(cond)) ::osprey::fail_check(__FILE__, __LINE__, #cond __VA_OPT__(, ) __VA_ARGS__); \
    } while (0)

#define OSPREY_FAIL(...) throw ::osprey::Error(::osprey::str(__VA_ARGS__))
