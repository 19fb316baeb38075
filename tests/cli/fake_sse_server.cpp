#include "fake_sse_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <stdexcept>

namespace osprey::test {

namespace {

void send_all(int fd, const std::string& s) {
    size_t at = 0;
    while (at < s.size()) {
        const ssize_t n = ::send(fd, s.data() + at, s.size() - at, MSG_NOSIGNAL);
        if (n <= 0) return;
        at += size_t(n);
    }
}

std::string hex(size_t n) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%zx", n);
    return buf;
}

// Sends `data` as two HTTP chunks split in the middle (so SSE events straddle chunk boundaries).
void send_split_chunks(int fd, const std::string& data) {
    const size_t half = data.size() / 2;
    for (const std::string& part : {data.substr(0, half), data.substr(half)})
        if (!part.empty()) send_all(fd, hex(part.size()) + "\r\n" + part + "\r\n");
}

}  // namespace

FakeSseServer::FakeSseServer(FakeSseOptions o) : o_(std::move(o)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 64) != 0)
        throw std::runtime_error("fake server: bind/listen failed");
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] {
        while (!stop_) {
            pollfd p{listen_fd_, POLLIN, 0};
            if (::poll(&p, 1, 50) <= 0) continue;
            const int fd = ::accept(listen_fd_, nullptr, nullptr);
            if (fd < 0) continue;
            handlers_.emplace_back([this, fd] { serve(fd); });
        }
    });
}

FakeSseServer::~FakeSseServer() {
    stop_ = true;
    acceptor_.join();
    for (auto& t : handlers_) t.join();
    ::close(listen_fd_);
}

std::string FakeSseServer::last_body() const {
    while (body_lock_.test_and_set()) {
    }
    std::string b = last_body_;
    body_lock_.clear();
    return b;
}

void FakeSseServer::serve(int fd) {
    std::string req;
    char buf[4096];
    size_t header_end = std::string::npos;
    size_t content_length = 0;
    for (;;) {
        if (header_end != std::string::npos && req.size() >= header_end + 4 + content_length) break;
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) {
            ::close(fd);
            return;
        }
        req.append(buf, size_t(n));
        if (header_end == std::string::npos && (header_end = req.find("\r\n\r\n")) != std::string::npos) {
            const size_t cl = req.find("Content-Length: ");
            if (cl != std::string::npos && cl < header_end) content_length = std::stoul(req.substr(cl + 16));
        }
    }
    if (req.rfind("GET /metrics", 0) == 0) {  // not an osprey server: no metrics
        ++metrics_requests_;
        send_all(fd, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        ::close(fd);
        return;
    }
    ++requests_;
    if (req.rfind("GET /v1/models", 0) == 0) {
        const std::string body = R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})";
        send_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
        ::close(fd);
        return;
    }
    while (body_lock_.test_and_set()) {
    }
    last_body_ = req.substr(header_end + 4);
    body_lock_.clear();
    if (o_.status != 200) {
        const std::string body = R"({"error":{"message":"overloaded","type":"server_error"}})";
        send_all(fd, "HTTP/1.1 " + std::to_string(o_.status) + " Error\r\nContent-Type: application/json\r\nContent-Length: " +
                         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
        ::close(fd);
        return;
    }
    send_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    auto event = [](const std::string& delta, const std::string& finish) {
        return "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":" + delta +
               ",\"finish_reason\":" + finish + "}]}\r\n\r\n";
    };
    send_split_chunks(fd, event(R"({"role":"assistant","content":""})", "null"));  // carries no text
    for (int i = 0; i < o_.n_reasoning; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(o_.delay_ms));
        send_split_chunks(fd, event("{\"" + o_.reasoning_field + "\":\"think" + std::to_string(i) + "\"}", "null"));
    }
    for (int i = 0; i < o_.n_content; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(o_.delay_ms));
        send_split_chunks(fd, event("{\"content\":\"word" + std::to_string(i) + "\"}", "null"));
    }
    send_split_chunks(fd, event("{}", "\"stop\""));
    if (o_.send_usage) {
        const int n = o_.n_reasoning + o_.n_content;
        send_split_chunks(fd, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":" +
                                  std::to_string(n) + "}}\n\n");
    }
    send_split_chunks(fd, "data: [DONE]\n\n");
    send_all(fd, "0\r\n\r\n");
    ::close(fd);
}

}  // namespace osprey::test
