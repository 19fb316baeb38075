// The EAGLE-3 proposer (engine/speculative.h): a head (model/eagle3.h) fed with the target's
// hidden states of three layers, which the target runner captures for every token
// (ModelRunner::set_capture_layers) and the engine hands over after each forward. Greedy drafting
// (q one-hot), so the engine's acceptance is exact. CPU head; the target may be any backend that
// captures hidden states (CPU reference, CUDA). See docs/speculative.md.
#pragma once

#include <filesystem>
#include <memory>

#include "core/tensor.h"
#include "engine/speculative.h"
#include "model/runner.h"

namespace osprey::backends {

// `target_embedding`: the target's [V, d_model] bf16 table (heads without embed_tokens use it); it
// must outlive the proposer. Turns on the target's hidden-state capture.
std::shared_ptr<engine::Proposer> make_eagle3_proposer(const std::filesystem::path& head_dir, model::ModelRunner& target,
                                                       const TensorView* target_embedding);

}  // namespace osprey::backends
