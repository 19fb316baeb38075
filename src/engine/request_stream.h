// The per-request event queue between the engine thread (producer) and one consumer (an HTTP
// handler, the CLI, a test). Thread-safe: blocking and non-blocking pops, an optional callback run
// on the engine thread after each push, and an optional eventfd that is readable while events wait.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "engine/request.h"

namespace osprey::engine {

class RequestStream {
public:
    RequestStream(uint64_t uid, std::string id, int n_samples);
    ~RequestStream();
    RequestStream(const RequestStream&) = delete;
    RequestStream& operator=(const RequestStream&) = delete;

    uint64_t uid() const { return uid_; }  // unique per engine, in submission order
    const std::string& id() const { return id_; }
    int n_samples() const { return n_samples_; }

    std::optional<Event> try_pop();  // non-blocking
    Event pop();                     // blocks until an event arrives; throws osprey::Error when done()
    std::optional<Event> pop_for(std::chrono::milliseconds timeout);
    // True once every sample's finish event has been popped.
    bool done() const;
    // True once every sample has finished (its finish event may still be queued).
    bool finished() const;

    // Asks the engine to stop this request: each unfinished sample ends with reason abort. Safe from
    // any thread, at any time, any number of times (no effect after the request finished).
    void cancel();
    bool cancel_requested() const;

    // Backpressure: the consumer cannot take more output now (its client does not read). The engine
    // stops scheduling the request's samples while paused and, once paused longer than
    // EngineOptions::paused_release_s, preempts them (frees their pages and batch slots) and does not
    // readmit them until unpaused. Safe from any thread; unpausing wakes the engine.
    void set_paused(bool paused);
    bool paused() const { return paused_.load(std::memory_order_relaxed); }
    // Events pushed and not yet popped. The engine also holds a request (schedules none of its
    // samples) while kMaxBacklog events wait, so a consumer slower than the engine (a busy event
    // loop) never makes this queue grow without bound.
    size_t backlog() const { return backlog_.load(std::memory_order_relaxed); }
    static constexpr size_t kMaxBacklog = 4096;
    bool held() const { return paused() || backlog() >= kMaxBacklog; }
    std::chrono::steady_clock::time_point paused_since() const;

    // Called on the engine thread after events are pushed (keep it short: e.g. wake an event loop;
    // it may pop events but must not call set_callback). Once set_callback returns, the previous
    // callback is not running and never runs again, so an owner can clear it before dying.
    void set_callback(std::function<void()> callback);
    // A Linux eventfd that is readable while events are queued (created on first call; the stream
    // owns and closes it). For poll/epoll-based servers.
    int notify_fd();

    // Engine side.
    void push(Event event);
    void set_cancel_hook(std::function<void()> hook);  // run by cancel() (wakes the engine thread)

private:
    void drain_fd_locked();
    std::function<void()> popped_locked();  // after a pop: the engine's wake-up, when it is due
    // pop()'s and pop_for()'s common end: the front event out (with the lock held on entry; released
    // before the engine's wake-up runs).
    Event take_front(std::unique_lock<std::mutex>& lock);

    const uint64_t uid_;
    const std::string id_;
    const int n_samples_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Event> events_;
    int n_finished_pushed_ = 0;
    int n_finished_popped_ = 0;
    bool cancel_ = false;
    std::mutex callback_mu_;  // held while the callback runs and while it is replaced
    std::function<void()> callback_;
    std::function<void()> cancel_hook_;
    int fd_ = -1;
    std::atomic<bool> paused_{false};
    std::atomic<size_t> backlog_{0};
    std::atomic<int64_t> paused_since_ns_{0};  // steady_clock, when paused_ last became true
};

}  // namespace osprey::engine
