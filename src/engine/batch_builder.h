// Turns a StepPlan into the backend's ragged batch and the sampler's per-row inputs.
#pragma once

#include <span>
#include <vector>

#include "core/sampling.h"
#include "engine/step_plan.h"
#include "model/forward_batch.h"

namespace osprey::engine {

// The plans of one step (one per data-parallel group), back to back in the order given; each
// slice carries its plan's dp_group.
model::ForwardBatch build_forward_batch(std::span<const StepPlan> plans);
model::ForwardBatch build_forward_batch(const StepPlan& plan);

// One row per chunk with want_logits (1 + n_draft for a speculative verify), in chunk order (plan after plan). The states point into the
// sequences' token vectors, valid until the plans are committed.
void build_sampling_rows(std::span<const StepPlan> plans, std::vector<SamplingParams>& params,
                         std::vector<SamplingState>& states);
void build_sampling_rows(const StepPlan& plan, std::vector<SamplingParams>& params, std::vector<SamplingState>& states);

// Prompt scoring: whether some slice of `batch` asks for scores, and the backend's scores
// (ModelRunner::take_prompt_scores, in slice order) stored into the sequences of the plans that
// built it (Sequence::prompt_scores). Throws when the counts do not match.
bool batch_scores_prompt(const model::ForwardBatch& batch);
void store_prompt_scores(std::span<const StepPlan> plans, std::vector<TokenScore>& scores);

}  // namespace osprey::engine
