#include "benchtool/http_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/check.h"

namespace osprey::benchtool {

namespace {

constexpr size_t kMaxHeaderBytes = 64 << 10;

std::string lower(std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return std::string(s);
}

// A connected socket with a read buffer; every wait is bounded by the timeout.
class Connection {
public:
    Connection(const Url& url, double timeout_s) : timeout_ms_(int(std::max(1.0, timeout_s * 1000))) {
        addrinfo hints{};
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* res = nullptr;
        const std::string port = std::to_string(url.port);
        const int rc = ::getaddrinfo(url.host.c_str(), port.c_str(), &hints, &res);
        OSPREY_CHECK(rc == 0, "cannot resolve '", url.host, "': ", gai_strerror(rc));
        std::string last_error = "no address";
        for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
            const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
            if (fd < 0) continue;
            if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
                fd_ = fd;
            } else {
                last_error = std::strerror(errno);
                ::close(fd);
            }
        }
        ::freeaddrinfo(res);
        OSPREY_CHECK(fd_ >= 0, "cannot connect to ", url.host, ":", url.port, ": ", last_error);
        const int one = 1;
        ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    ~Connection() {
        if (fd_ >= 0) ::close(fd_);
    }
    Connection(const Connection&) = delete;
    Connection& operator=(const Connection&) = delete;

    void send_all(std::string_view data) {
        while (!data.empty()) {
            wait(POLLOUT);
            const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR) continue;
            OSPREY_CHECK(n > 0, "sending the request failed: ", std::strerror(errno));
            data.remove_prefix(size_t(n));
        }
    }
    // Reads more bytes into the buffer; false at end of stream.
    bool fill() {
        char tmp[16384];
        for (;;) {
            wait(POLLIN);
            const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
            if (n < 0 && errno == EINTR) continue;
            OSPREY_CHECK(n >= 0, "reading the response failed: ", std::strerror(errno));
            if (n == 0) return false;
            buf_.append(tmp, size_t(n));
            return true;
        }
    }
    // One line without its CRLF (or LF).
    std::string read_line(size_t limit) {
        for (;;) {
            const size_t nl = buf_.find('\n');
            if (nl != std::string::npos) {
                std::string l = buf_.substr(0, nl);
                buf_.erase(0, nl + 1);
                if (!l.empty() && l.back() == '\r') l.pop_back();
                return l;
            }
            OSPREY_CHECK(buf_.size() <= limit, "response line longer than ", limit, " bytes");
            OSPREY_CHECK(fill(), "connection closed in the middle of the response headers");
        }
    }
    // Passes exactly n bytes to fn (in pieces).
    void read_exact(size_t n, const std::function<void(std::string_view)>& fn) {
        while (n > 0) {
            if (buf_.empty()) OSPREY_CHECK(fill(), "connection closed with ", n, " body bytes still expected");
            const size_t take = std::min(n, buf_.size());
            fn(std::string_view(buf_).substr(0, take));
            buf_.erase(0, take);
            n -= take;
        }
    }
    void read_to_end(const std::function<void(std::string_view)>& fn) {
        for (;;) {
            if (!buf_.empty()) {
                fn(buf_);
                buf_.clear();
            }
            if (!fill()) return;
        }
    }

private:
    void wait(short events) {
        pollfd p{fd_, events, 0};
        for (;;) {
            const int rc = ::poll(&p, 1, timeout_ms_);
            if (rc < 0 && errno == EINTR) continue;
            OSPREY_CHECK(rc > 0, rc == 0 ? "timed out waiting for the server" : "poll failed");
            return;
        }
    }
    int fd_ = -1;
    int timeout_ms_;
    std::string buf_;
};

}  // namespace

Url parse_url(std::string_view url) {
    constexpr std::string_view kScheme = "http://";
    OSPREY_CHECK(url.substr(0, kScheme.size()) == kScheme, "URL '", url, "' must start with http:// (https is not supported)");
    std::string_view rest = url.substr(kScheme.size());
    const size_t slash = rest.find('/');
    std::string_view authority = rest.substr(0, slash);
    Url u;
    u.base_path = slash == std::string_view::npos ? "" : std::string(rest.substr(slash));
    while (!u.base_path.empty() && u.base_path.back() == '/') u.base_path.pop_back();
    std::string_view port;
    if (!authority.empty() && authority.front() == '[') {  // [IPv6]:port
        const size_t close = authority.find(']');
        OSPREY_CHECK(close != std::string_view::npos, "URL '", url, "': unterminated '[' in the host");
        u.host = std::string(authority.substr(1, close - 1));
        if (close + 1 < authority.size()) {
            OSPREY_CHECK(authority[close + 1] == ':', "URL '", url, "': expected ':' after ']'");
            port = authority.substr(close + 2);
        }
    } else {
        const size_t colon = authority.find(':');
        u.host = std::string(authority.substr(0, colon));
        if (colon != std::string_view::npos) port = authority.substr(colon + 1);
    }
    OSPREY_CHECK(!u.host.empty(), "URL '", url, "' has no host");
    if (!port.empty() || authority.find(':') != std::string_view::npos) {
        int p = 0;
        for (char c : port) {
            OSPREY_CHECK(c >= '0' && c <= '9' && p < 100000, "URL '", url, "': bad port '", port, "'");
            p = p * 10 + (c - '0');
        }
        OSPREY_CHECK(!port.empty() && p >= 1 && p <= 65535, "URL '", url, "': port must be in [1, 65535]");
        u.port = p;
    }
    return u;
}

std::string HttpResponse::header(std::string_view name) const {
    const std::string key = lower(std::string(name));
    for (const auto& [k, v] : headers)
        if (k == key) return v;
    return "";
}

HttpResponse http_request(const Url& url, std::string_view method, std::string_view path,
                          const std::vector<std::pair<std::string, std::string>>& headers, std::string_view body,
                          const BodyFn& on_body, double timeout_s) {
    Connection conn(url, timeout_s);
    const bool v6 = url.host.find(':') != std::string::npos;
    std::string req = str(method, " ", url.base_path, path, " HTTP/1.1\r\nHost: ", v6 ? "[" : "", url.host,
                          v6 ? "]" : "", ":", url.port, "\r\nConnection: close\r\nContent-Length: ", body.size(), "\r\n");
    for (const auto& [k, v] : headers) {
        OSPREY_CHECK(k.find_first_of("\r\n:") == std::string::npos && v.find_first_of("\r\n") == std::string::npos,
                     "HTTP header '", k, "' has a line break or colon");
        req += k + ": " + v + "\r\n";
    }
    req += "\r\n";
    req.append(body);
    conn.send_all(req);

    HttpResponse r;
    const std::string status = conn.read_line(kMaxHeaderBytes);
    OSPREY_CHECK(status.rfind("HTTP/1.", 0) == 0 && status.size() >= 12 && status[8] == ' ',
                 "malformed HTTP status line '", status.substr(0, 80), "'");
    r.status = std::atoi(status.substr(9, 3).c_str());
    OSPREY_CHECK(r.status >= 100 && r.status <= 599, "malformed HTTP status line '", status.substr(0, 80), "'");
    size_t header_bytes = 0;
    for (;;) {
        const std::string l = conn.read_line(kMaxHeaderBytes);
        header_bytes += l.size();
        OSPREY_CHECK(header_bytes <= kMaxHeaderBytes, "response headers exceed ", kMaxHeaderBytes, " bytes");
        if (l.empty()) break;
        const size_t colon = l.find(':');
        OSPREY_CHECK(colon != std::string::npos && colon > 0, "malformed response header '", l.substr(0, 80), "'");
        r.headers.emplace_back(lower(l.substr(0, colon)), trim(std::string_view(l).substr(colon + 1)));
    }
    const auto sink = [&](std::string_view bytes) {
        if (on_body) on_body(bytes);
        else r.body.append(bytes);
    };
    if (method == "HEAD" || r.status == 204 || r.status == 304) return r;
    if (lower(r.header("transfer-encoding")).find("chunked") != std::string::npos) {
        for (;;) {
            const std::string size_line = conn.read_line(1024);
            size_t size = 0, digits = 0;
            for (char c : size_line) {
                const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
                if (d < 0) break;
                OSPREY_CHECK(++digits <= 15, "chunk size '", size_line, "' too large");
                size = size * 16 + size_t(d);
            }
            OSPREY_CHECK(digits > 0, "malformed chunk size line '", size_line.substr(0, 40), "'");
            if (size == 0) {
                while (!conn.read_line(kMaxHeaderBytes).empty()) {
                }  // trailers
                return r;
            }
            conn.read_exact(size, sink);
            OSPREY_CHECK(conn.read_line(16).empty(), "chunk not followed by CRLF");
        }
    }
    if (const std::string len = r.header("content-length"); !len.empty()) {
        size_t n = 0;
        for (char c : len) {
            OSPREY_CHECK(c >= '0' && c <= '9' && n < (size_t(1) << 40), "bad Content-Length '", len, "'");
            n = n * 10 + size_t(c - '0');
        }
        conn.read_exact(n, sink);
        return r;
    }
    conn.read_to_end(sink);
    return r;
}

void SseParser::feed(std::string_view bytes) {
    for (char c : bytes) {
        if (c == '\n' && last_was_cr_) {  // the LF of a CRLF already ended the line
            last_was_cr_ = false;
            continue;
        }
        last_was_cr_ = c == '\r';
        if (c == '\r' || c == '\n') {
            line(pending_);
            pending_.clear();
        } else {
            pending_ += c;
        }
    }
}

void SseParser::finish() {
    if (!pending_.empty()) {
        line(pending_);
        pending_.clear();
    }
    line("");
}

void SseParser::line(std::string_view l) {
    if (l.empty()) {
        if (has_data_) on_event_(data_);
        data_.clear();
        has_data_ = false;
        return;
    }
    if (l.front() == ':') return;  // comment
    const size_t colon = l.find(':');
    const std::string_view field = l.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? std::string_view() : l.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    if (field != "data") return;
    if (has_data_) data_ += '\n';
    data_.append(value);
    has_data_ = true;
}

}  // namespace osprey::benchtool
