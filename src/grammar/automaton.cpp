// Lazy determinisation of the grammar's pushdown configurations (see automaton.h).
#include "grammar/automaton.h"

#include <algorithm>

#include "core/check.h"

namespace osprey::grammar {

Automaton::Automaton(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
    OSPREY_CHECK(grammar_ && !grammar_->rule_alts.empty(), "automaton: empty grammar");
    Closure c;
    for (int32_t a : grammar_->rule_alts[size_t(grammar_->root)]) closure(a, -1, c);
    intern(c);
}

int32_t Automaton::frame(int32_t pos, int32_t parent) {
    const uint64_t key = (uint64_t(uint32_t(pos)) << 32) | uint32_t(parent + 1);
    auto [it, fresh] = frame_ids_.try_emplace(key, int32_t(frames_.size()));
    if (fresh) frames_.push_back({pos, parent});
    return it->second;
}

void Automaton::closure(int32_t pos, int32_t parent, Closure& out) {
    const uint64_t key = (uint64_t(uint32_t(pos)) << 32) | uint32_t(parent + 1);
    if (std::find(out.seen.begin(), out.seen.end(), key) != out.seen.end()) return;
    out.seen.push_back(key);
    const Element& e = grammar_->elements[size_t(pos)];
    switch (e.kind) {
        case Element::Kind::end:
            if (parent < 0) {
                out.accept = true;
            } else {
                const Frame f = frames_[size_t(parent)];
                closure(f.pos, f.parent, out);
            }
            return;
        case Element::Kind::bytes:
            if (!grammar_->sets[size_t(e.arg)].empty()) out.frames.push_back(frame(pos, parent));
            return;
        case Element::Kind::rule: {
            // A call in tail position returns straight to our caller (no frame for "nothing left").
            const bool tail = grammar_->elements[size_t(pos) + 1].kind == Element::Kind::end;
            const int32_t ret = tail ? parent : frame(pos + 1, parent);
            for (int32_t a : grammar_->rule_alts[size_t(e.arg)]) closure(a, ret, out);
            return;
        }
    }
}

int32_t Automaton::intern(Closure& c) {
    std::sort(c.frames.begin(), c.frames.end());
    c.frames.erase(std::unique(c.frames.begin(), c.frames.end()), c.frames.end());
    if (c.frames.empty() && !c.accept) return kDead;
    std::string key(reinterpret_cast<const char*>(c.frames.data()), c.frames.size() * sizeof(int32_t));
    key.push_back(c.accept ? 1 : 0);
    auto [it, fresh] = state_ids_.try_emplace(std::move(key), int32_t(states_.size()));
    if (fresh) {
        states_.push_back({std::move(c.frames), c.accept});
        trans_.resize(states_.size() * 256, kUnknown);
    }
    return it->second;
}

int32_t Automaton::compute_next(int32_t state, uint8_t byte) {
    Closure c;
    const std::vector<int32_t> frames = states_[size_t(state)].frames;  // copy: intern() may grow states_
    for (int32_t id : frames) {
        const Frame f = frames_[size_t(id)];
        const Element& e = grammar_->elements[size_t(f.pos)];
        if (grammar_->sets[size_t(e.arg)].has(byte)) closure(f.pos + 1, f.parent, c);
    }
    return intern(c);
}

int32_t Automaton::next(int32_t state, std::string_view text) {
    for (char ch : text) {
        if (state == kDead) return kDead;
        state = next(state, uint8_t(ch));
    }
    return state;
}

}  // namespace osprey::grammar
