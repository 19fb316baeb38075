// A fixed pool of worker threads with a blocking parallel_for, for the CPU backend's loops.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace osprey {

class ThreadPool {
public:
    // n_threads <= 0 means std::thread::hardware_concurrency().
    explicit ThreadPool(int n_threads = 0);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int n_threads() const { return int(workers_.size()) + 1; }

    // Calls fn(begin, end) on disjoint chunks covering [0, n), on the pool and the calling thread,
    // and returns when all are done. Chunks hold at least `grain` items. Not reentrant: fn must not
    // call parallel_for on the same pool. The first exception thrown by fn is rethrown here.
    void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

    // A process-wide pool for code that has no pool of its own.
    static ThreadPool& global();

private:
    void worker_loop(int index);

    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable cv_start_, cv_done_;
    const std::function<void(int64_t, int64_t)>* job_ = nullptr;
    int64_t job_n_ = 0, job_chunk_ = 0;
    int64_t next_chunk_ = 0, n_chunks_ = 0;
    int pending_ = 0;
    uint64_t generation_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
    std::mutex run_mu_;  // serialises callers of parallel_for
};

}  // namespace osprey
