// Saved window rings for prefix-cache hits (see window_snapshots.h).
#include "engine/window_snapshots.h"

#include <vector>

#include "core/check.h"

namespace osprey::engine {

WindowSnapshots::WindowSnapshots(int first_slot, int n_slots) : first_slot_(first_slot), n_slots_(n_slots) {
    OSPREY_CHECK(first_slot >= 0 && n_slots >= 0, "window snapshots: slots [", first_slot, ", +", n_slots, ")");
}

int WindowSnapshots::find(uint64_t key) {
    const auto it = by_key_.find(key);
    if (it == by_key_.end()) return -1;
    lru_.splice(lru_.begin(), lru_, it->second.pos);
    return it->second.slot;
}

int WindowSnapshots::store(uint64_t key) {
    if (n_slots_ == 0 || by_key_.count(key)) return -1;
    int slot;
    if (int(by_key_.size()) < n_slots_) {
        slot = first_slot_ + int(by_key_.size());  // slots are handed out in order and never freed alone
    } else {
        const uint64_t victim = lru_.back();
        slot = by_key_.at(victim).slot;
        by_key_.erase(victim);
        lru_.pop_back();
    }
    lru_.push_front(key);
    by_key_[key] = Entry{slot, lru_.begin()};
    return slot;
}

void WindowSnapshots::clear() {
    by_key_.clear();
    lru_.clear();
}

void WindowSnapshots::check_invariants() const {
    OSPREY_CHECK(by_key_.size() == lru_.size() && int(by_key_.size()) <= n_slots_, "window snapshots: ", by_key_.size(),
                 " keys, ", lru_.size(), " in the LRU list, ", n_slots_, " slots");
    std::vector<uint8_t> used(size_t(n_slots_), 0);
    for (const auto& [key, e] : by_key_) {
        OSPREY_CHECK(e.slot >= first_slot_ && e.slot < first_slot_ + n_slots_, "window snapshot slot ", e.slot,
                     " outside [", first_slot_, ", ", first_slot_ + n_slots_, ")");
        OSPREY_CHECK(!used[size_t(e.slot - first_slot_)], "window snapshot slot ", e.slot, " holds two keys");
        used[size_t(e.slot - first_slot_)] = 1;
        OSPREY_CHECK(*e.pos == key, "window snapshot LRU entry does not match its key");
    }
}

}  // namespace osprey::engine
