// `osprey bench serve`: an HTTP load generator for an OpenAI-compatible server (osprey serve or any
// other). For each concurrency level it sends streamed /v1/chat/completions requests (or, with
// endpoint "completions", /v1/completions with the prompt as raw text), at most
// `concurrency` in flight, arriving all at once (closed loop) or as a Poisson process of
// `request_rate` requests/s; prompts and output budgets are drawn from log-normal distributions
// around the requested means (clamped to [1, 4 x mean]), prompts made of common English words.
//
// Per request it measures, from the moment the request is sent:
//   TTFT  until the first streamed delta carrying generated text: `content`, `reasoning_content`
//         or `reasoning` (Harmony's analysis channel counts as generated output), or a tool call;
//         for completions, a non-empty `text`;
//   ITL   the gaps between successive such deltas;
//   TPOT  (end to end - TTFT) / (output tokens - 1);
//   E2E   until the stream ends ([DONE] or the end of the response).
// Output tokens are the server's usage.completion_tokens (requested with stream_options) when it
// reports them, else the number of text-carrying deltas. Requests end wherever the server stops
// them (max_tokens, a stop token or string): nothing asks the server to ignore end-of-sequence.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "benchtool/model_bench.h"
#include "benchtool/stats.h"
#include "core/json.h"

namespace osprey::benchtool {

struct ServeOptions {
    std::string url = "http://127.0.0.1:8000";
    std::string model;    // empty: the first id of GET /v1/models
    std::string api_key;  // sent as a Bearer token when set
    // "chat": /v1/chat/completions (the prompt as one user message; the server applies its chat
    // format, and for gpt-oss parses the Harmony channels of the output). "completions":
    // /v1/completions with the prompt as raw text and the output streamed as raw text, token by
    // token: the engine and the HTTP path without the chat format, which is what a random-weight
    // checkpoint can be measured with (it never writes a Harmony header, so a Harmony parser holds
    // its text back; see docs/benchmarks.md).
    std::string endpoint = "chat";
    std::vector<int> concurrencies = {1, 2, 4, 8, 16, 32, 64, 128};
    int requests_per_level = 0;  // 0: max(8, 4 x concurrency)
    double request_rate = 0;     // requests/s (Poisson); 0: all at once, limited by concurrency
    int input_len = 256;         // mean prompt words (about one token each)
    // Words every prompt of a level starts with before its own input_len words (the same words for
    // all, drawn once per level), like a system prompt or a shared document: exercises the prefix cache.
    int prefix_len = 0;
    int output_len = 128;        // mean max_tokens
    double len_sigma = 0.5;      // log-normal sigma of both lengths; 0: fixed lengths
    double timeout_s = 600;      // per socket wait
    uint64_t seed = 1;
};

struct ServeLevel {
    int concurrency = 0;
    int n_requests = 0, n_ok = 0, n_failed = 0;
    std::string first_error;
    double duration_s = 0;
    double request_throughput = 0;   // successful requests/s
    double output_tokens_per_s = 0;  // all successful requests' output tokens / duration
    double total_tokens_per_s = 0;   // (prompt + output) tokens / duration
    double mean_input_tokens = 0, mean_output_tokens = 0;
    bool usage_reported = false;     // token counts came from the server's usage
    Summary ttft_s, itl_s, tpot_s, e2e_s;
    // How much an osprey server's reuse counters (GET /metrics) grew during the level: prefix-cache
    // hit tokens, prompt tokens n > 1 samples forked, saved window rings restored, preemptions. Empty
    // when the server has no such metrics (another server, or /metrics unreachable).
    std::vector<std::pair<std::string, double>> server_counters;
    json::Value to_json() const;
};

// The osprey counters run_serve reads from /metrics before and after each level.
inline constexpr const char* kServeCounterNames[] = {"osprey_prefix_cache_hits_total",
                                                     "osprey_forked_prompt_tokens_total",
                                                     "osprey_window_restores_total", "osprey_num_preemptions_total"};
// Values of `names` in a Prometheus text exposition (metrics without labels); absent ones are left out.
std::vector<std::pair<std::string, double>> parse_counters(std::string_view text, std::span<const char* const> names);

// Throws osprey::Error naming the first option out of range (run_serve checks them too; callers
// may check before any network work).
void check_serve_options(const ServeOptions& o);
// The served model id (GET /v1/models) when options.model is empty.
std::string resolve_model(const ServeOptions& o);
std::vector<ServeLevel> run_serve(const ServeOptions& o, const ProgressFn& progress);

}  // namespace osprey::benchtool
