// A small blocking HTTP/1.1 client for the load generator: one request per connection
// ("Connection: close"), plain http:// only, bodies with Content-Length, chunked transfer coding or
// read to end of stream, delivered incrementally to a callback; and a Server-Sent Events parser.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace osprey::benchtool {

struct Url {
    std::string host;  // name or address (IPv6 without brackets)
    int port = 80;
    std::string base_path;  // path prefix without a trailing '/', e.g. "" or "/proxy"
};
Url parse_url(std::string_view url);  // "http://host[:port][/prefix]"; throws naming the problem

struct HttpResponse {
    int status = 0;
    std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
    std::string body;  // empty when the body went to on_body
    std::string header(std::string_view name) const;  // "" when absent
};

using BodyFn = std::function<void(std::string_view bytes)>;

// Sends one request and reads the response. With on_body, body bytes are passed to it as they
// arrive (decoded from chunked coding) instead of being stored. Throws osprey::Error on connection
// failures, timeouts (per read or write) and malformed responses.
HttpResponse http_request(const Url& url, std::string_view method, std::string_view path,
                          const std::vector<std::pair<std::string, std::string>>& headers, std::string_view body,
                          const BodyFn& on_body = nullptr, double timeout_s = 600);

// Incremental text/event-stream parser: feed() bytes in any split; each complete event's data
// (its "data:" lines joined by '\n') goes to the callback. Comments and other fields are ignored.
class SseParser {
public:
    explicit SseParser(std::function<void(const std::string& data)> on_event) : on_event_(std::move(on_event)) {}
    void feed(std::string_view bytes);
    void finish();  // dispatches a last event not followed by a blank line

private:
    void line(std::string_view l);
    std::function<void(const std::string&)> on_event_;
    std::string pending_;  // bytes of an unfinished line
    std::string data_;
    bool has_data_ = false;
    bool last_was_cr_ = false;
};

}  // namespace osprey::benchtool
