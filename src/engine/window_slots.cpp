// Sliding-window slot ids (see window_slots.h).
#include "engine/window_slots.h"

#include "core/check.h"

namespace osprey::engine {

WindowSlots::WindowSlots(int n_slots) : in_use_(size_t(std::max(n_slots, 0)), 0) {
    OSPREY_CHECK(n_slots > 0, "need at least one window slot, got ", n_slots);
    for (int s = n_slots - 1; s >= 0; --s) free_.push_back(s);
}

bool WindowSlots::in_use(int slot) const {
    OSPREY_CHECK(slot >= 0 && slot < n_slots(), "window slot ", slot, " outside [0, ", n_slots(), ")");
    return in_use_[size_t(slot)] != 0;
}

int WindowSlots::allocate() {
    OSPREY_CHECK(!free_.empty(), "no free window slot (all ", n_slots(), " in use)");
    const int slot = free_.back();
    free_.pop_back();
    in_use_[size_t(slot)] = 1;
    return slot;
}

void WindowSlots::release(int slot) {
    OSPREY_CHECK(in_use(slot), "release of free window slot ", slot);
    in_use_[size_t(slot)] = 0;
    free_.push_back(slot);
}

void WindowSlots::check_invariants() const {
    std::vector<uint8_t> seen(in_use_.size(), 0);
    for (int s : free_) {
        OSPREY_CHECK(s >= 0 && s < n_slots() && !seen[size_t(s)] && !in_use_[size_t(s)], "window slot ", s,
                     " is corrupt in the free list");
        seen[size_t(s)] = 1;
    }
    for (size_t s = 0; s < in_use_.size(); ++s)
        OSPREY_CHECK(in_use_[s] || seen[s], "window slot ", s, " is neither used nor free");
}

}  // namespace osprey::engine
