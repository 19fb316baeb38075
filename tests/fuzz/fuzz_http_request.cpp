// libFuzzer entry point of fuzz::http_request (fuzz_targets.h); built with OSPREY_FUZZ=ON (clang).
#include "fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    return osprey::fuzz::http_request(data, size);
}
