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

// A KvCopy as runs of contiguous cache rows, one row being one position of one layer's K (or V) for
// all KV heads: `sliding` runs address the sliding layers' rings ([n_window_slots x sliding_window]
// rows), the others the full layers' pages ([n_pages x page_size] rows). Runs cover whole pages or a
// whole ring, so they hold for any order of heads and rows inside a page or ring.
struct KvRowRun {
    bool sliding = false;
    int64_t src = 0, dst = 0, n = 0;  // first source row, first destination row, rows
};
// Checks `copy` against the layout (equal lengths, pages and slots in range, no page or slot on both
// sides, no destination twice) and returns its runs, consecutive pages merged. Throws osprey::Error
// naming the fault.
std::vector<KvRowRun> plan_kv_copy(const KvCopy& copy, const KvLayout& layout, int sliding_window);

}  // namespace osprey::model
