#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace osprey {

ThreadPool::ThreadPool(int n_threads) {
    if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_start_.notify_all();
    for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
    static ThreadPool pool([] {
        const char* env = std::getenv("OSPREY_THREADS");
        return env ? std::atoi(env) : 0;
    }());
    return pool;
}

void ThreadPool::worker_loop(int) {
    uint64_t seen = 0;
    for (;;) {
        std::unique_lock lock(mu_);
        cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        while (next_chunk_ < n_chunks_) {
            const int64_t c = next_chunk_++;
            const auto* fn = job_;
            const int64_t b = c * job_chunk_, e = std::min(job_n_, b + job_chunk_);
            lock.unlock();
            try {
                (*fn)(b, e);
            } catch (...) {
                std::lock_guard g(mu_);
                if (!error_) error_ = std::current_exception();
            }
            lock.lock();
        }
        if (--pending_ == 0) cv_done_.notify_all();
    }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    const int64_t max_chunks = std::max<int64_t>(1, (n + grain - 1) / grain);
    const int64_t n_chunks = std::min<int64_t>(max_chunks, int64_t(n_threads()) * 4);
    if (workers_.empty() || n_chunks == 1) {
        fn(0, n);
        return;
    }
    std::lock_guard run(run_mu_);
    std::unique_lock lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = (n + n_chunks - 1) / n_chunks;
    n_chunks_ = (n + job_chunk_ - 1) / job_chunk_;
    next_chunk_ = 0;
    pending_ = int(workers_.size()) + 1;
    error_ = nullptr;
    ++generation_;
    cv_start_.notify_all();
    while (next_chunk_ < n_chunks_) {
        const int64_t c = next_chunk_++;
        const int64_t b = c * job_chunk_, e = std::min(job_n_, b + job_chunk_);
        lock.unlock();
        try {
            fn(b, e);
        } catch (...) {
            std::lock_guard g(mu_);
            if (!error_) error_ = std::current_exception();
        }
        lock.lock();
    }
    --pending_;
    cv_done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
}

}  // namespace osprey
