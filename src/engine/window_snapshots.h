// Saved sliding-window rings for prefix-cache hits. A hit on a prefix of n full pages shares the
// full layers' pages but must rebuild the window ring of the hit's last position by replaying
// n_sliding_layers * (sliding_window - 1) tokens (model/forward_batch.h). The ring at a position
// depends only on the tokens before it, so once one sequence has rebuilt it, a copy kept in a spare
// window slot serves every later hit on the same prefix. Snapshots are keyed by the prefix cache's
// chain key of the prefix's last page; least recently used ones are overwritten. Bookkeeping only:
// the copies themselves are ModelRunner::copy_kv calls the engine runs before a step.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>

namespace osprey::engine {

class WindowSnapshots {
public:
    // Slots [first_slot, first_slot + n_slots) of the backend's window slots belong to snapshots.
    WindowSnapshots(int first_slot, int n_slots);
    int n_slots() const { return n_slots_; }
    int n_stored() const { return int(by_key_.size()); }

    // The slot holding the ring for `key`, marked most recently used; -1 when there is none.
    int find(uint64_t key);
    // A slot to copy the ring for `key` into (a free one, else the least recently used one, whose
    // old snapshot is dropped); -1 when `key` is already stored or there are no snapshot slots.
    int store(uint64_t key);
    void clear();  // forget every snapshot (their contents are unknown after a failed step)
    void check_invariants() const;

private:
    int first_slot_, n_slots_;
    std::list<uint64_t> lru_;  // most recently used first
    struct Entry {
        int slot;
        std::list<uint64_t>::iterator pos;
    };
    std::unordered_map<uint64_t, Entry> by_key_;
};

}  // namespace osprey::engine
