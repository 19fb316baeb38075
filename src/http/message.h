// HTTP/1.1 messages: an incremental request parser (request line, headers, Content-Length body,
// with limits on header and body size) and response serialisation. Transport only: no JSON, no
// routes. Tests: tests/http/test_message.cpp.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace osprey::http {

struct HttpRequest {
    std::string method;                                        // "GET", "POST", ...
    std::string target;                                        // as sent: "/v1/models?x=1"
    std::string path;                                          // target without the query: "/v1/models"
    std::string query;                                         // after '?', undecoded
    int minor_version = 1;                                     // HTTP/1.minor
    std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, values trimmed
    std::string body;
    bool keep_alive = true;

    // First header with this (lower-case) name, or nullptr.
    const std::string* header(std::string_view name) const;
};

struct HttpLimits {
    size_t max_header_bytes = 64 * 1024;       // request line + headers
    size_t max_body_bytes = 32 * 1024 * 1024;  // Content-Length above this is refused with 413
};

// What the parser found wrong, as an HTTP status and a message for the client.
struct HttpParseError {
    int status = 400;
    std::string message;
};

// How far an incomplete request got (for the server's deadlines and `Expect: 100-continue`).
struct HttpParseProgress {
    bool head_complete = false;    // request line and headers received and valid
    size_t content_length = 0;     // of that head
    bool expect_continue = false;  // HTTP/1.1 with `Expect: 100-continue`
};

// Parses one request from the front of `buffer` (bytes received so far). On success, removes the
// request's bytes from `buffer` and returns it; returns nullopt when more bytes are needed (then
// `progress`, when given, says whether the head is complete); sets `error` (and returns nullopt)
// when the bytes cannot be a valid request within the limits. RFC 9112: an HTTP/1.1 request needs
// exactly one Host header (400); an expectation other than 100-continue is answered 417.
std::optional<HttpRequest> parse_http_request(std::string& buffer, const HttpLimits& limits,
                                              std::optional<HttpParseError>& error,
                                              HttpParseProgress* progress = nullptr);

struct HttpResponse {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;  // extra headers (CORS is the handler's: none here)

    static HttpResponse json(int status, std::string body);
    static HttpResponse text(int status, std::string body, std::string content_type = "text/plain; charset=utf-8");
};

const char* status_reason(int status);  // "OK", "Bad Request", ...

// The full response bytes (status line, headers with Content-Length, body).
std::string serialize(const HttpResponse& response, bool keep_alive);
// The head of a streamed (chunked) response, e.g. for server-sent events.
std::string serialize_chunked_head(int status, std::string_view content_type, bool keep_alive,
                                   const std::vector<std::pair<std::string, std::string>>& headers = {});
// One chunk of a chunked body (empty data gives nothing: the terminator is kLastChunk).
std::string chunk(std::string_view data);
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

}  // namespace osprey::http
