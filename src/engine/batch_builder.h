// Turns a StepPlan into the backend's ragged batch and the sampler's per-row inputs.
#pragma once

#include <vector>

#include "core/sampling.h"
#include "engine/step_plan.h"
#include "model/forward_batch.h"

namespace osprey::engine {

model::ForwardBatch build_forward_batch(const StepPlan& plan);

// One row per chunk with want_logits, in chunk order. The states point into the sequences'
// token vectors, valid until the plan is committed.
void build_sampling_rows(const StepPlan& plan, std::vector<SamplingParams>& params, std::vector<SamplingState>& states);

}  // namespace osprey::engine
