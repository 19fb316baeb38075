// The epoll event loop (see server.h).
#include "http/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/check.h"
#include "core/log.h"

namespace osprey::http {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kListenTag = 0;
constexpr uint64_t kNotifyTag = UINT64_MAX;
constexpr uint64_t kStopTag = UINT64_MAX - 1;

void add_fd(int epoll_fd, int fd, uint32_t events, uint64_t tag) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = tag;
    OSPREY_CHECK(::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0, "epoll_ctl(ADD) failed: ", std::strerror(errno));
}

void drain_eventfd(int fd) {
    uint64_t value = 0;
    while (::read(fd, &value, sizeof value) > 0) {
    }
}

}  // namespace

// Connection ids whose jobs have news, handed from any thread to the loop.
class HttpServer::Notifier : public Waker {
public:
    explicit Notifier(int fd) : fd_(fd) {}
    ~Notifier() override { ::close(fd_); }
    void wake(uint64_t connection_id) override {
        bool first = false;
        {
            std::lock_guard lock(mu_);
            first = ready_.empty();
            ready_.push_back(connection_id);
        }
        if (first) {
            const uint64_t one = 1;
            [[maybe_unused]] const ssize_t w = ::write(fd_, &one, sizeof one);
        }
    }
    std::vector<uint64_t> take() {
        std::lock_guard lock(mu_);
        std::vector<uint64_t> out;
        out.swap(ready_);
        return out;
    }
    int fd() const { return fd_; }

private:
    const int fd_;
    std::mutex mu_;
    std::vector<uint64_t> ready_;
};

struct HttpServer::Connection {
    uint64_t id = 0;
    int fd = -1;
    std::string in;   // received, not yet parsed
    std::string out;  // to send
    std::unique_ptr<AsyncJob> job;
    bool job_streaming = false;
    bool keep_alive = true;         // of the request being answered
    bool close_after_flush = false;
    bool dead = false;              // close at the end of this event
    uint32_t events = 0;            // current epoll interest
    Clock::time_point last_activity = Clock::now();
};

HttpServer::HttpServer(HttpServerOptions options, Handler handler)
    : options_(std::move(options)), handler_(std::move(handler)) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(options_.port);
    const int gai = ::getaddrinfo(options_.host.empty() ? nullptr : options_.host.c_str(), port.c_str(), &hints, &found);
    OSPREY_CHECK(gai == 0, "--host '", options_.host, "': ", ::gai_strerror(gai));
    std::string last_error = "no address";
    for (addrinfo* a = found; a; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            last_error = std::strerror(errno);
            continue;
        }
        const int one = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
            listen_fd_ = fd;
            break;
        }
        last_error = std::strerror(errno);
        ::close(fd);
    }
    ::freeaddrinfo(found);
    OSPREY_CHECK(listen_fd_ >= 0, "cannot listen on ", options_.host, ":", options_.port, ": ", last_error);

    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                       : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);

    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    OSPREY_CHECK(epoll_fd_ >= 0, "epoll_create1 failed: ", std::strerror(errno));
    const int notify_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    stop_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    OSPREY_CHECK(notify_fd >= 0 && stop_fd_ >= 0, "eventfd failed: ", std::strerror(errno));
    notifier_ = std::make_shared<Notifier>(notify_fd);
    add_fd(epoll_fd_, listen_fd_, EPOLLIN, kListenTag);
    add_fd(epoll_fd_, notify_fd, EPOLLIN, kNotifyTag);
    add_fd(epoll_fd_, stop_fd_, EPOLLIN, kStopTag);
}

HttpServer::~HttpServer() {
    std::vector<uint64_t> ids;
    for (const auto& [id, c] : connections_) ids.push_back(id);
    for (uint64_t id : ids) close_connection(id);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
    if (stop_fd_ >= 0) ::close(stop_fd_);
    // The notifier's eventfd stays open while jobs still hold wake-ups to it (they only write to it).
}

void HttpServer::stop() {
    stopping_ = true;
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t w = ::write(stop_fd_, &one, sizeof one);
}

HttpResponse HttpServer::error(int status, const std::string& message) const {
    if (options_.error_response) return options_.error_response(status, message);
    return HttpResponse::text(status, message + "\n");
}

void HttpServer::run() {
    std::vector<epoll_event> events(256);
    auto last_sweep = Clock::now();
    while (!stopping_) {
        const int n = ::epoll_wait(epoll_fd_, events.data(), int(events.size()), 1000);
        if (n < 0) {
            OSPREY_CHECK(errno == EINTR, "epoll_wait failed: ", std::strerror(errno));
            continue;
        }
        for (int i = 0; i < n; ++i) {
            const uint64_t tag = events[i].data.u64;
            if (tag == kListenTag) {
                accept_all();
            } else if (tag == kStopTag) {
                drain_eventfd(stop_fd_);
            } else if (tag == kNotifyTag) {
                drain_eventfd(notifier_->fd());
                for (uint64_t id : notifier_->take()) {
                    auto it = connections_.find(id);
                    if (it == connections_.end()) continue;
                    Connection& c = *it->second;
                    if (c.job) pump_job(c);
                    if (c.dead) close_connection(id);
                }
            } else {
                auto it = connections_.find(tag);
                if (it == connections_.end()) continue;
                Connection& c = *it->second;
                const uint32_t ev = events[i].events;
                if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) on_readable(c);
                if (!c.dead && (ev & EPOLLOUT)) on_writable(c);
                if (c.dead) close_connection(tag);
            }
        }
        if (Clock::now() - last_sweep > std::chrono::seconds(1)) {
            sweep_timeouts();
            last_sweep = Clock::now();
        }
    }
}

void HttpServer::accept_all() {
    while (true) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR) continue;
            if (errno == EMFILE || errno == ENFILE) {
                // Out of file descriptors: the listening socket would stay readable and spin the loop,
                // so stop watching it until the next sweep (a second), when connections may have closed.
                log::warn("accept: ", std::strerror(errno), " (", connections_.size(),
                          " connections open); pausing accept for a second");
                epoll_event ev{};
                ev.data.u64 = kListenTag;
                ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
                accept_paused_ = true;
            } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
                log::warn("accept failed: ", std::strerror(errno));
            }
            return;
        }
        if (int(connections_.size()) >= options_.max_connections) {
            const std::string r = serialize(error(503, "too many connections"), false);
            [[maybe_unused]] const ssize_t w = ::send(fd, r.data(), r.size(), MSG_NOSIGNAL);
            ::close(fd);
            continue;
        }
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        auto c = std::make_unique<Connection>();
        c->id = next_id_++;
        c->fd = fd;
        c->events = EPOLLIN | EPOLLRDHUP;
        add_fd(epoll_fd_, fd, c->events, c->id);
        connections_.emplace(c->id, std::move(c));
        n_connections_ = connections_.size();
    }
}

void HttpServer::on_readable(Connection& c) {
    char buf[16384];
    bool peer_closed = false;
    while (true) {
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n > 0) {
            c.in.append(buf, size_t(n));
            c.last_activity = Clock::now();
            // A client that sends more than a whole request's worth while its previous one is still
            // being answered is not pipelining but flooding: drop it rather than buffer without bound.
            if (c.job && c.in.size() > options_.limits.max_header_bytes + options_.limits.max_body_bytes + 65536) {
                log::warn("connection ", c.id, ": more than a request's worth of bytes sent ahead; closing it");
                c.dead = true;
                return;
            }
            continue;
        }
        if (n == 0) {
            peer_closed = true;
        } else if (errno == EINTR) {
            continue;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
            peer_closed = true;
        }
        break;
    }
    if (peer_closed) {
        // A client that goes away cancels what it asked for; nothing can be sent to it any more.
        c.dead = true;
        return;
    }
    process(c);
}

void HttpServer::on_writable(Connection& c) { flush(c); }

void HttpServer::process(Connection& c) {
    while (!c.job && !c.close_after_flush && !c.dead) {
        std::optional<HttpParseError> err;
        std::optional<HttpRequest> request = parse_http_request(c.in, options_.limits, err);
        if (err) {
            c.keep_alive = false;
            c.close_after_flush = true;
            send(c, serialize(error(err->status, err->message), false));
            return;
        }
        if (!request) return;
        start_request(c, std::move(*request));
    }
}

void HttpServer::start_request(Connection& c, HttpRequest request) {
    c.keep_alive = request.keep_alive && !stopping_;
    Reply reply;
    try {
        reply = handler_(request);
    } catch (const std::exception& e) {
        reply = Reply(error(500, std::string("internal error: ") + e.what()));
    }
    if (!reply.job) {
        if (!c.keep_alive) c.close_after_flush = true;
        send(c, serialize(reply.response, c.keep_alive));
        return;
    }
    c.job = std::move(reply.job);
    c.job_streaming = c.job->streaming();
    if (c.job_streaming) send(c, serialize_chunked_head(200, c.job->content_type(), c.keep_alive));
    std::weak_ptr<Notifier> weak = notifier_;
    const uint64_t id = c.id;
    c.job->start([weak, id] {
        if (auto n = weak.lock()) n->wake(id);
    });
    pump_job(c);
}

void HttpServer::pump_job(Connection& c) {
    AsyncJob::Progress p;
    try {
        p = c.job->poll();
    } catch (const std::exception& e) {
        // A job that throws ends its response (a stream is cut off after an error event is impossible
        // to format here; the client sees the stream end).
        log::error("request on connection ", c.id, " failed: ", e.what());
        c.job->cancel();
        p.done = true;
        if (!c.job_streaming) p.response = error(500, std::string("internal error: ") + e.what());
    }
    if (c.job_streaming) {
        if (!p.body.empty()) send(c, chunk(p.body));
        if (p.done) send(c, std::string(kLastChunk));
    } else if (p.done) {
        send(c, serialize(p.response ? *p.response : error(500, "internal error: job ended without a response"),
                          c.keep_alive));
    }
    if (!p.done) return;
    c.job.reset();
    if (!c.keep_alive) {
        c.close_after_flush = true;
        if (c.out.empty()) c.dead = true;
        return;
    }
    process(c);  // pipelined requests that arrived meanwhile
}

void HttpServer::send(Connection& c, std::string data) {
    if (c.dead) return;
    if (c.out.empty()) {
        c.out = std::move(data);
    } else {
        c.out += data;
    }
    flush(c);
}

void HttpServer::flush(Connection& c) {
    size_t sent = 0;
    while (sent < c.out.size()) {
        const ssize_t n = ::send(c.fd, c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL);
        if (n > 0) {
            sent += size_t(n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        c.dead = true;  // the peer is gone
        return;
    }
    c.out.erase(0, sent);
    if (sent > 0) c.last_activity = Clock::now();
    if (c.out.empty() && c.close_after_flush && !c.job) {
        c.dead = true;
        return;
    }
    update_interest(c);
}

void HttpServer::update_interest(Connection& c) {
    const uint32_t want = EPOLLIN | EPOLLRDHUP | (c.out.empty() ? 0u : uint32_t(EPOLLOUT));
    if (want == c.events) return;
    epoll_event ev{};
    ev.events = want;
    ev.data.u64 = c.id;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev) == 0) c.events = want;
}

void HttpServer::close_connection(uint64_t id) {
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    Connection& c = *it->second;
    if (c.job) c.job->cancel();
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
    ::close(c.fd);
    connections_.erase(it);
    n_connections_ = connections_.size();
}

void HttpServer::sweep_timeouts() {
    if (accept_paused_) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = kListenTag;
        if (::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev) == 0) accept_paused_ = false;
    }
    const auto now = Clock::now();
    std::vector<uint64_t> expired;
    for (const auto& [id, c] : connections_) {
        if (c->job) continue;  // a generation in progress is not idle
        const double idle = std::chrono::duration<double>(now - c->last_activity).count();
        const double limit = c->in.empty() ? options_.idle_timeout_s : options_.header_timeout_s;
        if (idle > limit) expired.push_back(id);
    }
    for (uint64_t id : expired) close_connection(id);
}

}  // namespace osprey::http
