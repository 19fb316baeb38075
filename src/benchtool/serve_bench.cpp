#include "benchtool/serve_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

#include "benchtool/http_client.h"
#include "core/check.h"

namespace osprey::benchtool {

namespace {

using Clock = std::chrono::steady_clock;

// Common English words: each is one o200k token with its leading space.
constexpr const char* kWords[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
    "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
    "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would",
    "who", "so", "no", "time", "people", "water", "day", "world", "story", "river", "city", "music", "light",
    "house", "road", "garden", "morning", "night", "book"};

struct RequestPlan {
    double arrival_s = 0;  // offset from the level's start
    int input_words = 0, max_tokens = 0;
    std::string prompt;
};

struct RequestResult {
    bool ok = false;
    std::string error;
    double ttft = -1, e2e = 0;
    std::vector<double> itl;
    int64_t prompt_tokens = -1, completion_tokens = -1;  // from usage, -1 when absent
    int text_deltas = 0;
};

int draw_length(std::mt19937_64& rng, int mean, double sigma) {
    if (sigma <= 0) return mean;
    // Log-normal with the requested mean: mu = ln(mean) - sigma^2 / 2.
    std::lognormal_distribution<double> d(std::log(double(mean)) - sigma * sigma / 2, sigma);
    return std::clamp(int(std::lround(d(rng))), 1, 4 * mean);
}

std::vector<std::pair<std::string, std::string>> auth_headers(const ServeOptions& o) {
    std::vector<std::pair<std::string, std::string>> h = {{"Content-Type", "application/json"}};
    if (!o.api_key.empty()) h.emplace_back("Authorization", "Bearer " + o.api_key);
    return h;
}

bool non_empty_string(const json::Value* v) { return v && v->is_string() && !v->as_string().empty(); }

RequestResult send_one(const ServeOptions& o, const Url& url, const std::string& model, const RequestPlan& plan) {
    RequestResult res;
    const bool chat = o.endpoint == "chat";
    json::Value body = json::Object{};
    body.set("model", model);
    if (chat) {
        json::Value msg = json::Object{};
        msg.set("role", "user");
        msg.set("content", plan.prompt);
        body.set("messages", json::Array{msg});
    } else {
        body.set("prompt", plan.prompt);
    }
    body.set("max_tokens", plan.max_tokens);
    body.set("stream", true);
    json::Value so = json::Object{};
    so.set("include_usage", true);
    body.set("stream_options", so);

    const auto t0 = Clock::now();
    double last = -1;
    bool done = false;
    std::string stream_error;
    SseParser sse([&](const std::string& data) {
        if (data == "[DONE]") {
            done = true;
            return;
        }
        json::Value ev;
        try {
            ev = json::parse(data);
        } catch (const Error& e) {
            stream_error = str("unparsable stream event: ", e.what());
            return;
        }
        if (const json::Value* err = ev.find("error")) {
            stream_error = str("server error in the stream: ", err->dump());
            return;
        }
        if (const json::Value* usage = ev.find("usage"); usage && usage->is_object()) {
            if (const auto* p = usage->find("prompt_tokens"); p && p->is_integer()) res.prompt_tokens = p->as_int();
            if (const auto* c = usage->find("completion_tokens"); c && c->is_integer()) res.completion_tokens = c->as_int();
        }
        const json::Value* choices = ev.find("choices");
        if (!choices || !choices->is_array()) return;
        for (const json::Value& ch : choices->as_array()) {
            bool text = false;
            if (!chat) {
                text = non_empty_string(ch.find("text"));
            } else if (const json::Value* delta = ch.find("delta"); delta && delta->is_object()) {
                text = non_empty_string(delta->find("content")) || non_empty_string(delta->find("reasoning_content")) ||
                       non_empty_string(delta->find("reasoning")) ||
                       (delta->find("tool_calls") && delta->at("tool_calls").size() > 0);
            }
            if (!text) continue;
            const double now = std::chrono::duration<double>(Clock::now() - t0).count();
            if (res.ttft < 0) res.ttft = now;
            else res.itl.push_back(now - last);
            last = now;
            ++res.text_deltas;
        }
    });
    try {
        std::string head;  // the body's first bytes, for the error message of a non-200 answer
        const HttpResponse r = http_request(
            url, "POST", chat ? "/v1/chat/completions" : "/v1/completions", auth_headers(o), body.dump(),
            [&](std::string_view bytes) {
                if (head.size() < 300) head.append(bytes.substr(0, 300 - head.size()));
                sse.feed(bytes);
            },
            o.timeout_s);
        sse.finish();
        res.e2e = std::chrono::duration<double>(Clock::now() - t0).count();
        if (r.status != 200) {
            res.error = str("HTTP ", r.status, head.empty() ? "" : ": ", head);
        } else if (!stream_error.empty()) {
            res.error = stream_error;
        } else if (res.ttft < 0) {
            res.error = "the stream carried no generated text";
        } else {
            res.ok = true;
        }
        (void)done;  // a stream may end without [DONE] (some servers): the end of the body ends it
    } catch (const Error& e) {
        res.error = e.what();
    }
    return res;
}

ServeLevel run_level(const ServeOptions& o, const Url& url, const std::string& model, int concurrency,
                     std::mt19937_64& rng) {
    const int n = o.requests_per_level > 0 ? o.requests_per_level : std::max(8, 4 * concurrency);
    std::vector<RequestPlan> plans(static_cast<size_t>(n));
    double t = 0;
    std::exponential_distribution<double> gap(o.request_rate > 0 ? o.request_rate : 1.0);
    std::uniform_int_distribution<size_t> word(0, std::size(kWords) - 1);
    std::string prefix;
    for (int w = 0; w < o.prefix_len; ++w) {
        if (w) prefix += ' ';
        prefix += kWords[word(rng)];
    }
    for (RequestPlan& p : plans) {
        if (o.request_rate > 0) t += gap(rng);
        p.arrival_s = o.request_rate > 0 ? t : 0.0;
        p.input_words = o.prefix_len + draw_length(rng, o.input_len, o.len_sigma);
        p.max_tokens = draw_length(rng, o.output_len, o.len_sigma);
        p.prompt = prefix;
        for (int w = o.prefix_len; w < p.input_words; ++w) {
            if (w) p.prompt += ' ';
            p.prompt += kWords[word(rng)];
        }
    }
    std::vector<RequestResult> results(static_cast<size_t>(n));
    std::atomic<int> next{0};
    const auto start = Clock::now();
    std::vector<std::thread> workers;
    for (int w = 0; w < std::min(concurrency, n); ++w)
        workers.emplace_back([&] {
            for (int i; (i = next.fetch_add(1)) < n;) {
                std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                          std::chrono::duration<double>(plans[size_t(i)].arrival_s)));
                results[size_t(i)] = send_one(o, url, model, plans[size_t(i)]);
            }
        });
    for (auto& th : workers) th.join();
    const double duration = std::chrono::duration<double>(Clock::now() - start).count();

    ServeLevel L;
    L.concurrency = concurrency;
    L.n_requests = n;
    L.duration_s = duration;
    std::vector<double> ttft, itl, tpot, e2e;
    double in_tokens = 0, out_tokens = 0;
    bool all_usage = true;
    for (size_t i = 0; i < results.size(); ++i) {
        const RequestResult& r = results[i];
        if (!r.ok) {
            ++L.n_failed;
            if (L.first_error.empty()) L.first_error = r.error;
            continue;
        }
        ++L.n_ok;
        const bool usage = r.completion_tokens >= 0 && r.prompt_tokens >= 0;
        all_usage = all_usage && usage;
        const double out = usage ? double(r.completion_tokens) : double(r.text_deltas);
        in_tokens += usage ? double(r.prompt_tokens) : double(plans[i].input_words);
        out_tokens += out;
        ttft.push_back(r.ttft);
        e2e.push_back(r.e2e);
        itl.insert(itl.end(), r.itl.begin(), r.itl.end());
        if (out > 1) tpot.push_back((r.e2e - r.ttft) / (out - 1));
    }
    L.usage_reported = L.n_ok > 0 && all_usage;
    L.request_throughput = L.n_ok / duration;
    L.output_tokens_per_s = out_tokens / duration;
    L.total_tokens_per_s = (in_tokens + out_tokens) / duration;
    L.mean_input_tokens = L.n_ok ? in_tokens / L.n_ok : 0;
    L.mean_output_tokens = L.n_ok ? out_tokens / L.n_ok : 0;
    L.ttft_s = summarize(ttft);
    L.itl_s = summarize(itl);
    L.tpot_s = summarize(tpot);
    L.e2e_s = summarize(e2e);
    return L;
}

}  // namespace

json::Value ServeLevel::to_json() const {
    json::Value v = json::Object{};
    v.set("concurrency", concurrency);
    v.set("requests", n_requests);
    v.set("ok", n_ok);
    v.set("failed", n_failed);
    if (!first_error.empty()) v.set("first_error", first_error);
    v.set("duration_s", duration_s);
    v.set("request_throughput", request_throughput);
    v.set("output_tokens_per_s", output_tokens_per_s);
    v.set("total_tokens_per_s", total_tokens_per_s);
    v.set("mean_input_tokens", mean_input_tokens);
    v.set("mean_output_tokens", mean_output_tokens);
    v.set("token_counts", usage_reported ? "server usage" : "client count");
    v.set("ttft_s", ttft_s.to_json());
    v.set("itl_s", itl_s.to_json());
    v.set("tpot_s", tpot_s.to_json());
    v.set("e2e_s", e2e_s.to_json());
    if (!server_counters.empty()) {
        json::Value c = json::Object{};
        for (const auto& [name, delta] : server_counters) c.set(name, delta);
        v.set("server_counters", std::move(c));
    }
    return v;
}

std::vector<std::pair<std::string, double>> parse_counters(std::string_view text, std::span<const char* const> names) {
    std::vector<std::pair<std::string, double>> out;
    for (const char* name : names) {
        const std::string key = std::string(name) + " ";
        for (size_t at = 0; (at = text.find(key, at)) != std::string_view::npos; at += key.size()) {
            if (at > 0 && text[at - 1] != '\n') continue;  // a line that starts with the name
            const size_t end = text.find('\n', at);
            const std::string value(
                text.substr(at + key.size(), end == std::string_view::npos ? end : end - at - key.size()));
            char* stop = nullptr;
            const double v = std::strtod(value.c_str(), &stop);
            if (stop != value.c_str()) out.emplace_back(name, v);
            break;
        }
    }
    return out;
}

std::string resolve_model(const ServeOptions& o) {
    if (!o.model.empty()) return o.model;
    const Url url = parse_url(o.url);
    const HttpResponse r = http_request(url, "GET", "/v1/models", auth_headers(o), "", nullptr, o.timeout_s);
    OSPREY_CHECK(r.status == 200, "GET ", o.url, "/v1/models answered HTTP ", r.status, ": pass --served-model");
    const json::Value v = json::parse(r.body);
    const json::Value* data = v.find("data");
    OSPREY_CHECK(data && data->is_array() && data->size() > 0 && data->as_array()[0].find("id") &&
                     data->as_array()[0].at("id").is_string(),
                 "GET /v1/models returned no model id: pass --served-model");
    return data->as_array()[0].at("id").as_string();
}

void check_serve_options(const ServeOptions& o) {
    OSPREY_CHECK(!o.concurrencies.empty(), "concurrency list is empty");
    OSPREY_CHECK(o.endpoint == "chat" || o.endpoint == "completions",
                 "--endpoint must be 'chat' or 'completions', got '", o.endpoint, "'");
    for (int c : o.concurrencies) OSPREY_CHECK(c >= 1 && c <= 4096, "concurrency must be in [1, 4096], got ", c);
    OSPREY_CHECK(o.requests_per_level >= 0 && o.requests_per_level <= 1000000, "--requests must be in [0, 1000000]");
    OSPREY_CHECK(o.request_rate >= 0 && std::isfinite(o.request_rate), "--request-rate must be >= 0");
    OSPREY_CHECK(o.input_len >= 1 && o.input_len <= 1000000, "--input-len must be in [1, 1000000], got ", o.input_len);
    OSPREY_CHECK(o.prefix_len >= 0 && o.prefix_len <= 1000000, "--prefix-len must be in [0, 1000000], got ",
                 o.prefix_len);
    OSPREY_CHECK(o.output_len >= 1 && o.output_len <= 1000000, "--output-len must be in [1, 1000000], got ", o.output_len);
    OSPREY_CHECK(o.len_sigma >= 0 && o.len_sigma <= 3, "--len-sigma must be in [0, 3], got ", o.len_sigma);
}

std::vector<ServeLevel> run_serve(const ServeOptions& o, const ProgressFn& progress) {
    check_serve_options(o);
    const Url url = parse_url(o.url);
    const std::string model = resolve_model(o);
    std::mt19937_64 rng(o.seed);
    std::vector<ServeLevel> levels;
    // Best effort: an osprey server's reuse counters; any failure just leaves them out.
    auto counters = [&]() -> std::vector<std::pair<std::string, double>> {
        try {
            const HttpResponse r = http_request(url, "GET", "/metrics", auth_headers(o), "", nullptr, 10.0);
            if (r.status == 200) return parse_counters(r.body, kServeCounterNames);
        } catch (const Error&) {
        }
        return {};
    };
    for (int c : o.concurrencies) {
        const auto before = counters();
        levels.push_back(run_level(o, url, model, c, rng));
        ServeLevel& L = levels.back();
        const auto after = counters();
        for (const auto& [name, v] : after)
            for (const auto& [name0, v0] : before)
                if (name == name0) L.server_counters.emplace_back(name, v - v0);
        if (progress)
            progress(str("serve concurrency ", c, ": ", L.n_ok, "/", L.n_requests, " ok, ", L.request_throughput,
                         " req/s, ", L.output_tokens_per_s, " output tokens/s, TTFT median ", L.ttft_s.median * 1e3,
                         " ms, ITL median ", L.itl_s.median * 1e3, " ms",
                         L.first_error.empty() ? "" : ", first error: " + L.first_error));
    }
    return levels;
}

}  // namespace osprey::benchtool
