// Checks a ForwardBatch against the model and the KV layout before a backend runs it: slices cover
// the tokens in order, positions are within the model's range, every slice has the pages its
// positions need and a window slot of its own, and every token id is in the vocabulary. Both
// backends call it, so a malformed batch gets the same error whichever runs it.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/forward_batch.h"
#include "model/runner.h"

namespace osprey::model {

// Throws osprey::Error naming the slice and the value at fault.
void check_forward_batch(const ForwardBatch& batch, const Config& config, const KvLayout& layout);

// A KvCopy as runs of consecutive pages (src, dst, count), so backends copy contiguous blocks.
struct PageRun {
    int32_t src = 0, dst = 0, count = 0;
};
// Checks `copy` against the layout (equal lengths, pages and slots in range, no page or slot on both
// sides, no destination twice) and returns its page runs. Throws osprey::Error naming the fault.
std::vector<PageRun> plan_kv_copy(const KvCopy& copy, const KvLayout& layout);

}  // namespace osprey::model
