// Prometheus metrics (see metrics.h).
#include "server/metrics.h"

#include "core/json.h"

namespace osprey::server {

namespace {

std::string num(double v) { return json::format_number(v); }

std::string label_value(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '\\' || c == '"') out += '\\';
        if (c == '\n') {
            out += "\\n";
            continue;
        }
        out += c;
    }
    return out;
}

void header(std::string& out, const std::string& name, const char* type, const std::string& help) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

void Histogram::observe(double v) {
    size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += v;
    ++count_;
}

void Histogram::write(std::string& out, const std::string& name, const std::string& help) const {
    header(out, name, "histogram", help);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
        cumulative += counts_[i];
        out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
    }
    cumulative += counts_.back();
    out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
    out += name + "_sum " + num(sum_) + "\n";
    out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      itl_({0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 10}),
      e2e_({0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480}),
      prompt_len_({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}),
      generation_len_({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}) {}

void Metrics::http_request(const std::string& route, int status) {
    std::lock_guard lock(mu_);
    ++http_[{route, status}];
}

void Metrics::request_finished(const std::string& finish_reason, int prompt_tokens, int completion_tokens,
                               int cached_tokens, double e2e_s) {
    std::lock_guard lock(mu_);
    ++finished_[finish_reason];
    prompt_tokens_ += uint64_t(prompt_tokens);
    generation_tokens_ += uint64_t(completion_tokens);
    cached_prompt_tokens_ += uint64_t(cached_tokens);
    e2e_.observe(e2e_s);
    prompt_len_.observe(prompt_tokens);
    generation_len_.observe(completion_tokens);
}

void Metrics::first_token(double ttft_s) {
    std::lock_guard lock(mu_);
    ttft_.observe(ttft_s);
}

void Metrics::inter_token(double seconds) {
    std::lock_guard lock(mu_);
    itl_.observe(seconds);
}

std::string Metrics::render(const engine::EngineStats& s, const std::string& model_name) const {
    std::lock_guard lock(mu_);
    std::string out;
    header(out, "osprey_http_requests_total", "counter", "HTTP requests by route and status code.");
    for (const auto& [key, n] : http_)
        out += "osprey_http_requests_total{route=\"" + label_value(key.first) + "\",status=\"" +
               std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
    header(out, "osprey_request_success_total", "counter", "Finished generation requests by finish reason.");
    for (const auto& [reason, n] : finished_)
        out += "osprey_request_success_total{finished_reason=\"" + label_value(reason) + "\"} " + std::to_string(n) + "\n";
    header(out, "osprey_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
    out += "osprey_prompt_tokens_total " + std::to_string(prompt_tokens_) + "\n";
    header(out, "osprey_generation_tokens_total", "counter", "Generated tokens of finished requests.");
    out += "osprey_generation_tokens_total " + std::to_string(generation_tokens_) + "\n";
    header(out, "osprey_cached_prompt_tokens_total", "counter", "Prompt tokens served from the prefix cache.");
    out += "osprey_cached_prompt_tokens_total " + std::to_string(cached_prompt_tokens_) + "\n";
    ttft_.write(out, "osprey_time_to_first_token_seconds", "Time from arrival to the first generated token.");
    itl_.write(out, "osprey_inter_token_latency_seconds", "Time between consecutive generated tokens of a request.");
    e2e_.write(out, "osprey_e2e_request_latency_seconds", "Time from arrival to the end of a request.");
    prompt_len_.write(out, "osprey_request_prompt_tokens", "Prompt length of finished requests.");
    generation_len_.write(out, "osprey_request_generation_tokens", "Generated length of finished requests.");

    header(out, "osprey_num_requests_running", "gauge", "Sequences running in the engine.");
    out += "osprey_num_requests_running " + std::to_string(s.n_running) + "\n";
    header(out, "osprey_num_requests_waiting", "gauge", "Sequences waiting for admission.");
    out += "osprey_num_requests_waiting " + std::to_string(s.n_waiting) + "\n";
    const double usage = s.n_pages > 0 ? double(s.n_pages - s.n_free_pages) / double(s.n_pages) : 0.0;
    header(out, "osprey_kv_cache_usage_perc", "gauge", "Share of KV-cache pages in use (1 = full).");
    out += "osprey_kv_cache_usage_perc " + num(usage) + "\n";
    header(out, "osprey_kv_cache_capacity_tokens", "gauge", "Tokens the KV cache holds.");
    out += "osprey_kv_cache_capacity_tokens " + std::to_string(s.kv_capacity_tokens) + "\n";
    const uint64_t queried = s.n_prefill_tokens + s.n_prefix_hit_tokens;
    header(out, "osprey_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.");
    out += "osprey_prefix_cache_queries_total " + std::to_string(queried) + "\n";
    header(out, "osprey_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.");
    out += "osprey_prefix_cache_hits_total " + std::to_string(s.n_prefix_hit_tokens) + "\n";
    header(out, "osprey_prefix_cache_hit_rate", "gauge", "Prefix-cache hits / queries since start.");
    out += "osprey_prefix_cache_hit_rate " + num(queried ? double(s.n_prefix_hit_tokens) / double(queried) : 0.0) + "\n";
    header(out, "osprey_forked_prompt_tokens_total", "counter",
           "Prompt positions the samples of n > 1 requests copied from their first sample instead of computing.");
    out += "osprey_forked_prompt_tokens_total " + std::to_string(s.n_forked_tokens) + "\n";
    header(out, "osprey_window_restores_total", "counter",
           "Prefix-cache hits that copied a saved sliding-window ring instead of replaying tokens.");
    out += "osprey_window_restores_total " + std::to_string(s.n_window_restores) + "\n";
    header(out, "osprey_num_preemptions_total", "counter", "Sequences preempted for lack of KV pages.");
    out += "osprey_num_preemptions_total " + std::to_string(s.n_preemptions) + "\n";
    header(out, "osprey_engine_generated_tokens_total", "counter", "Tokens the engine generated (cancelled requests too).");
    out += "osprey_engine_generated_tokens_total " + std::to_string(s.n_generated_tokens) + "\n";
    header(out, "osprey_engine_steps_total", "counter", "Engine steps run.");
    out += "osprey_engine_steps_total " + std::to_string(s.n_steps) + "\n";
    if (!s.spec_method.empty()) {  // speculative decoding (docs/speculative.md), labelled by proposer
        const std::string l = "{proposer=\"" + label_value(s.spec_method) + "\"} ";
        header(out, "osprey_spec_decode_verifies_total", "counter",
               "Decode steps of a sequence that verified proposed tokens.");
        out += "osprey_spec_decode_verifies_total" + l + std::to_string(s.n_spec_verifies) + "\n";
        header(out, "osprey_spec_decode_num_draft_tokens_total", "counter", "Tokens proposed and verified.");
        out += "osprey_spec_decode_num_draft_tokens_total" + l + std::to_string(s.n_spec_draft_tokens) + "\n";
        header(out, "osprey_spec_decode_num_accepted_tokens_total", "counter", "Proposed tokens the model accepted.");
        out += "osprey_spec_decode_num_accepted_tokens_total" + l + std::to_string(s.n_spec_accepted_tokens) + "\n";
        header(out, "osprey_spec_decode_acceptance_rate", "gauge", "Accepted / proposed tokens since start.");
        out += "osprey_spec_decode_acceptance_rate" + l +
               num(s.n_spec_draft_tokens ? double(s.n_spec_accepted_tokens) / double(s.n_spec_draft_tokens) : 0.0) +
               "\n";
        header(out, "osprey_spec_decode_mean_accepted_length", "gauge",
               "Tokens emitted per verify step (accepted proposals + the model's own token) since start.");
        out += "osprey_spec_decode_mean_accepted_length" + l +
               num(s.n_spec_verifies ? double(s.n_spec_verifies + s.n_spec_accepted_tokens) / double(s.n_spec_verifies)
                                     : 0.0) +
               "\n";
    }
    header(out, "osprey_model_info", "gauge", "The served model.");
    out += "osprey_model_info{model_name=\"" + label_value(model_name) + "\"} 1\n";
    return out;
}

}  // namespace osprey::server
