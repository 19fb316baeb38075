// A minimal OpenAI-style streaming server on a loopback port, for testing the load generator
// without a model: GET /v1/models lists one model; POST /v1/chat/completions answers with a
// chunked text/event-stream of `n_reasoning` reasoning deltas (field `reasoning_field`), then
// `n_content` content deltas, `delay_ms` apart, then a usage event and [DONE]. Event bytes are
// split across chunk boundaries on purpose.
#pragma once

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace osprey::test {

struct FakeSseOptions {
    int n_reasoning = 3;
    int n_content = 4;
    int delay_ms = 20;
    std::string reasoning_field = "reasoning_content";
    bool send_usage = true;
    int status = 200;  // != 200: an error body instead of the stream
};

class FakeSseServer {
public:
    explicit FakeSseServer(FakeSseOptions o);
    ~FakeSseServer();
    int port() const { return port_; }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
    int requests_seen() const { return requests_.load(); }  // GET /metrics (answered 404) not counted
    int metrics_requests_seen() const { return metrics_requests_.load(); }
    std::string last_body() const;

private:
    void serve(int fd);
    FakeSseOptions o_;
    int listen_fd_ = -1;
    int port_ = 0;
    std::atomic<bool> stop_{false};
    std::atomic<int> requests_{0};
    std::atomic<int> metrics_requests_{0};
    std::thread acceptor_;
    std::vector<std::thread> handlers_;
    std::string last_body_;
    mutable std::atomic_flag body_lock_ = ATOMIC_FLAG_INIT;
};

}  // namespace osprey::test
