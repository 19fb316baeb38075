// Routing, authentication and error mapping (see openai_server.h).
#include "server/openai_server.h"

#include <algorithm>
#include <iterator>
#include <mutex>
#include <optional>

#include "core/log.h"
#include "core/utf8.h"
#include "server/api_error.h"
#include "server/routes.h"

namespace osprey::server {

bool constant_time_equal(const std::string& a, const std::string& b) {
    const size_t n = std::max(a.size(), b.size());
    unsigned diff = a.size() == b.size() ? 0u : 1u;
    for (size_t i = 0; i < n; ++i) {
        const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
        const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
        diff |= unsigned(x ^ y);
    }
    return diff == 0;
}

OpenAiServer::OpenAiServer(engine::Engine& engine, const tok::Tokenizer& tokenizer, ServerOptions options)
    : ctx_(engine, tokenizer, std::move(options)) {
    ctx_.limits.vocab_size = engine.runner().config().vocab_size;
    ctx_.max_model_len = engine.max_model_len();
    ctx_.created = unix_time();
}

http::HttpResponse OpenAiServer::transport_error(int status, const std::string& message) {
    return error_response(ApiError(status, message));
}

bool OpenAiServer::authorized(const http::HttpRequest& request) const {
    if (ctx_.options.api_key.empty()) return true;
    std::string given;
    if (const std::string* auth = request.header("authorization")) {
        if (auth->size() > 7 && (auth->compare(0, 7, "Bearer ") == 0 || auth->compare(0, 7, "bearer ") == 0))
            given = auth->substr(7);
    } else if (const std::string* key = request.header("x-api-key")) {
        given = *key;
    }
    return !given.empty() && constant_time_equal(given, ctx_.options.api_key);
}

http::HttpResponse OpenAiServer::models() const {
    json::Array data;
    std::vector<std::string> names = {ctx_.options.model_name};
    names.insert(names.end(), ctx_.options.extra_model_names.begin(), ctx_.options.extra_model_names.end());
    for (const std::string& name : names) {
        json::Value m;
        m.set("id", name);
        m.set("object", "model");
        m.set("created", ctx_.created);
        m.set("owned_by", "osprey");
        m.set("root", ctx_.options.model_path.empty() ? ctx_.options.model_name : ctx_.options.model_path);
        m.set("parent", json::Value());
        m.set("max_model_len", ctx_.max_model_len);
        data.push_back(std::move(m));
    }
    json::Value v;
    v.set("object", "list");
    v.set("data", std::move(data));
    return http::HttpResponse::json(200, v.dump());
}

namespace {

// A header value we may echo: printable ASCII, bounded (the parser already refuses CR and LF).
bool echoable(const std::string& value, size_t max_size) {
    if (value.empty() || value.size() > max_size) return false;
    for (unsigned char ch : value)
        if (ch < 0x20 || ch > 0x7e) return false;
    return true;
}

}  // namespace

void OpenAiServer::add_cors(const http::HttpRequest& request, bool preflight,
                            std::vector<std::pair<std::string, std::string>>& headers) const {
    const auto& allowed = ctx_.options.allowed_origins;
    const std::string* origin = request.header("origin");
    if (std::find(allowed.begin(), allowed.end(), "*") != allowed.end()) {
        headers.emplace_back("Access-Control-Allow-Origin", "*");
    } else if (origin && std::find(allowed.begin(), allowed.end(), *origin) != allowed.end()) {
        headers.emplace_back("Access-Control-Allow-Origin", *origin);
        headers.emplace_back("Vary", "Origin");
    } else {
        return;  // not an allowed origin: the browser refuses to show the response
    }
    if (!preflight) return;
    headers.emplace_back("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    // Whatever headers the page wants to send (openai-node adds x-stainless-*): the API key is what
    // protects the routes, not the header list. Only tokens and commas are echoed.
    std::string wanted = "Authorization, Content-Type";
    if (const std::string* asked = request.header("access-control-request-headers");
        asked && echoable(*asked, 4096) &&
        asked->find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_, ") ==
            std::string::npos)
        wanted = *asked;
    headers.emplace_back("Access-Control-Allow-Headers", wanted);
    headers.emplace_back("Access-Control-Max-Age", "86400");
}

namespace {

json::Value parse_body(const http::HttpRequest& request) {
    // The Content-Type is not checked: curl's default (form-urlencoded) with a JSON body is common.
    if (request.body.empty())
        throw ApiError(400, "the request body is empty; expected a JSON object", "", "invalid_json");
    if (const size_t bad = utf8::first_invalid(request.body); bad != std::string::npos)
        throw ApiError(400, str("the request body is not valid UTF-8 (byte ", bad, ")"), "", "invalid_utf8");
    try {
        return json::parse(request.body);
    } catch (const Error& e) {
        throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what(), "", "invalid_json");
    }
}

void require_method(const http::HttpRequest& request, const char* method) {
    if (request.method != method)
        throw ApiError(405,
                       "method " + request.method + " is not allowed on " + request.path + " (use " + method + ")");
}

}  // namespace

http::Reply OpenAiServer::route(const http::HttpRequest& request, std::string& route_name, RequestInfo& info) {
    const std::string& path = request.path;
    if (request.method == "OPTIONS") {
        route_name = "options";
        http::HttpResponse r = http::HttpResponse::text(204, "", "");
        add_cors(request, /*preflight=*/true, r.headers);
        return http::Reply(r);
    }
    if (path == "/health") {
        route_name = "/health";
        // Load balancers take a non-200 as "send no more here": while draining, say so.
        if (ctx_.draining) return http::Reply(http::HttpResponse::json(503, "{\"status\":\"draining\"}"));
        return http::Reply(http::HttpResponse::json(200, "{\"status\":\"ok\"}"));
    }
    if (path == "/metrics") {
        route_name = "/metrics";
        require_method(request, "GET");
        return metrics_reply();
    }
    if (path == "/" || path == "/index.html") {
        route_name = "/";
        require_method(request, "GET");
        return http::Reply(http::HttpResponse::text(200, chat_page_html(), "text/html; charset=utf-8"));
    }
    const bool tokenizer_route = path == "/tokenize" || path == "/detokenize";
    if (path.rfind("/v1/", 0) != 0 && !tokenizer_route) {
        route_name = "other";
        throw ApiError(404, "no route " + request.method + " " + path.substr(0, 200));
    }
    // The label is the route's, and only once the client is authenticated (until then "other"): the
    // path is the client's to choose, and labels must not grow with what clients send (issue 19).
    if (!authorized(request))
        throw ApiError(401, "missing or incorrect API key (send 'Authorization: Bearer <key>')", "", "invalid_api_key");
    if (path == "/v1/models" || path == "/v1/chat/completions" || path == "/v1/completions" ||
        path == "/v1/responses" || tokenizer_route)
        route_name = path;  // one of kRouteLabels
    if (tokenizer_route) {
        require_method(request, "POST");
        return http::Reply(path == "/tokenize" ? handle_tokenize(ctx_, parse_body(request))
                                               : handle_detokenize(ctx_, parse_body(request)));
    }
    const bool generation = path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/responses";
    if (generation && ctx_.draining)
        throw ApiError(503, "the server is shutting down; send the request elsewhere", "", "server_shutdown");
    if (path == "/v1/models") {
        require_method(request, "GET");
        return http::Reply(models());
    }
    if (path.rfind("/v1/models/", 0) == 0) {
        route_name = "/v1/models/{id}";
        require_method(request, "GET");
        check_model(ctx_, path.substr(11));
        json::Value list = json::parse(models().body);
        return http::Reply(http::HttpResponse::json(200, list.at("data").as_array()[0].dump()));
    }
    if (path == "/v1/chat/completions") {
        require_method(request, "POST");
        return handle_chat_completions(ctx_, parse_body(request), info);
    }
    if (path == "/v1/completions") {
        require_method(request, "POST");
        return handle_completions(ctx_, parse_body(request), info);
    }
    if (path == "/v1/responses") {
        require_method(request, "POST");
        return handle_responses(ctx_, parse_body(request), info);
    }
    if (path.rfind("/v1/responses/", 0) == 0 && path.size() > 26 && path.compare(path.size() - 12, 12, "/input_items") == 0) {
        route_name = "/v1/responses/{id}/input_items";
        require_method(request, "GET");
        return http::Reply(get_response_input_items(ctx_, path.substr(14, path.size() - 26), request.query));
    }
    if (path.rfind("/v1/responses/", 0) == 0) {
        route_name = "/v1/responses/{id}";
        const std::string id = path.substr(14);
        if (request.method == "GET") return http::Reply(get_stored_response(ctx_, id));
        if (request.method == "DELETE") return http::Reply(delete_stored_response(ctx_, id));
        throw ApiError(405, "method " + request.method + " is not allowed on /v1/responses/{id} (use GET or DELETE)");
    }
    route_name = "other";
    throw ApiError(404, "no route " + request.method + " " + path.substr(0, 200));
}

namespace {

// GET /metrics, rendered on the server's worker thread: the exposition's cost (bounded by the fixed
// route labels, but still a few hundred lines) never stalls the event loop.
class MetricsJob : public http::AsyncJob {
public:
    struct State {
        std::mutex mu;
        std::optional<http::HttpResponse> response;
        std::function<void()> wake;
        bool cancelled = false;
    };
    explicit MetricsJob(std::shared_ptr<State> state) : state_(std::move(state)) {}
    bool streaming() const override { return false; }
    void start(std::function<void()> wake) override {
        std::lock_guard lock(state_->mu);
        state_->wake = std::move(wake);
        if (state_->response) state_->wake();
    }
    Progress poll() override {
        std::lock_guard lock(state_->mu);
        Progress p;
        if (state_->response) {
            p.done = true;
            p.response = std::move(state_->response);
        }
        return p;
    }
    void cancel() override {
        std::lock_guard lock(state_->mu);
        state_->cancelled = true;
    }

private:
    std::shared_ptr<State> state_;
};

}  // namespace

http::Reply OpenAiServer::metrics_reply() {
    auto state = std::make_shared<MetricsJob::State>();
    const bool queued = worker_.post([this, state] {
        {
            std::lock_guard lock(state->mu);
            if (state->cancelled) return;
        }
        http::HttpResponse r =
            http::HttpResponse::text(200, ctx_.metrics.render(ctx_.engine.stats(), ctx_.options.model_name),
                                     "text/plain; version=0.0.4; charset=utf-8");
        std::lock_guard lock(state->mu);
        state->response = std::move(r);
        if (state->wake) state->wake();
    });
    if (!queued) throw ApiError(503, "metrics are being rendered for other requests; retry shortly");
    return http::Reply(std::make_unique<MetricsJob>(std::move(state)));
}

http::Reply OpenAiServer::handle(const http::HttpRequest& request) {
    std::string route_name = "other";
    http::Reply reply;
    RequestInfo info;
    try {
        if (const std::string* rid = request.header("x-request-id")) {
            if (!echoable(*rid, 256))
                throw ApiError(400, "X-Request-Id: must be 1 to 256 printable ASCII characters", "X-Request-Id");
            info.request_id = *rid;
        }
        reply = route(request, route_name, info);
    } catch (const ApiError& e) {
        reply = http::Reply(error_response(e));
    } catch (const Error& e) {
        reply = http::Reply(error_response(ApiError(400, e.what())));
    } catch (const std::exception& e) {
        log::error("internal error on ", request.method, " ", request.path, ": ", e.what());
        reply = http::Reply(error_response(ApiError(500, std::string("internal error: ") + e.what())));
    }
    auto& headers = reply.job ? reply.headers : reply.response.headers;
    if (route_name != "options") add_cors(request, /*preflight=*/false, headers);
    if (const std::string* rid = request.header("x-request-id"); info.request_id.empty() && rid && echoable(*rid, 256))
        info.request_id = *rid;
    if (!info.request_id.empty()) headers.emplace_back("X-Request-Id", info.request_id);
    const int status = reply.job ? 200 : reply.response.status;
    if (std::find(std::begin(kRouteLabels), std::end(kRouteLabels), route_name) == std::end(kRouteLabels))
        route_name = "other";  // never a label outside the table
    ctx_.metrics.http_request(route_name, status);
    log::debug(request.method, " ", request.path, " -> ", status, reply.job ? " (generating)" : "");
    return reply;
}

}  // namespace osprey::server
