// What every route handler shares: the engine, the tokenizer, the metrics, the stored responses and
// the server's options. Owned by OpenAiServer; jobs keep a reference (they never outlive it).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "frontend/submit.h"
#include "server/generation_fields.h"
#include "server/metrics.h"
#include "server/response_store.h"
#include "tokenizer/tokenizer.h"

namespace osprey::server {

struct ServerOptions {
    std::string model_name = "osprey";     // the id /v1/models lists first and responses carry
    std::vector<std::string> extra_model_names;  // more ids requests may name (--served-model-name A B)
    // Origins browsers may call from (CORS): {"*"} for any (the default, as vLLM's), else the exact
    // "scheme://host[:port]" values; an empty list sends no CORS headers.
    std::vector<std::string> allowed_origins = {"*"};
    std::string model_path;                // shown in /v1/models (root)
    std::string api_key;                   // empty: /v1 routes are open
    size_t max_stored_responses = 10000;   // /v1/responses with store: oldest dropped beyond this
    int default_max_tokens = 0;            // output limit of requests that give none (0: the rest of the context)
};

struct ServerContext {
    engine::Engine& engine;
    const tok::Tokenizer& tokenizer;
    ServerOptions options;
    GenerationLimits limits;
    int max_model_len = 0;
    int64_t created = 0;  // unix time the server started ("created" of /v1/models)
    Metrics metrics;
    ResponseStore responses;
    std::atomic<uint64_t> next_request{1};
    std::atomic<bool> draining{false};  // shutting down: /health says so, new generations get 503

    ServerContext(engine::Engine& e, const tok::Tokenizer& t, ServerOptions o)
        : engine(e), tokenizer(t), options(std::move(o)), responses(options.max_stored_responses) {}

    // The engine, tokenizer and context limits, for the front end's submit_rendered().
    frontend::SubmitTarget target() { return {engine, tokenizer, max_model_len, options.default_max_tokens}; }

    // A new id with this prefix: "chatcmpl-1a2b...".
    std::string new_id(const char* prefix);
};

int64_t unix_time();

}  // namespace osprey::server
