// The epoll event loop (see server.h).
#include "http/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <unordered_set>

#include "core/check.h"
#include "core/log.h"

namespace osprey::http {

namespace {

using Clock = std::chrono::steady_clock;

// Longest stretch of job pumping per pass of the loop: what a socket event (a /health probe, a new
// request) can wait behind busy streams. The rest of the woken connections are woken again.
constexpr auto kPumpSlice = std::chrono::milliseconds(2);

constexpr uint64_t kListenTag = 0;
constexpr uint64_t kNotifyTag = UINT64_MAX;
constexpr uint64_t kStopTag = UINT64_MAX - 1;

void add_fd(int epoll_fd, int fd, uint32_t events, uint64_t tag) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = tag;
    OSPREY_CHECK(::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0, "epoll_ctl(ADD) failed: ", std::strerror(errno));
}

std::string openssl_error() {
    const unsigned long e = ERR_get_error();
    if (e == 0) return "unknown OpenSSL error";
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    ERR_clear_error();
    return buf;
}

// The client's address as raw bytes (IPv4-mapped IPv6 as IPv4), for the per-address limit.
std::string address_key(const sockaddr_storage& a) {
    if (a.ss_family == AF_INET) {
        const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
        return std::string(reinterpret_cast<const char*>(&v4.sin_addr), 4);
    }
    if (a.ss_family == AF_INET6) {
        const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
        if (IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr))
            return std::string(reinterpret_cast<const char*>(&v6.sin6_addr) + 12, 4);
        return std::string(reinterpret_cast<const char*>(&v6.sin6_addr), 16);
    }
    return "other";
}

double seconds(Clock::duration d) {
    return std::chrono::duration<double>(d).count();
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
    SSL* ssl = nullptr;                 // TLS session, when TLS is on
    bool tls_read_wants_write = false;  // a TLS read needs the socket writable first
    std::string peer;                   // address key (per_ip_)
    std::string in;                     // received, not yet parsed
    std::string out;                    // to send
    std::unique_ptr<AsyncJob> job;
    std::vector<std::pair<std::string, std::string>> job_headers;  // Reply::headers of the job
    bool job_streaming = false;
    bool job_paused = false;  // set_paused(true) was called (backpressure)
    bool keep_alive = true;   // of the request being answered
    bool close_after_flush = false;
    bool read_closed = false;  // the client shut down its side (EOF): answer, then close
    bool dead = false;         // close at the end of this event
    uint32_t events = 0;       // current epoll interest
    Clock::time_point last_activity = Clock::now();
    // The request being received: when its first byte came, whether its head is complete (then the
    // body's deadline), and whether 100 Continue was sent for it.
    bool receiving = false;
    Clock::time_point request_start;
    bool head_complete = false;
    Clock::time_point body_deadline;
    bool continue_sent = false;
    Clock::time_point last_write_progress = Clock::now();  // output sent, or output queued when none was
};

HttpServer::HttpServer(HttpServerOptions options, Handler handler)
    : options_(std::move(options)), handler_(std::move(handler)) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(options_.port);
    const int gai =
        ::getaddrinfo(options_.host.empty() ? nullptr : options_.host.c_str(), port.c_str(), &hints, &found);
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

    if (!options_.tls_cert_file.empty() || !options_.tls_key_file.empty()) {
        OSPREY_CHECK(!options_.tls_cert_file.empty() && !options_.tls_key_file.empty(),
                     "TLS needs both a certificate (--ssl-certfile) and a key (--ssl-keyfile)");
        SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
        OSPREY_CHECK(ctx, "SSL_CTX_new: ", openssl_error());
        ssl_ctx_ = ctx;
        SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
        SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION);
        SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
        OSPREY_CHECK(SSL_CTX_use_certificate_chain_file(ctx, options_.tls_cert_file.c_str()) == 1, "--ssl-certfile '",
                     options_.tls_cert_file, "': ", openssl_error());
        OSPREY_CHECK(SSL_CTX_use_PrivateKey_file(ctx, options_.tls_key_file.c_str(), SSL_FILETYPE_PEM) == 1,
                     "--ssl-keyfile '", options_.tls_key_file, "': ", openssl_error());
        OSPREY_CHECK(SSL_CTX_check_private_key(ctx) == 1,
                     "--ssl-keyfile does not match --ssl-certfile: ", openssl_error());
    }

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
    if (ssl_ctx_) SSL_CTX_free(static_cast<SSL_CTX*>(ssl_ctx_));
    // The notifier's eventfd stays open while jobs still hold wake-ups to it (they only write to it).
}

void HttpServer::stop() {
    stopping_ = true;
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t w = ::write(stop_fd_, &one, sizeof one);
}

void HttpServer::drain(double timeout_s) {
    const int64_t deadline =
        std::chrono::duration_cast<std::chrono::nanoseconds>(
            (Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                std::max(0.0, timeout_s))))
                .time_since_epoch())
            .count();
    int64_t old = drain_deadline_ns_.load();
    while ((!draining_ || deadline < old) && !drain_deadline_ns_.compare_exchange_weak(old, deadline)) {
    }
    draining_ = true;
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t w = ::write(stop_fd_, &one, sizeof one);
}

void HttpServer::abort_job(Connection& c) {
    AsyncJob::Progress p;
    try {
        p = c.job->abort("the server is shutting down");
    } catch (const std::exception& e) {
        log::error("aborting the request on connection ", c.id, ": ", e.what());
        c.job->cancel();
    }
    c.keep_alive = false;
    if (c.job_streaming) {
        if (!p.body.empty()) send(c, chunk(p.body));
        send(c, std::string(kLastChunk));
    } else {
        HttpResponse r = p.response ? std::move(*p.response) : error(503, "the server is shutting down");
        for (const auto& h : c.job_headers) r.headers.push_back(h);
        send(c, serialize(r, false));
    }
    c.job.reset();
    c.job_paused = false;
    c.close_after_flush = true;
    if (c.out.empty()) c.dead = true;
}

bool HttpServer::drain_step() {
    const int64_t now = Clock::now().time_since_epoch().count();
    bool jobs = false, pending = false;
    for (const auto& [id, c] : connections_) {
        jobs = jobs || c->job;
        pending = pending || !c->out.empty();
    }
    if (jobs && aborted_at_ns_ == 0 &&
        now >= std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(drain_deadline_ns_.load())).count()) {
        log::warn("shutdown: aborting the requests still running");
        aborted_at_ns_ = now;
        std::vector<uint64_t> ids;
        for (const auto& [id, c] : connections_)
            if (c->job) ids.push_back(id);
        for (uint64_t id : ids) {
            Connection& c = *connections_.at(id);
            abort_job(c);
            if (c.dead) close_connection(id);
        }
        return false;
    }
    if (!jobs && !pending) return true;
    // Output that the clients do not take is dropped 2 s after the abort (or after the last job ended).
    if (!jobs && aborted_at_ns_ == 0) aborted_at_ns_ = now;
    return aborted_at_ns_ != 0 && now - aborted_at_ns_ > std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(2)).count();
}

HttpResponse HttpServer::error(int status, const std::string& message) const {
    if (options_.error_response) return options_.error_response(status, message);
    return HttpResponse::text(status, message + "\n");
}

void HttpServer::run() {
    std::vector<epoll_event> events(256);
    auto last_sweep = Clock::now();
    while (!stopping_) {
        if (draining_ && drain_step()) break;
        const int n = ::epoll_wait(epoll_fd_, events.data(), int(events.size()), draining_ ? 50 : 1000);
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
                // Each woken connection once per pass (engine streams wake it per token), for at most
                // kPumpSlice: with hundreds of streaming clients an unbounded pass held /health for
                // seconds in the soak test.
                const std::vector<uint64_t> ids = notifier_->take();
                const auto pass_end = Clock::now() + kPumpSlice;
                std::unordered_set<uint64_t> seen;
                for (size_t i = 0; i < ids.size(); ++i) {
                    const uint64_t id = ids[i];
                    if (!seen.insert(id).second) continue;
                    if (Clock::now() >= pass_end) {
                        for (size_t j = i; j < ids.size(); ++j)
                            if (j == i || seen.insert(ids[j]).second) notifier_->wake(ids[j]);
                        break;
                    }
                    auto it = connections_.find(id);
                    if (it == connections_.end()) continue;
                    Connection& c = *it->second;
                    // A paused stream's events wait in its engine stream until the client reads again
                    // (flush() resumes it); draining them here would format up to max_output_bytes of
                    // SSE on this thread for nobody (the soak test's non-readers stalled /health seconds).
                    if (c.job && !c.job_paused) pump_job(c);
                    if (c.dead) close_connection(id);
                }
            } else {
                auto it = connections_.find(tag);
                if (it == connections_.end()) continue;
                Connection& c = *it->second;
                const uint32_t ev = events[i].events;
                if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) on_readable(c);
                // A reset (e.g. the answer to the probe a half-closed stream gets) or both sides shut.
                if (c.read_closed && (ev & (EPOLLHUP | EPOLLERR))) c.dead = true;
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
        sockaddr_storage addr{};
        socklen_t addr_len = sizeof addr;
        const int fd =
            ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &addr_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
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
        // Refusals are written in plain text, best effort (on a TLS port the client sees a closed
        // connection).
        auto refuse = [&](int status, const char* why) {
            if (!ssl_ctx_) {
                const std::string r = serialize(error(status, why), false);
                [[maybe_unused]] const ssize_t w = ::send(fd, r.data(), r.size(), MSG_NOSIGNAL);
            }
            ::close(fd);
        };
        std::string peer = address_key(addr);
        if (options_.max_connections_per_ip > 0) {
            auto it = per_ip_.find(peer);
            if (it != per_ip_.end() && it->second >= options_.max_connections_per_ip) {
                refuse(429, "too many connections from this address");
                continue;
            }
        }
        if (int(connections_.size()) >= options_.max_connections && !make_room()) {
            refuse(503, "too many connections");
            continue;
        }
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        auto c = std::make_unique<Connection>();
        c->id = next_id_++;
        c->fd = fd;
        if (ssl_ctx_) {
            c->ssl = SSL_new(static_cast<SSL_CTX*>(ssl_ctx_));
            if (!c->ssl || SSL_set_fd(c->ssl, fd) != 1) {
                log::warn("TLS session: ", openssl_error());
                if (c->ssl) SSL_free(c->ssl);
                ::close(fd);
                continue;
            }
            SSL_set_accept_state(c->ssl);
        }
        c->events = EPOLLIN | EPOLLRDHUP;
        ++per_ip_[peer];
        c->peer = std::move(peer);
        add_fd(epoll_fd_, fd, c->events, c->id);
        connections_.emplace(c->id, std::move(c));
        n_connections_ = connections_.size();
    }
}

bool HttpServer::make_room() {
    // A connection still sending its request (oldest first), else the longest-idle keep-alive one:
    // neither holds work, so slow or idle clients can never keep a new one out.
    Connection* victim = nullptr;
    bool victim_receiving = false;
    for (const auto& [id, c] : connections_) {
        if (c->job || !c->out.empty() || c->dead) continue;
        const bool receiving = c->receiving;
        const Clock::time_point t = receiving ? c->request_start : c->last_activity;
        if (!victim || (receiving && !victim_receiving) ||
            (receiving == victim_receiving && t < (victim_receiving ? victim->request_start : victim->last_activity))) {
            victim = c.get();
            victim_receiving = receiving;
        }
    }
    if (!victim) return false;
    close_connection(victim->id);
    return true;
}

HttpServer::Io HttpServer::read_some(Connection& c, char* buf, size_t n, size_t& got) {
    got = 0;
    if (c.ssl) {
        ERR_clear_error();
        const int r = SSL_read(c.ssl, buf, int(n));
        if (r > 0) {
            got = size_t(r);
            return Io::ok;
        }
        switch (SSL_get_error(c.ssl, r)) {
            case SSL_ERROR_WANT_READ:
                return Io::again;
            case SSL_ERROR_WANT_WRITE:
                c.tls_read_wants_write = true;
                return Io::again;
            case SSL_ERROR_ZERO_RETURN:
                return Io::eof;
            case SSL_ERROR_SYSCALL:
                return errno == EAGAIN || errno == EWOULDBLOCK ? Io::again : Io::failed;
            default:
                log::debug("TLS read on connection ", c.id, ": ", openssl_error());
                return Io::failed;
        }
    }
    while (true) {
        const ssize_t r = ::recv(c.fd, buf, n, 0);
        if (r > 0) {
            got = size_t(r);
            return Io::ok;
        }
        if (r == 0) return Io::eof;
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? Io::again : Io::failed;
    }
}

HttpServer::Io HttpServer::write_some(Connection& c, const char* data, size_t n, size_t& sent) {
    sent = 0;
    if (c.ssl) {
        ERR_clear_error();
        const int r = SSL_write(c.ssl, data, int(std::min<size_t>(n, 1 << 30)));
        if (r > 0) {
            sent = size_t(r);
            return Io::ok;
        }
        const int e = SSL_get_error(c.ssl, r);
        if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) return Io::again;
        return Io::failed;
    }
    while (true) {
        const ssize_t r = ::send(c.fd, data, n, MSG_NOSIGNAL);
        if (r > 0) {
            sent = size_t(r);
            return Io::ok;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Io::again;
        return Io::failed;
    }
}

void HttpServer::begin_request_clock(Connection& c) {
    c.receiving = !c.in.empty();
    c.request_start = Clock::now();
    c.head_complete = false;
    c.continue_sent = false;
}

void HttpServer::on_readable(Connection& c) {
    if (c.read_closed) return;
    char buf[16384];
    bool peer_closed = false;
    while (true) {
        size_t got = 0;
        const Io io = read_some(c, buf, sizeof buf, got);
        if (io == Io::ok) {
            c.in.append(buf, got);
            if (!c.receiving && !c.job) begin_request_clock(c);  // the first byte of a request
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
        if (io == Io::eof) peer_closed = true;
        if (io == Io::failed) {
            c.dead = true;  // reset or broken: nothing can be sent any more
            return;
        }
        break;
    }
    if (peer_closed) {
        // The client shut down its side: a half-close (RFC 9112 §9.6 lets it still read) or a full
        // close, which TCP cannot tell apart until we write. Requests received are answered; reading
        // stops. A stream in progress gets a comment line ("probe"): a client that has really gone
        // answers it with a reset, which cancels the job at once (also during a long prefill). A
        // non-streaming generation has nothing to write until it ends, so there an EOF counts as the
        // client leaving (as nginx and Go's net/http do) and cancels it.
        c.read_closed = true;
        update_interest(c);
        if (c.job && !c.job_streaming) {
            c.dead = true;
            return;
        }
        if (c.job && c.job_streaming) {
            send(c, chunk(":\n\n"));
            return;
        }
    }
    process(c);
    if (!c.dead && c.read_closed && !c.job && c.out.empty()) c.dead = true;  // nothing (more) to answer
}

void HttpServer::on_writable(Connection& c) {
    if (c.ssl && c.tls_read_wants_write) {
        c.tls_read_wants_write = false;
        on_readable(c);
        if (c.dead) return;
    }
    flush(c);
}

void HttpServer::process(Connection& c) {
    while (!c.job && !c.close_after_flush && !c.dead) {
        std::optional<HttpParseError> err;
        HttpParseProgress progress;
        std::optional<HttpRequest> request = parse_http_request(c.in, options_.limits, err, &progress);
        if (err) {
            c.keep_alive = false;
            c.close_after_flush = true;
            send(c, serialize(error(err->status, err->message), false));
            return;
        }
        if (!request) {
            if (progress.head_complete && !c.head_complete) {
                c.head_complete = true;
                c.body_deadline =
                    Clock::now() +
                    std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                        options_.header_timeout_s + double(progress.content_length) / options_.min_body_rate));
            }
            if (progress.expect_continue && !c.continue_sent) {
                c.continue_sent = true;  // the body may come (RFC 9110 §10.1.1)
                send(c, "HTTP/1.1 100 Continue\r\n\r\n");
            }
            if (c.read_closed && !c.in.empty()) {  // the rest of this request can never come
                c.in.clear();
                if (c.out.empty())
                    c.dead = true;
                else
                    c.close_after_flush = true;
            }
            return;
        }
        c.receiving = false;
        start_request(c, std::move(*request));
        if (!c.job) begin_request_clock(c);  // a pipelined request's clock starts when it can be read
    }
}

void HttpServer::start_request(Connection& c, HttpRequest request) {
    c.keep_alive = request.keep_alive && !stopping_ && !draining_ && !c.read_closed;
    Reply reply;
    try {
        reply = handler_(request);
    } catch (const std::exception& e) {
        reply = Reply(error(500, std::string("internal error: ") + e.what()));
    }
    if (!reply.job) {
        if (!c.keep_alive) c.close_after_flush = true;
        for (auto& h : reply.headers) reply.response.headers.push_back(std::move(h));
        send(c, serialize(reply.response, c.keep_alive));
        return;
    }
    c.job = std::move(reply.job);
    c.job_headers = std::move(reply.headers);
    c.job_streaming = c.job->streaming();
    c.job_paused = false;
    if (c.job_streaming) send(c, serialize_chunked_head(200, c.job->content_type(), c.keep_alive, c.job_headers));
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
    if (p.done && draining_) c.keep_alive = false;  // shutting down: no next request on this connection
    if (c.job_streaming) {
        if (!p.body.empty()) send(c, chunk(p.body));
        if (p.done) send(c, std::string(kLastChunk));
    } else if (p.done) {
        HttpResponse r = p.response ? std::move(*p.response) : error(500, "internal error: job ended without a response");
        for (const auto& h : c.job_headers) r.headers.push_back(h);
        send(c, serialize(r, c.keep_alive));
    }
    // The rest after the other ready work (and not while the client does not read).
    if (p.more && !p.done && !c.dead && !c.job_paused) notifier_->wake(c.id);
    if (!p.done || c.dead) return;
    c.job.reset();
    c.job_paused = false;
    if (!c.keep_alive) {
        c.close_after_flush = true;
        if (c.out.empty()) c.dead = true;
        return;
    }
    begin_request_clock(c);
    process(c);  // pipelined requests that arrived meanwhile
}

void HttpServer::send(Connection& c, std::string data) {
    if (c.dead) return;
    if (c.out.empty()) {
        c.out = std::move(data);
        c.last_write_progress = Clock::now();
    } else {
        c.out += data;
    }
    flush(c);
}

void HttpServer::flush(Connection& c) {
    size_t sent = 0;
    while (sent < c.out.size()) {
        size_t n = 0;
        const Io io = write_some(c, c.out.data() + sent, c.out.size() - sent, n);
        if (io == Io::ok) {
            sent += n;
            continue;
        }
        if (io == Io::again) break;
        c.dead = true;  // the peer is gone
        return;
    }
    c.out.erase(0, sent);
    if (sent > 0) c.last_activity = c.last_write_progress = Clock::now();
    if (c.out.empty() && c.close_after_flush && !c.job) {
        c.dead = true;
        return;
    }
    // Backpressure: a stream whose client does not keep up is paused, and cut off past the limit.
    if (c.job && c.job_streaming) {
        if (c.out.size() > options_.max_output_bytes) {
            log::warn("connection ", c.id, ": ", c.out.size(), " bytes unsent (limit ", options_.max_output_bytes,
                      "); the client does not read, cancelling its stream");
            c.dead = true;
            return;
        }
        if (!c.job_paused && c.out.size() > options_.stream_pause_bytes) {
            c.job_paused = true;
            c.job->set_paused(true);
        } else if (c.job_paused && c.out.size() <= options_.stream_pause_bytes / 2) {
            c.job_paused = false;
            c.job->set_paused(false);
            notifier_->wake(c.id);  // events that waited meanwhile
        }
    }
    update_interest(c);
}

void HttpServer::update_interest(Connection& c) {
    uint32_t want = c.read_closed ? 0u : uint32_t(EPOLLIN | EPOLLRDHUP);
    if (!c.out.empty() || c.tls_read_wants_write) want |= EPOLLOUT;
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
    if (c.ssl) {
        if (!c.dead) SSL_shutdown(c.ssl);  // close_notify, best effort (non-blocking)
        SSL_free(c.ssl);
    }
    ::close(c.fd);
    if (auto p = per_ip_.find(c.peer); p != per_ip_.end() && --p->second <= 0) per_ip_.erase(p);
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
    // Give memory freed after a burst back to the system once no request is in progress (glibc keeps
    // freed chunks in its arenas otherwise, and the RSS stays at the burst's peak).
    bool busy = false;
    for (const auto& [id, c] : connections_) busy = busy || c->job;
    if (!busy && trim_due_) {
        ::malloc_trim(0);
        trim_due_ = false;
    }
    if (busy) trim_due_ = true;
    std::vector<uint64_t> expired, late;
    for (const auto& [id, c] : connections_) {
        if (!c->out.empty()) {  // sending: the client must keep reading
            if (seconds(now - c->last_write_progress) > options_.write_timeout_s) expired.push_back(id);
            continue;
        }
        if (c->job) continue;  // a generation in progress is not idle
        if (c->receiving) {
            // The whole head within header_timeout_s of its first byte (not of the last one: a byte
            // every few seconds must not hold a connection for ever), then the body at min_body_rate.
            const bool over =
                c->head_complete ? now > c->body_deadline : seconds(now - c->request_start) > options_.header_timeout_s;
            if (over) late.push_back(id);
        } else if (seconds(now - c->last_activity) > options_.idle_timeout_s) {
            expired.push_back(id);
        }
    }
    for (uint64_t id : expired) close_connection(id);
    for (uint64_t id : late) {
        Connection& c = *connections_.at(id);
        c.keep_alive = false;
        c.close_after_flush = true;
        c.receiving = false;
        c.in.clear();
        send(c, serialize(error(408, "the request did not arrive in time"), false));
        if (c.dead || c.out.empty()) close_connection(id);
    }
}

}  // namespace osprey::http
