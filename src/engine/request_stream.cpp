// Per-request event queue (see request_stream.h).
#include "engine/request_stream.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/check.h"

namespace osprey::engine {

RequestStream::RequestStream(uint64_t uid, std::string id, int n_samples)
    : uid_(uid), id_(std::move(id)), n_samples_(n_samples) {}

RequestStream::~RequestStream() {
    if (fd_ >= 0) ::close(fd_);
}

void RequestStream::drain_fd_locked() {
    if (fd_ < 0 || !events_.empty()) return;
    uint64_t value = 0;
    while (::read(fd_, &value, sizeof value) < 0 && errno == EINTR) {
    }
}

std::optional<Event> RequestStream::try_pop() {
    std::function<void()> hook;
    std::optional<Event> e;
    {
        std::lock_guard lock(mu_);
        if (events_.empty()) return std::nullopt;
        e = std::move(events_.front());
        events_.pop_front();
        if (e->kind == Event::Kind::finish) ++n_finished_popped_;
        drain_fd_locked();
        hook = popped_locked();
    }
    if (hook) hook();
    return e;
}

std::function<void()> RequestStream::popped_locked() {
    backlog_ = events_.size();
    // The engine holds a request whose consumer lags kMaxBacklog events behind; wake it once the
    // consumer has caught up half way.
    return events_.size() == kMaxBacklog / 2 ? cancel_hook_ : nullptr;
}

Event RequestStream::pop() {
    std::unique_lock lock(mu_);
    OSPREY_CHECK(n_finished_popped_ < n_samples_ || !events_.empty(), "request '", id_, "' has no more events");
    cv_.wait(lock, [&] { return !events_.empty(); });
    return take_front(lock);
}

std::optional<Event> RequestStream::pop_for(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
    return take_front(lock);
}

Event RequestStream::take_front(std::unique_lock<std::mutex>& lock) {
    Event e = std::move(events_.front());
    events_.pop_front();
    if (e.kind == Event::Kind::finish) ++n_finished_popped_;
    drain_fd_locked();
    if (auto hook = popped_locked()) {
        lock.unlock();
        hook();
    }
    return e;
}

bool RequestStream::done() const {
    std::lock_guard lock(mu_);
    return n_finished_popped_ == n_samples_;
}

bool RequestStream::finished() const {
    std::lock_guard lock(mu_);
    return n_finished_pushed_ == n_samples_;
}

void RequestStream::cancel() {
    std::function<void()> hook;
    {
        std::lock_guard lock(mu_);
        if (cancel_ || n_finished_pushed_ == n_samples_) return;
        cancel_ = true;
        hook = cancel_hook_;
    }
    if (hook) hook();
}

bool RequestStream::cancel_requested() const {
    std::lock_guard lock(mu_);
    return cancel_;
}

void RequestStream::set_paused(bool paused) {
    std::function<void()> hook;
    {
        std::lock_guard lock(mu_);
        if (paused_.load() == paused) return;
        if (paused) paused_since_ns_ = std::chrono::steady_clock::now().time_since_epoch().count();
        paused_ = paused;
        if (!paused) hook = cancel_hook_;  // the engine may have work again
    }
    if (hook) hook();
}

std::chrono::steady_clock::time_point RequestStream::paused_since() const {
    return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(paused_since_ns_.load()));
}

void RequestStream::set_callback(std::function<void()> callback) {
    std::lock_guard lock(callback_mu_);
    callback_ = std::move(callback);
}

void RequestStream::set_cancel_hook(std::function<void()> hook) {
    std::lock_guard lock(mu_);
    cancel_hook_ = std::move(hook);
}

int RequestStream::notify_fd() {
    std::lock_guard lock(mu_);
    if (fd_ < 0) {
        fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        OSPREY_CHECK(fd_ >= 0, "eventfd failed: ", std::strerror(errno));
        if (!events_.empty()) {
            const uint64_t one = 1;
            [[maybe_unused]] const ssize_t w = ::write(fd_, &one, sizeof one);
        }
    }
    return fd_;
}

void RequestStream::push(Event event) {
    {
        std::lock_guard lock(mu_);
        OSPREY_CHECK(n_finished_pushed_ < n_samples_, "event for finished request '", id_, "'");
        if (event.kind == Event::Kind::finish) ++n_finished_pushed_;
        events_.push_back(std::move(event));
        backlog_ = events_.size();
        if (fd_ >= 0) {
            const uint64_t one = 1;
            [[maybe_unused]] const ssize_t w = ::write(fd_, &one, sizeof one);
        }
    }
    cv_.notify_all();
    std::lock_guard lock(callback_mu_);
    if (callback_) callback_();
}

}  // namespace osprey::engine
