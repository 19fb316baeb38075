// libFuzzer entry point of fuzz::json_document (fuzz_targets.h); built with OSPREY_FUZZ=ON (clang).
#include "fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    return osprey::fuzz::json_document(data, size);
}
