// Ids of the sliding-window rings: each running sequence owns one slot of `sliding_window` rows
// for all sliding-attention layers, whatever its length (model/forward_batch.h).
#pragma once

#include <cstdint>
#include <vector>

namespace osprey::engine {

class WindowSlots {
public:
    explicit WindowSlots(int n_slots);
    int n_slots() const { return int(in_use_.size()); }
    int n_free() const { return int(free_.size()); }
    bool in_use(int slot) const;

    int allocate();  // precondition: n_free() > 0 (else osprey::Error)
    void release(int slot);
    void check_invariants() const;

private:
    std::vector<uint8_t> in_use_;  // [n_slots]
    std::vector<int> free_;        // stack; slot 0 is handed out first
};

}  // namespace osprey::engine
