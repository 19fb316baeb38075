// A per-sample constraint on the tokens a request may generate (structured output: JSON Schema,
// regex, grammar, forced tool calls). The engine asks it for the allowed-token mask of each step,
// applies the mask before sampling (greedy or sampled) and tells it the token that was chosen.
// Requests without one pay nothing. Implementations live in src/frontend (frontend/constraint.h);
// the engine knows only this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

namespace osprey::engine {

class TokenConstraint {
public:
    virtual ~TokenConstraint() = default;
    // A fresh copy in the same state: each of a request's n samples advances its own.
    virtual std::unique_ptr<TokenConstraint> clone() const = 0;
    // Writes the tokens allowed next as a bitmask (bit t % 32 of word t / 32; `mask` holds
    // ceil(vocab_size / 32) words, cleared by the caller). Returns false when every token is allowed
    // this step (the mask is then not applied: free text such as the analysis channel costs nothing).
    // Called on the engine thread while the backend runs the step's forward.
    virtual bool fill_mask(std::span<uint32_t> mask) = 0;
    // Advances past the sampled token. False when the token was not allowed (a bug: the engine ends
    // the sample with an error).
    virtual bool accept(int32_t token) = 0;
};

}  // namespace osprey::engine
