// Checks a ForwardBatch against the model and the KV layout before a backend runs it: slices cover
// the tokens in order, positions are within the model's range, every slice has the pages its
// positions need, a window slot of its own and a ring start at or before its first position, and
// every token id is in the vocabulary. Every backend calls it, so a malformed batch gets the same
// error whichever runs it.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/forward_batch.h"
#include "model/kv_spec.h"

namespace osprey::model {

// Throws osprey::Error naming the slice and the value at fault.
// `dp_groups`: the backend's data-parallel groups (slices' dp_group in range; window slots distinct
// within a group, each group having its own cache).
void check_forward_batch(const ForwardBatch& batch, const Config& config, const KvLayout& layout, int dp_groups = 1);

}  // namespace osprey::model
