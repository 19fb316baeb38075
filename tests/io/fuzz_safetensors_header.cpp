// Fuzz target for the safetensors header parser. Built as a libFuzzer binary with clang when
// OSPREY_FUZZ=ON (cmake -DOSPREY_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++), and linked into test_io,
// whose test_fuzz_header.cpp feeds it ~20k random and mutated headers on every CI run.
// Contract: any input either parses into a header whose invariants hold, or throws osprey::Error.
// Anything else (a crash, another exception, a broken invariant) aborts.
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <algorithm>

#include "core/check.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    osprey::io::Header h;
    try {
        h = osprey::io::parse_header(data, size, "fuzz input");
    } catch (const osprey::Error&) {
        return 0;  // rejected cleanly
    }
    // Accepted: every tensor must lie inside the data section, match its shape and not overlap.
    if (h.data_start < 8 || h.data_start > size) std::abort();
    const uint64_t data_size = size - h.data_start;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const auto& t : h.tensors) {
        uint64_t n = osprey::dtype_size(t.dtype);
        for (int64_t d : t.shape) {
            if (d < 0) std::abort();
            n *= uint64_t(d);
        }
        if (t.begin > t.end || t.end > data_size || t.end - t.begin != n) std::abort();
        if (t.end > t.begin) ranges.emplace_back(t.begin, t.end);
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
        if (ranges[i].first < ranges[i - 1].second) std::abort();
    return 0;
}
