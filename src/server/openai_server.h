// The OpenAI-compatible front door: routes requests to the chat, completions and responses
// handlers, serves /v1/models, /health, /metrics and the built-in chat page, checks the API key on
// every /v1 route (constant-time), and turns every error into an OpenAI error body with a 4xx/5xx.
// Tests: tests/server/test_openai_server.cpp (in-process), tools/server/test_openai_client.py.
#pragma once

#include <memory>
#include <string>

#include "http/server.h"
#include "server/routes.h"
#include "server/server_context.h"
#include "server/worker.h"

namespace osprey::server {

class OpenAiServer {
public:
    OpenAiServer(engine::Engine& engine, const tok::Tokenizer& tokenizer, ServerOptions options);

    http::Reply handle(const http::HttpRequest& request);
    ServerContext& context() { return ctx_; }

    // http::HttpServerOptions::error_response for transport errors (400, 413, 431, ...).
    static http::HttpResponse transport_error(int status, const std::string& message);

private:
    http::Reply route(const http::HttpRequest& request, std::string& route_name, RequestInfo& info);
    // CORS headers for `request`'s Origin (ServerOptions::allowed_origins); preflights get more.
    void add_cors(const http::HttpRequest& request, bool preflight,
                  std::vector<std::pair<std::string, std::string>>& headers) const;
    bool authorized(const http::HttpRequest& request) const;
    http::HttpResponse models() const;
    http::Reply metrics_reply();

    ServerContext ctx_;
    Worker worker_{8};  // renders /metrics off the event loop; at most 8 waiting renders
};

// The only route labels of osprey_http_requests_total: a fixed table, so no request can add one.
// Anything else, and every request that fails authentication, is counted as "other".
inline constexpr const char* kRouteLabels[] = {"/",
                                               "/health",
                                               "/metrics",
                                               "/v1/models",
                                               "/v1/models/{id}",
                                               "/v1/chat/completions",
                                               "/v1/completions",
                                               "/v1/responses",
                                               "/v1/responses/{id}",
                                               "/v1/responses/{id}/input_items",
                                               "/tokenize",
                                               "/detokenize",
                                               "options",
                                               "other"};

// Constant-time equality (the time depends on the lengths only).
bool constant_time_equal(const std::string& a, const std::string& b);

// The built-in chat page (src/server/web/index.html, embedded at build time).
const std::string& chat_page_html();

}  // namespace osprey::server
