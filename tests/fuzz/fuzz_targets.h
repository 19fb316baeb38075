// The fuzz targets of the untrusted-input paths: the HTTP request parser, the JSON parser, and a
// request body's way to the engine (JSON -> validation -> Harmony rendering -> prompt tokens, no
// model run). Each takes any bytes and aborts on anything but a clean accept or a clean error (an
// osprey::Error / ApiError with a 4xx); a sanitizer build also catches memory and UB errors.
// Built two ways: as libFuzzer binaries (fuzz_<name>.cpp, OSPREY_FUZZ=ON with clang) and inside
// test_fuzz_targets, which replays seeds and a few seconds of mutations of each on every CI run.
// Results of the long runs: docs/fuzzing.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace osprey::fuzz {

int http_request(const uint8_t* data, size_t size);
int json_document(const uint8_t* data, size_t size);
int chat_request(const uint8_t* data, size_t size);

// Valid inputs each target starts from (the libFuzzer seed corpora are written from these too).
std::vector<std::string> http_seeds();
std::vector<std::string> json_seeds();
std::vector<std::string> chat_seeds();

}  // namespace osprey::fuzz
