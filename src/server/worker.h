// One background thread for work that must not run on the event loop (rendering /metrics), with a
// bounded queue: post() refuses work beyond `max_queued` tasks instead of letting a flood of
// requests queue without bound. Tests: tests/server/test_server_hardening.cpp.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace osprey::server {

class Worker {
public:
    explicit Worker(size_t max_queued);
    ~Worker();  // finishes the task running, drops the queued ones
    Worker(const Worker&) = delete;
    Worker& operator=(const Worker&) = delete;

    // Queues `task`; false (and nothing queued) when max_queued tasks already wait.
    bool post(std::function<void()> task);

private:
    void loop();

    const size_t max_queued_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> tasks_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace osprey::server
