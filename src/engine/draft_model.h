// The draft-model proposer: a second gpt-oss checkpoint (any size, the target's vocabulary) with
// its own runner and KV cache, decoding greedily k tokens per sequence and step (engine/speculative.h).
#pragma once

#include <memory>

#include "engine/speculative.h"

namespace osprey::engine {

std::unique_ptr<Proposer> make_draft_model_proposer(const SpeculativeOptions& options);

}  // namespace osprey::engine
