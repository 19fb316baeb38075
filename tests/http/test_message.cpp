// HTTP/1.1 request parsing and response serialisation (src/http/message.h).
#include <gtest/gtest.h>

#include "http/message.h"

namespace osprey::http {
namespace {

std::optional<HttpRequest> parse(std::string& buffer, std::optional<HttpParseError>& error, HttpLimits limits = {}) {
    return parse_http_request(buffer, limits, error);
}

TEST(HttpMessage, ParsesAGetWithQueryAndHeaders) {
    std::string b = "GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\nX-Thing:  spaced value \r\n\r\n";
    std::optional<HttpParseError> err;
    auto r = parse(b, err);
    ASSERT_TRUE(r) << (err ? err->message : "incomplete");
    EXPECT_EQ(r->method, "GET");
    EXPECT_EQ(r->path, "/v1/models");
    EXPECT_EQ(r->query, "x=1");
    ASSERT_NE(r->header("x-thing"), nullptr);
    EXPECT_EQ(*r->header("x-thing"), "spaced value");
    EXPECT_TRUE(r->keep_alive);
    EXPECT_TRUE(b.empty());
}

TEST(HttpMessage, WaitsForTheWholeBodyThenLeavesPipelinedBytes) {
    const std::string full =
        "POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloGET /health HTTP/1.1\r\nHost: "
        "h\r\nConnection: close\r\n\r\n";
    std::string b;
    std::optional<HttpParseError> err;
    for (size_t i = 0; i < full.size(); ++i) {  // byte by byte: incomplete until the body is complete
        b += full[i];
        auto r = parse(b, err);
        ASSERT_FALSE(err) << err->message;
        if (r) {
            EXPECT_EQ(r->body, "hello");
            EXPECT_EQ(i, full.find("GET") - 1);
            b += full.substr(i + 1);
            break;
        }
    }
    auto second = parse(b, err);
    ASSERT_TRUE(second);
    EXPECT_EQ(second->path, "/health");
    EXPECT_FALSE(second->keep_alive);
    EXPECT_TRUE(b.empty());
}

TEST(HttpMessage, Http10ClosesUnlessKeepAlive) {
    std::string b = "GET / HTTP/1.0\r\n\r\nGET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
    std::optional<HttpParseError> err;
    EXPECT_FALSE(parse(b, err)->keep_alive);
    EXPECT_TRUE(parse(b, err)->keep_alive);
}

TEST(HttpMessage, RejectsMalformedRequestsWithTheRightStatus) {
    struct Case {
        std::string bytes;
        int status;
    };
    HttpLimits limits;
    limits.max_body_bytes = 100;
    limits.max_header_bytes = 256;
    const Case cases[] = {
        {"NONSENSE\r\n\r\n", 400},
        {"GET /x HTTP/1.1 extra\r\n\r\n", 400},
        {"GET x HTTP/1.1\r\n\r\n", 400},
        {"GET /x HTTP/2.0\r\n\r\n", 505},
        {"GET /x HTTP/1.1\r\nNoColon\r\n\r\n", 400},
        {"GET /x HTTP/1.1\r\nBad Name: v\r\n\r\n", 400},
        {"POST /x HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400},
        {"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400},
        {"POST /x HTTP/1.1\r\nContent-Length: 101\r\n\r\n", 413},
        {"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501},
        {"GET /x HTTP/1.1\r\nA: " + std::string(300, 'a') + "\r\n\r\n", 431},
        {"GET /x HTTP/1.1\r\nA: " + std::string(300, 'a'), 431},  // too long even before the end
        {"GET /x HTTP/1.1\r\n\r\n", 400},                         // RFC 9112 §3.2: Host is required
        {"GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},   // ... exactly once
        {"POST /x HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\nContent-Length: 1\r\n\r\n", 417},
        {"POST /x HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 101\r\n\r\n", 413},
    };
    for (const Case& c : cases) {
        std::string b = c.bytes;
        std::optional<HttpParseError> err;
        EXPECT_FALSE(parse(b, err, limits));
        ASSERT_TRUE(err) << c.bytes;
        EXPECT_EQ(err->status, c.status) << c.bytes << ": " << err->message;
        EXPECT_FALSE(err->message.empty());
    }
}

TEST(HttpMessage, Http10NeedsNoHostAndIgnoresExpect) {
    std::string b = "GET /x HTTP/1.0\r\nExpect: whatever\r\n\r\n";
    std::optional<HttpParseError> err;
    auto r = parse(b, err);
    ASSERT_TRUE(r) << (err ? err->message : "");
    EXPECT_EQ(r->path, "/x");
}

TEST(HttpMessage, ReportsACompleteHeadAndExpectContinue) {
    std::string b = "POST /x HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 4\r\n\r\nab";
    std::optional<HttpParseError> err;
    HttpParseProgress progress;
    EXPECT_FALSE(parse_http_request(b, HttpLimits{}, err, &progress));
    EXPECT_FALSE(err);
    EXPECT_TRUE(progress.head_complete);
    EXPECT_TRUE(progress.expect_continue);
    EXPECT_EQ(progress.content_length, 4u);
    b += "cd";
    auto r = parse_http_request(b, HttpLimits{}, err, &progress);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "abcd");
    std::string head_only = "GET /x HTTP/1.1\r\nHost: a\r\n";
    EXPECT_FALSE(parse_http_request(head_only, HttpLimits{}, err, &progress));
    EXPECT_FALSE(progress.head_complete);
}

TEST(HttpMessage, SerializesResponsesAndChunks) {
    HttpResponse r = HttpResponse::json(404, "{}");
    const std::string s = serialize(r, false);
    EXPECT_EQ(s.rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u);
    EXPECT_NE(s.find("Content-Length: 2\r\n"), std::string::npos);
    EXPECT_NE(s.find("Connection: close\r\n"), std::string::npos);
    EXPECT_EQ(s.substr(s.size() - 6), "\r\n\r\n{}");
    EXPECT_EQ(chunk("hello, world!!!!!"), "11\r\nhello, world!!!!!\r\n");
    EXPECT_EQ(chunk(""), "");
    EXPECT_NE(serialize_chunked_head(200, "text/event-stream", true).find("Transfer-Encoding: chunked"),
              std::string::npos);
}

}  // namespace
}  // namespace osprey::http
