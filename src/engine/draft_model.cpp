// Draft-model proposer (see draft_model.h).
#include "engine/draft_model.h"

#include "core/check.h"

namespace osprey::engine {

std::unique_ptr<Proposer> make_draft_model_proposer(const SpeculativeOptions& options) {
    (void)options;
    OSPREY_FAIL("--speculative draft: not implemented yet");
}

}  // namespace osprey::engine
