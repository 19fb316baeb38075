// An HTTP/1.1 server on one epoll event loop (ours): non-blocking sockets, keep-alive, pipelined
// requests answered in order, responses that complete later (asynchronous jobs, e.g. a generation)
// and chunked streaming (server-sent events), optionally over TLS (OpenSSL). Idle connections cost a
// file descriptor and a few buffers, never a thread. A job's producer (the engine thread) wakes the
// loop through wake(); a client that disconnects gets its job cancelled at once.
//
// Limits against slow and hostile clients (docs/architecture.md, "HTTP limits"): a deadline for the
// whole request head, a minimum body rate, connections per client address, eviction of the oldest
// connection still sending its head when the table is full, a write timeout, and per-stream output
// bounds: a stream whose client does not read is paused (AsyncJob::set_paused) past
// stream_pause_bytes of unsent output and cancelled past max_output_bytes.
// Tests: tests/server/test_server_e2e.cpp, tests/server/test_server_hardening.cpp (in-process).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "http/message.h"

namespace osprey::http {

// Wakes the event loop for one connection's job; safe from any thread, and after the connection or
// the server is gone (then it does nothing).
class Waker {
public:
    virtual ~Waker() = default;
    virtual void wake(uint64_t connection_id) = 0;
};

// A response that is produced over time. The loop calls poll() after start and whenever the job's
// wake-up function (given to start()) is called.
class AsyncJob {
public:
    virtual ~AsyncJob() = default;
    // Streaming jobs get a chunked head (`content_type`, status 200) before their first bytes.
    virtual bool streaming() const = 0;
    virtual std::string content_type() const { return "text/event-stream"; }
    // Registers the wake-up (call it from any thread when poll() has something new).
    virtual void start(std::function<void()> wake) = 0;

    struct Progress {
        std::string body;  // streaming: bytes for the next chunk(s)
        bool done = false;
        bool more = false;                     // more is ready now: poll again (after other work)
        std::optional<HttpResponse> response;  // non-streaming: the whole response once done
    };
    virtual Progress poll() = 0;
    // The client went away (or the server is stopping): stop the work.
    virtual void cancel() = 0;
    // Backpressure for streaming jobs: the client is not reading, so stop producing (true) until
    // its output drains (false). Optional.
    virtual void set_paused(bool paused) {}
    // The server is shutting down and waits no longer (HttpServer::drain): stop the work and say how
    // the response ends. Streaming: Progress::body holds the stream's last bytes (e.g. an error
    // event, then the end marker); not streaming: Progress::response (default: a 503 error).
    virtual Progress abort(const std::string& reason) {
        cancel();
        return {};
    }
};

struct Reply {
    HttpResponse response;  // used when job is null
    std::unique_ptr<AsyncJob> job;
    // Extra headers for the job's response: the streamed head, or appended to a non-streaming job's
    // response (e.g. CORS and X-Request-Id, which depend on the request).
    std::vector<std::pair<std::string, std::string>> headers;

    Reply() = default;
    Reply(HttpResponse r) : response(std::move(r)) {}
    Reply(std::unique_ptr<AsyncJob> j) : job(std::move(j)) {}
};

// Called on the loop thread for each request; must be quick (it may submit work elsewhere and return
// a job). An exception escaping it becomes a 500 with its message.
using Handler = std::function<Reply(const HttpRequest&)>;

struct HttpServerOptions {
    std::string host = "127.0.0.1";
    int port = 8000;  // 0: any free port (see port())
    HttpLimits limits;
    // Open connections. When full, the connection that has been sending its request head the longest
    // (or else the longest-idle keep-alive one) is closed for the newcomer; only when every
    // connection has a request in progress is the newcomer refused (503).
    int max_connections = 10000;
    int max_connections_per_ip = 1024;  // per client address (429 beyond); 0: no limit (behind a proxy)
    double idle_timeout_s = 120;        // keep-alive connections idle this long are closed
    double header_timeout_s = 10;       // the whole request head (line + headers) within this, from its first byte
    // Bodies must arrive at this rate at least: header_timeout_s + Content-Length / min_body_rate after
    // the head (408 otherwise).
    double min_body_rate = 64 * 1024;  // bytes per second
    double write_timeout_s = 60;       // output pending without progress this long: connection closed
    // A streaming response with more than this much unsent output is paused (its client reads too
    // slowly), and resumed below half of it.
    size_t stream_pause_bytes = 256 * 1024;
    // Unsent output above this cancels the job and closes the connection.
    size_t max_output_bytes = 16 * 1024 * 1024;
    // TLS (https) when both are set: PEM certificate chain and private key.
    std::string tls_cert_file;
    std::string tls_key_file;
    // Builds the error body for transport-level failures (bad request line, 413, 431, ...).
    std::function<HttpResponse(int status, const std::string& message)> error_response;
};

class HttpServer {
public:
    HttpServer(HttpServerOptions options, Handler handler);  // binds and listens (throws osprey::Error)
    ~HttpServer();
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    int port() const { return port_; }  // the bound port
    // Runs the loop on the calling thread until stop().
    void run();
    // From any thread (or a signal handler: it only writes to an eventfd).
    void stop();
    // Graceful stop, from any thread: keep-alive ends, requests in progress get `timeout_s` more
    // seconds to finish; then every job still running is aborted (AsyncJob::abort: a stream gets its
    // closing bytes) and run() returns once the output is flushed (at most 2 s later). New requests
    // are still read and handed to the handler, which decides what to answer (503 while draining).
    // A second call can shorten the timeout (e.g. 0 on a second signal).
    void drain(double timeout_s);
    bool draining() const { return draining_.load(); }

    size_t n_connections() const { return n_connections_.load(); }
    bool tls() const { return ssl_ctx_ != nullptr; }

private:
    struct Connection;
    class Notifier;
    enum class Io { ok, again, eof, failed };

    void accept_all();
    void on_readable(Connection& c);
    void on_writable(Connection& c);
    void process(Connection& c);
    void start_request(Connection& c, HttpRequest request);
    void pump_job(Connection& c);
    void send(Connection& c, std::string data);
    void flush(Connection& c);
    void update_interest(Connection& c);
    void close_connection(uint64_t id);
    void sweep_timeouts();
    bool drain_step();  // while draining: aborts jobs past the deadline; true when run() may return
    void abort_job(Connection& c);
    bool make_room();  // closes one connection that holds no request in progress; false if none
    Io read_some(Connection& c, char* buf, size_t n, size_t& got);
    Io write_some(Connection& c, const char* data, size_t n, size_t& sent);
    void begin_request_clock(Connection& c);
    HttpResponse error(int status, const std::string& message) const;

    HttpServerOptions options_;
    Handler handler_;
    int listen_fd_ = -1;
    int epoll_fd_ = -1;
    int stop_fd_ = -1;
    int port_ = 0;
    std::shared_ptr<Notifier> notifier_;
    std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
    uint64_t next_id_ = 1;
    std::atomic<size_t> n_connections_{0};
    std::atomic<bool> stopping_{false};
    std::atomic<bool> draining_{false};
    std::atomic<int64_t> drain_deadline_ns_{0};  // steady_clock: abort jobs still running after this
    int64_t aborted_at_ns_ = 0;                  // when jobs were aborted (0: not yet); loop thread only
    bool accept_paused_ = false;                   // out of file descriptors: the listening socket is not watched
    std::unordered_map<std::string, int> per_ip_;  // open connections by client address (raw bytes)
    void* ssl_ctx_ = nullptr;                      // SSL_CTX*, when TLS is on
    bool trim_due_ = false;                        // requests ran since memory was last trimmed
};

}  // namespace osprey::http
