// The background worker (see worker.h).
#include "server/worker.h"

#include "core/log.h"

namespace osprey::server {

Worker::Worker(size_t max_queued) : max_queued_(max_queued), thread_([this] { loop(); }) {}

Worker::~Worker() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
        tasks_.clear();
    }
    cv_.notify_all();
    thread_.join();
}

bool Worker::post(std::function<void()> task) {
    {
        std::lock_guard lock(mu_);
        if (tasks_.size() >= max_queued_) return false;
        tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
    return true;
}

void Worker::loop() {
    for (;;) {
        std::function<void()> task;
        {
            std::unique_lock lock(mu_);
            cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
            if (stop_) return;
            task = std::move(tasks_.front());
            tasks_.pop_front();
        }
        try {
            task();
        } catch (const std::exception& e) {
            log::error("background task failed: ", e.what());
        }
    }
}

}  // namespace osprey::server
