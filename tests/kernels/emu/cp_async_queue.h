// cp.async (mma.cuh) for the CPU emulations (wgmma_emulation.h): copies are queued per thread and land
// only when a cp.async.wait_group retires their group, so a kernel that reads a stage before waiting for
// it (or waits for the wrong count) sees stale bytes. An emulation's cp_async16 / cp_async4 checks its
// own address rules and then calls cp_async_enqueue.
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

namespace osprey::cuda {

struct PendingCopy {
    void* dst;
    const void* src;
    bool valid;
    int bytes = 16;
};
inline thread_local std::deque<std::vector<PendingCopy>> t_cp_groups;  // committed groups, oldest first
inline thread_local std::vector<PendingCopy> t_cp_open;                // not yet committed

inline void cp_async_enqueue(void* dst, const void* src, bool valid, int bytes) {
    t_cp_open.push_back({dst, src, valid, bytes});
}
inline void cp_async_commit() {
    t_cp_groups.push_back(std::move(t_cp_open));
    t_cp_open.clear();
}
template <int kPending>
inline void cp_async_wait() {
    while (int(t_cp_groups.size()) > kPending) {
        for (const PendingCopy& c : t_cp_groups.front()) {
            if (c.valid)
                std::memcpy(c.dst, c.src, size_t(c.bytes));
            else
                std::memset(c.dst, 0, size_t(c.bytes));
        }
        t_cp_groups.pop_front();
    }
}
inline void cp_async_wait_all() {
    cp_async_commit();
    cp_async_wait<0>();
}

}  // namespace osprey::cuda
