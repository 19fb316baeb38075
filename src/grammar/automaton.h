// Runs a Grammar byte by byte: a pushdown recogniser whose configurations are interned, so that the
// sets of configurations reachable after a prefix become the states of a deterministic automaton
// built lazily (a state per distinct set, a cached transition per state and byte). A configuration
// is a frame (the next element to match, the frame to return to): the stacks of all alternatives
// share their tails, and a rule called last in an alternative returns straight to its caller's
// frame, so right recursion (repetition) runs in constant stack. The token masks of
// grammar/token_mask.h walk the vocabulary's trie through next(), hence the transition cache.
// Not thread-safe: one automaton per grammar user (they are cheap; the Grammar is shared).
// Tests: tests/grammar/test_grammar.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace osprey::grammar {

class Automaton {
public:
    static constexpr int32_t kDead = -1;  // no configuration left: the input cannot be completed

    explicit Automaton(std::shared_ptr<const Grammar> grammar);

    int32_t start() const { return 0; }
    // The state after `byte` in `state` (kDead when the byte is not allowed). Cached per state and byte.
    int32_t next(int32_t state, uint8_t byte) {
        const size_t i = size_t(state) * 256 + byte;
        if (trans_[i] == kUnknown) {
            const int32_t t = compute_next(state, byte);  // may grow trans_
            trans_[i] = t;
        }
        return trans_[i];
    }
    int32_t next(int32_t state, std::string_view text);  // byte by byte; kDead once dead
    bool accepts(int32_t state) const { return states_[size_t(state)].accept; }  // the root may end here
    bool can_continue(int32_t state) const { return !states_[size_t(state)].frames.empty(); }

    const Grammar& grammar() const { return *grammar_; }
    size_t n_states() const { return states_.size(); }

private:
    static constexpr int32_t kUnknown = -2;
    struct Frame {
        int32_t pos;     // index in grammar.elements (a bytes element for the frames of a state)
        int32_t parent;  // frame to continue with after this alternative ends; -1: the root ends
    };
    struct State {
        std::vector<int32_t> frames;  // sorted frame ids, all at bytes elements
        bool accept = false;
    };
    struct Closure {
        std::vector<int32_t> frames;
        bool accept = false;
        std::vector<uint64_t> seen;  // (pos, parent) pairs visited, to stop at cycles of empty rules
    };

    int32_t frame(int32_t pos, int32_t parent);
    void closure(int32_t pos, int32_t parent, Closure& out);
    int32_t intern(Closure& c);
    int32_t compute_next(int32_t state, uint8_t byte);

    std::shared_ptr<const Grammar> grammar_;
    std::vector<Frame> frames_;
    std::unordered_map<uint64_t, int32_t> frame_ids_;
    std::vector<State> states_;
    std::unordered_map<std::string, int32_t> state_ids_;  // key: the frame ids' bytes + accept flag
    std::vector<int32_t> trans_;                          // [n_states, 256], kUnknown until computed
};

}  // namespace osprey::grammar
