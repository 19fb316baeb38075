// HTTP/1.1 request parsing and response serialisation (see message.h).
#include "http/message.h"

#include <algorithm>
#include <cctype>
#include <charconv>

namespace osprey::http {

namespace {

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

bool is_token_char(char c) {
    if (std::isalnum(static_cast<unsigned char>(c))) return true;
    return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool has_token(std::string_view list, std::string_view token) {
    size_t pos = 0;
    while (pos <= list.size()) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        if (lower(trim(list.substr(pos, comma - pos))) == token) return true;
        pos = comma + 1;
    }
    return false;
}

}  // namespace

const std::string* HttpRequest::header(std::string_view name) const {
    for (const auto& [k, v] : headers)
        if (k == name) return &v;
    return nullptr;
}

std::optional<HttpRequest> parse_http_request(std::string& buffer, const HttpLimits& limits,
                                              std::optional<HttpParseError>& error, HttpParseProgress* progress) {
    error.reset();
    if (progress) *progress = {};
    auto fail = [&](int status, std::string message) -> std::optional<HttpRequest> {
        error = HttpParseError{status, std::move(message)};
        return std::nullopt;
    };
    // Tolerate empty lines before a request (RFC 9112 §2.2).
    size_t start = 0;
    while (start + 1 < buffer.size() && buffer[start] == '\r' && buffer[start + 1] == '\n') start += 2;
    const size_t head_end = buffer.find("\r\n\r\n", start);
    if (head_end == std::string::npos) {
        if (buffer.size() - start > limits.max_header_bytes)
            return fail(431, "request headers are larger than " + std::to_string(limits.max_header_bytes) + " bytes");
        return std::nullopt;
    }
    if (head_end - start > limits.max_header_bytes)
        return fail(431, "request headers are larger than " + std::to_string(limits.max_header_bytes) + " bytes");

    const std::string_view head(buffer.data() + start, head_end - start);
    HttpRequest r;
    const size_t line_end = head.find("\r\n");
    const std::string_view line = head.substr(0, line_end);
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp1 == std::string_view::npos || sp2 == std::string_view::npos ||
        line.find(' ', sp2 + 1) != std::string_view::npos)
        return fail(400, "malformed request line");
    r.method = std::string(line.substr(0, sp1));
    r.target = std::string(line.substr(sp1 + 1, sp2 - sp1 - 1));
    const std::string_view version = line.substr(sp2 + 1);
    if (r.method.empty() || !std::all_of(r.method.begin(), r.method.end(), is_token_char))
        return fail(400, "malformed request method");
    if (version == "HTTP/1.1") {
        r.minor_version = 1;
    } else if (version == "HTTP/1.0") {
        r.minor_version = 0;
    } else {
        return fail(505, "unsupported HTTP version '" + std::string(version.substr(0, 16)) + "'");
    }
    if (r.target.empty() || (r.target[0] != '/' && r.target != "*")) return fail(400, "malformed request target");
    for (char c : r.target)
        if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) return fail(400, "malformed request target");
    const size_t q = r.target.find('?');
    r.path = r.target.substr(0, q);
    if (q != std::string::npos) r.query = r.target.substr(q + 1);

    size_t pos = line_end == std::string_view::npos ? head.size() : line_end + 2;
    while (pos < head.size()) {
        size_t eol = head.find("\r\n", pos);
        if (eol == std::string_view::npos) eol = head.size();
        const std::string_view h = head.substr(pos, eol - pos);
        pos = eol + 2;
        const size_t colon = h.find(':');
        if (colon == 0 || colon == std::string_view::npos) return fail(400, "malformed header line");
        const std::string_view name = h.substr(0, colon);
        if (!std::all_of(name.begin(), name.end(), is_token_char)) return fail(400, "malformed header name");
        const std::string_view value = trim(h.substr(colon + 1));
        for (char c : value)
            if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f)
                return fail(400, "control character in header '" + std::string(name) + "'");
        r.headers.emplace_back(lower(name), std::string(value));
    }

    size_t content_length = 0;
    bool have_length = false;
    int n_host = 0;
    bool expect_continue = false;
    for (const auto& [k, v] : r.headers) {
        if (k == "host") ++n_host;
        if (k == "expect" && r.minor_version == 1) {  // HTTP/1.0 expectations are ignored (RFC 9110 §10.1.1)
            if (lower(v) != "100-continue") return fail(417, "unsupported expectation '" + v.substr(0, 32) + "'");
            expect_continue = true;
        }
        if (k == "transfer-encoding") {
            return fail(501, "Transfer-Encoding '" + v + "' is not supported; send a Content-Length");
        }
        if (k == "content-length") {
            size_t n = 0;
            const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
            if (ec != std::errc() || p != v.data() + v.size() || v.empty())
                return fail(400, "malformed Content-Length '" + v.substr(0, 32) + "'");
            if (have_length && n != content_length) return fail(400, "conflicting Content-Length headers");
            content_length = n;
            have_length = true;
        }
    }
    if (content_length > limits.max_body_bytes)
        return fail(413, "request body of " + std::to_string(content_length) + " bytes is larger than the limit of " +
                             std::to_string(limits.max_body_bytes) + " bytes");
    if (r.minor_version == 1 && n_host != 1)
        return fail(400, n_host == 0 ? "missing Host header (required in HTTP/1.1)" : "more than one Host header");
    const size_t body_start = head_end + 4;
    if (buffer.size() - body_start < content_length) {
        if (progress) *progress = {true, content_length, expect_continue};
        return std::nullopt;
    }

    r.body = buffer.substr(body_start, content_length);
    const std::string* connection = r.header("connection");
    if (r.minor_version == 0) {
        r.keep_alive = connection && has_token(*connection, "keep-alive");
    } else {
        r.keep_alive = !(connection && has_token(*connection, "close"));
    }
    buffer.erase(0, body_start + content_length);
    return r;
}

HttpResponse HttpResponse::json(int status, std::string body) {
    HttpResponse r;
    r.status = status;
    r.body = std::move(body);
    return r;
}

HttpResponse HttpResponse::text(int status, std::string body, std::string content_type) {
    HttpResponse r;
    r.status = status;
    r.content_type = std::move(content_type);
    r.body = std::move(body);
    return r;
}

const char* status_reason(int status) {
    switch (status) {
        case 200:
            return "OK";
        case 204:
            return "No Content";
        case 100:
            return "Continue";
        case 400:
            return "Bad Request";
        case 401:
            return "Unauthorized";
        case 403:
            return "Forbidden";
        case 404:
            return "Not Found";
        case 405:
            return "Method Not Allowed";
        case 408:
            return "Request Timeout";
        case 409:
            return "Conflict";
        case 413:
            return "Content Too Large";
        case 417:
            return "Expectation Failed";
        case 415:
            return "Unsupported Media Type";
        case 422:
            return "Unprocessable Content";
        case 429:
            return "Too Many Requests";
        case 431:
            return "Request Header Fields Too Large";
        case 500:
            return "Internal Server Error";
        case 501:
            return "Not Implemented";
        case 503:
            return "Service Unavailable";
        case 505:
            return "HTTP Version Not Supported";
        default:
            return "Status";
    }
}

namespace {

void append_common_headers(std::string& out, int status, bool keep_alive) {
    out += "HTTP/1.1 ";
    out += std::to_string(status);
    out += ' ';
    out += status_reason(status);
    out += "\r\nServer: osprey\r\nConnection: ";
    out += keep_alive ? "keep-alive" : "close";
    out += "\r\n";
}

}  // namespace

std::string serialize(const HttpResponse& response, bool keep_alive) {
    std::string out;
    out.reserve(response.body.size() + 256);
    append_common_headers(out, response.status, keep_alive);
    if (!response.content_type.empty()) out += "Content-Type: " + response.content_type + "\r\n";
    for (const auto& [k, v] : response.headers) out += k + ": " + v + "\r\n";
    out += "Content-Length: " + std::to_string(response.body.size()) + "\r\n\r\n";
    out += response.body;
    return out;
}

std::string serialize_chunked_head(int status, std::string_view content_type, bool keep_alive,
                                   const std::vector<std::pair<std::string, std::string>>& headers) {
    std::string out;
    append_common_headers(out, status, keep_alive);
    out += "Content-Type: ";
    out += content_type;
    out += "\r\n";
    for (const auto& [k, v] : headers) out += k + ": " + v + "\r\n";
    out += "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\n\r\n";
    return out;
}

std::string chunk(std::string_view data) {
    if (data.empty()) return {};
    char size[32];
    const auto [p, ec] = std::to_chars(size, size + sizeof size, data.size(), 16);
    std::string out(size, p);
    out += "\r\n";
    out += data;
    out += "\r\n";
    return out;
}

}  // namespace osprey::http
