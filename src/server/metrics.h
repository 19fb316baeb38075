// Server metrics in the Prometheus text format (GET /metrics): request counts by route and status,
// tokens in and out, time-to-first-token, inter-token-latency and end-to-end histograms, and the
// engine's gauges (running / waiting requests, KV-cache usage, prefix-cache hit rate). Thread-safe.
// Tests: tests/server/test_metrics.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace osprey::server {

class Histogram {
public:
    explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
    void observe(double v);
    // "# TYPE" line, cumulative buckets with le labels, _sum and _count.
    void write(std::string& out, const std::string& name, const std::string& help) const;
    uint64_t count() const { return count_; }

private:
    std::vector<double> bounds_;
    std::vector<uint64_t> counts_;  // [n_bounds + 1], last = +Inf
    double sum_ = 0;
    uint64_t count_ = 0;
};

class Metrics {
public:
    Metrics();
    void http_request(const std::string& route, int status);
    void request_finished(const std::string& finish_reason, int prompt_tokens, int completion_tokens,
                          int cached_tokens, double e2e_s);
    void first_token(double ttft_s);
    void inter_token(double seconds);
    // The whole exposition, with the engine's gauges from `stats`.
    std::string render(const engine::EngineStats& stats, const std::string& model_name) const;

private:
    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, uint64_t> http_;  // (route, status) -> count
    std::map<std::string, uint64_t> finished_;              // finish reason -> count
    uint64_t prompt_tokens_ = 0, generation_tokens_ = 0, cached_prompt_tokens_ = 0;
    Histogram ttft_, itl_, e2e_, prompt_len_, generation_len_;
};

}  // namespace osprey::server
