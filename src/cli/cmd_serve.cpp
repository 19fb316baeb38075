// `osprey serve`: the OpenAI-compatible HTTP server (src/server) over the engine, on the CPU
// reference backend (or the CUDA backend when built with it and a GPU is present). Without --model
// it serves the built-in tiny model, created on first use like `osprey generate` does.
#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "cli/backend.h"
#include "cli/command.h"
#include "cli/speculative_flags.h"
#include "core/check.h"
#include "core/json.h"
#include "core/log.h"
#include "engine/engine.h"
#include "harmony/special_tokens.h"
#include "http/server.h"
#include "model/scripted_runner.h"
#include "model/synthetic.h"
#include "model/weights.h"
#include "server/openai_server.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using namespace osprey;

constexpr const char* kHelp =
    "usage: osprey serve [--model DIR] [--host ADDR] [--port N] [--api-key KEY | --api-key-file FILE]\n"
    "                    [--served-model-name NAME...] [--max-model-len N] [--max-num-seqs N]\n"
    "                    [--max-num-batched-tokens N] [--max-mixed-prefill-tokens N]\n"
    "                    [--mixed-prefill-min-decodes N] [--kv-cache-tokens N] [--page-size N]\n"
    "                    [--backend auto|cpu|cuda] [--threads N] [--tokenizer FILE]\n"
    "                    [--max-body-bytes N] [--default-max-tokens N] [--no-prefix-caching]\n"
    "                    [--tp N] [--ep N] [--dp N] [--allowed-origins LIST] [--shutdown-timeout S]\n"
    "                    [--weights fp8|mxfp4|bf16 [--convert LIST]] [--kv-cache-dtype auto|fp8|f32]\n"
    "                    [--speculative ngram|draft|eagle3 ...]\n"
    "                    [--ssl-certfile FILE --ssl-keyfile FILE] [connection limits, below]\n"
    "\n"
    "OpenAI-compatible HTTP server: POST /v1/chat/completions, /v1/completions, /v1/responses\n"
    "(streaming over SSE or not), GET/DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items,\n"
    "GET /v1/models, POST /tokenize and /detokenize, /health, /metrics, and a chat page at /. Without --model, serves the built-in tiny model (random weights), written\n"
    "on first use to $OSPREY_CACHE/tiny (default ~/.cache/osprey/tiny).\n"
    "\n"
    "  --host ADDR            address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)\n"
    "  --port N               TCP port (default 8000; 0 picks a free one)\n"
    "  --api-key KEY          require 'Authorization: Bearer KEY' on /v1 routes (also $OSPREY_API_KEY)\n"
    "  --api-key-file FILE    the same, the key read from FILE (first line)\n"
    "  --served-model-name NAME...  the model ids clients may send (default: the model folder's name);\n"
    "                         several (space- or comma-separated, or the flag repeated): responses carry\n"
    "                         the first\n"
    "  --allowed-origins LIST CORS: origins browsers may call from: '*' (default) or a list of exact\n"
    "                         origins ('[\"https://a.example\"]' as vLLM takes it, or comma-separated)\n"
    "  --shutdown-timeout S   on SIGTERM/SIGINT, requests running get S more seconds (default 10); then\n"
    "                         each stream ends with an error event and [DONE]; /health answers 503\n"
    "                         {\"status\": \"draining\"} meanwhile and new generations get 503. A second\n"
    "                         signal ends them at once\n"
    "  --max-model-len N      prompt + output tokens per request (default: the model's, capped by the KV cache)\n"
    "  --max-num-seqs N       sequences running at once (default 64)\n"
    "  --max-num-batched-tokens N  tokens per engine step (default 2048)\n"
    "  --max-mixed-prefill-tokens N  prefill tokens per step while sequences decode (default 512; 0: no\n"
    "                         limit but the step's): long prompts are then split into chunks of at most N\n"
    "                         (multiples of 64) so they do not stretch every decode step; steps with no\n"
    "                         decode give prefill the whole step budget\n"
    "  --mixed-prefill-min-decodes N  the limit above applies once N or more sequences decode (default 1)\n"
    "  --kv-cache-tokens N    cap the KV cache at N tokens\n"
    "  --backend B            auto (CUDA when built with it and a GPU is present), cpu or cuda\n"
    "  --weights F            convert the weights at load: fp8 (E4M3, 128x128 block scales; --convert\n"
    "                         attention,experts,unembedding picks the parts), bf16 (BF16 experts) or mxfp4\n"
    "                         (as published). A folder from `osprey convert` loads as it is. CPU backend\n"
    "                         only for fp8/bf16 so far (docs/fp8.md)\n"
    "  --kv-cache-dtype D     auto (the backend's own), fp8 (E4M3 + a scale per position and KV head;\n"
    "                         CPU and CUDA backends), bf16 (CUDA) or f32 (CPU)\n"
    "  --threads N            CPU backend threads (default: all cores; shared out over the ranks)\n"
    "  --tp N, --ep N         tensor / expert parallel degrees (default 1): attention split by KV heads,\n"
    "                         experts by rank and by intermediate columns; max(tp, ep) ranks, one thread\n"
    "                         each, on the CPU backend (the CUDA backend runs only 1 for now)\n"
    "  --dp N                 attention data parallelism (default 1): N groups of max(tp, ep) ranks, each\n"
    "                         with its own batch and KV cache (the cache flags hold per group), sharing\n"
    "                         the experts; requests go to the group holding their longest cached prefix,\n"
    "                         then the least loaded one\n"
    "  --tokenizer FILE       tokenizer.json or o200k_base.tiktoken (default: from the model folder,\n"
    "                         $OSPREY_TIKTOKEN_FILE or ~/.cache/osprey/o200k_base.tiktoken)\n"
    "  --max-body-bytes N     largest request body accepted (default 33554432)\n"
    "  --default-max-tokens N output limit of requests that set none (default: the rest of the context)\n"
    "%s"
    "  --ssl-certfile FILE    serve HTTPS: PEM certificate chain (with --ssl-keyfile)\n"
    "  --ssl-keyfile FILE     the certificate's PEM private key\n"
    "\n"
    "Connection limits (against slow, idle and non-reading clients):\n"
    "  --max-connections N    open connections (default 10000); when full, the one that has been sending\n"
    "                         its request head longest (else the longest-idle) is closed for the newcomer\n"
    "  --max-connections-per-ip N  open connections per client address (default 1024;\n"
    "                         0: no limit, e.g. behind a reverse proxy)\n"
    "  --request-header-timeout S  the whole request head within S seconds of its first byte (default 10)\n"
    "  --min-body-rate B      request bodies at B bytes/s at least, after the header timeout (default 65536)\n"
    "  --idle-timeout S       keep-alive connections idle S seconds are closed (default 120)\n"
    "  --write-timeout S      output pending S seconds without the client reading any is dropped and its\n"
    "                         request cancelled (default 60)\n"
    "  --stream-pause-bytes B a stream with more than B bytes unsent is paused: the engine stops\n"
    "                         generating for it until the client reads (default 262144)\n"
    "  --stream-pause-release S  a stream paused longer than S seconds gives up its batch slot and KV\n"
    "                         pages until it resumes (default 5)\n"
    "  --max-output-bytes B   unsent output above B bytes cancels the stream (default 16777216)\n"
    "\n"
    "Test only: $OSPREY_TEST_SCRIPT (Harmony text) makes every request generate exactly that text\n"
    "through a scripted model backend, to test tool calls end to end. Several scripts separated by\n"
    "'<<next turn>>' script an agent: a prompt holding k tool calls gets script k (the last past the end).\n";

// A flag that takes a list: `--NAME A B C` (values up to the next option), `--NAME A,B`,
// `--NAME '["A", "B"]'` (JSON, as vLLM's --allowed-origins), or the flag repeated. Removes every
// occurrence and its values from `argv`.
std::vector<std::string> take_list_flag(std::vector<std::string>& argv, const std::string& name) {
    std::vector<std::string> values, rest;
    auto add = [&](const std::string& t) {
        if (!t.empty() && t.front() == '[') {
            json::Value list;
            try {
                list = json::parse(t);
            } catch (const Error& e) {
                OSPREY_FAIL("--", name, ": not a JSON list: ", e.what());
            }
            OSPREY_CHECK(list.is_array(), "--", name, ": expected a JSON list of strings");
            for (const auto& v : list.as_array()) {
                OSPREY_CHECK(v.is_string() && !v.as_string().empty(), "--", name, ": expected non-empty strings");
                values.push_back(v.as_string());
            }
            return;
        }
        size_t at = 0;
        while (at <= t.size()) {
            size_t end = t.find(',', at);
            if (end == std::string::npos) end = t.size();
            std::string v = t.substr(at, end - at);
            while (!v.empty() && v.front() == ' ') v.erase(0, 1);
            while (!v.empty() && v.back() == ' ') v.pop_back();
            OSPREY_CHECK(!v.empty(), "--", name, " has an empty value");
            values.push_back(v);
            at = end + 1;
        }
    };
    const std::string flag = "--" + name;
    for (size_t i = 0; i < argv.size(); ++i) {
        if (argv[i].rfind(flag + "=", 0) == 0) {
            add(argv[i].substr(flag.size() + 1));
        } else if (argv[i] == flag) {
            OSPREY_CHECK(i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0, "option ", flag, " needs a value");
            while (i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0) add(argv[++i]);
        } else {
            rest.push_back(argv[i]);
        }
    }
    argv = std::move(rest);
    return values;
}

std::string read_key_file(const std::string& path) {
    std::ifstream in(path);
    OSPREY_CHECK(in.good(), "--api-key-file: cannot read '", path, "'");
    std::string key;
    std::getline(in, key);
    while (!key.empty() && (key.back() == '\r' || key.back() == ' ' || key.back() == '\t')) key.pop_back();
    OSPREY_CHECK(!key.empty(), "--api-key-file: '", path, "' holds no key on its first line");
    return key;
}

int positive_flag(const cli::Args& args, const char* name, long long fallback, long long hi) {
    const long long v = args.get_int(name, fallback);
    OSPREY_CHECK(v >= 0 && v <= hi, "--", name, " must be in [0, ", hi, "], got ", v);
    return int(v);
}

int run_serve(const std::vector<std::string>& given) {
    std::vector<std::string> argv = given;
    const std::vector<std::string> model_names = take_list_flag(argv, "served-model-name");
    const std::vector<std::string> origins = take_list_flag(argv, "allowed-origins");
    std::vector<std::string> value_flags = {"model",
                          "host",
                          "port",
                          "api-key",
                          "api-key-file",
                          "shutdown-timeout",
                          "max-model-len",
                          "max-num-seqs",
                          "max-num-batched-tokens",
                          "max-mixed-prefill-tokens",
                          "mixed-prefill-min-decodes",
                          "kv-cache-tokens",
                          "page-size",
                          "backend",
                          "threads",
                          "tokenizer",
                          "max-body-bytes",
                          "default-max-tokens",
                          "ssl-certfile",
                          "ssl-keyfile",
                          "max-connections",
                          "max-connections-per-ip",
                          "request-header-timeout",
                          "min-body-rate",
                          "idle-timeout",
                          "write-timeout",
                          "stream-pause-bytes",
                          "stream-pause-release",
                          "max-output-bytes",
                          "tp",
                          "ep",
                          "dp"};
    for (const std::string& f : cli::speculative_flag_names()) value_flags.push_back(f);
    for (const std::string& f : cli::format_flag_names()) value_flags.push_back(f);
    const cli::Args args(argv, value_flags, {"help", "no-prefix-caching"});
    if (args.has("help")) {
        std::printf(kHelp, cli::kSpeculativeHelp);
        return 0;
    }
    OSPREY_CHECK(args.positional().empty(), "unexpected argument '",
                 args.positional().empty() ? "" : args.positional()[0], "'");
    const auto t0 = std::chrono::steady_clock::now();
    // Block SIGINT / SIGTERM before any thread starts (engine, thread pool, CUDA), so every thread
    // inherits the mask and only the waiter below receives them: a clean shutdown, not a kill.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);

    server::ServerOptions so;
    OSPREY_CHECK(!(args.has("api-key") && args.has("api-key-file")), "give --api-key or --api-key-file, not both");
    if (args.has("api-key")) {
        so.api_key = args.get("api-key");
        OSPREY_CHECK(!so.api_key.empty(), "--api-key is empty");
    } else if (args.has("api-key-file")) {
        so.api_key = read_key_file(args.get("api-key-file"));
    } else if (const char* env = std::getenv("OSPREY_API_KEY"); env && *env) {
        so.api_key = env;
    }

    engine::EngineOptions eo;
    eo.max_model_len = positive_flag(args, "max-model-len", 0, 1 << 30);
    eo.max_num_seqs = positive_flag(args, "max-num-seqs", eo.max_num_seqs, 1 << 16);
    eo.max_batch_tokens = positive_flag(args, "max-num-batched-tokens", eo.max_batch_tokens, 1 << 24);
    eo.max_mixed_prefill_tokens =
        positive_flag(args, "max-mixed-prefill-tokens", eo.max_mixed_prefill_tokens, 1 << 24);
    OSPREY_CHECK(eo.max_mixed_prefill_tokens == 0 || eo.max_mixed_prefill_tokens >= engine::kPrefillChunkAlign,
                 "--max-mixed-prefill-tokens must be 0 (off) or >= ", engine::kPrefillChunkAlign);
    eo.mixed_prefill_min_decodes =
        positive_flag(args, "mixed-prefill-min-decodes", eo.mixed_prefill_min_decodes, 1 << 16);
    OSPREY_CHECK(eo.mixed_prefill_min_decodes >= 1, "--mixed-prefill-min-decodes must be >= 1");
    eo.max_kv_tokens = positive_flag(args, "kv-cache-tokens", 0, 1 << 30);
    eo.page_size = cli::page_size_flag(args, eo.page_size);
    eo.enable_prefix_caching = !args.has("no-prefix-caching");
    OSPREY_CHECK(eo.max_num_seqs >= 1 && eo.max_batch_tokens >= 1,
                 "--max-num-seqs and --max-num-batched-tokens must be >= 1");
    const int threads = positive_flag(args, "threads", 0, 1024);
    auto seconds_flag = [&](const char* name, double fallback) {
        const double v = args.get_double(name, fallback);
        OSPREY_CHECK(v > 0 && v <= 86400, "--", name, " must be in (0, 86400] seconds, got ", v);
        return v;
    };
    eo.paused_release_s = seconds_flag("stream-pause-release", eo.paused_release_s);
    const long long max_body = args.get_int("max-body-bytes", 32ll << 20);
    OSPREY_CHECK(max_body >= 1024 && max_body <= (1ll << 32), "--max-body-bytes must be in [1024, 2^32], got ",
                 max_body);
    so.default_max_tokens = positive_flag(args, "default-max-tokens", 0, 1 << 30);
    const std::string backend = cli::backend_flag(args);
    const model::ParallelLayout layout = cli::layout_flags(args);
    const double shutdown_timeout = args.get_double("shutdown-timeout", 10.0);
    OSPREY_CHECK(shutdown_timeout >= 0 && shutdown_timeout <= 86400, "--shutdown-timeout must be in [0, 86400] seconds");
    if (!origins.empty()) so.allowed_origins = origins;

    // The HTTP server binds now, before the model loads: a port in use is reported at once, not after
    // minutes of loading. Connections wait in the backlog until run(); the handler is set below.
    std::unique_ptr<server::OpenAiServer> api;
    http::HttpServerOptions ho;
    ho.host = args.get("host", "127.0.0.1");
    ho.port = positive_flag(args, "port", 8000, 65535);
    ho.limits.max_body_bytes = size_t(max_body);
    ho.max_connections = positive_flag(args, "max-connections", ho.max_connections, 1 << 20);
    ho.max_connections_per_ip = positive_flag(args, "max-connections-per-ip", ho.max_connections_per_ip, 1 << 20);
    OSPREY_CHECK(ho.max_connections >= 1, "--max-connections must be >= 1");
    ho.header_timeout_s = seconds_flag("request-header-timeout", ho.header_timeout_s);
    ho.idle_timeout_s = seconds_flag("idle-timeout", ho.idle_timeout_s);
    ho.write_timeout_s = seconds_flag("write-timeout", ho.write_timeout_s);
    ho.min_body_rate = args.get_double("min-body-rate", ho.min_body_rate);
    OSPREY_CHECK(ho.min_body_rate >= 1, "--min-body-rate must be >= 1 byte/s");
    const long long pause_bytes = args.get_int("stream-pause-bytes", (long long)ho.stream_pause_bytes);
    const long long max_output = args.get_int("max-output-bytes", (long long)ho.max_output_bytes);
    OSPREY_CHECK(pause_bytes >= 1024 && max_output >= pause_bytes && max_output <= (1ll << 34),
                 "need 1024 <= --stream-pause-bytes <= --max-output-bytes <= 2^34");
    ho.stream_pause_bytes = size_t(pause_bytes);
    ho.max_output_bytes = size_t(max_output);
    ho.tls_cert_file = args.get("ssl-certfile");
    ho.tls_key_file = args.get("ssl-keyfile");
    ho.error_response = server::OpenAiServer::transport_error;
    http::HttpServer http(ho, [&api](const http::HttpRequest& r) { return api->handle(r); });

    // A draft model decodes every running sequence in one forward: a logit row and a slice each.
    cli::SpeculativeSetup spec = cli::speculative_flags(args, {.backend = backend,
                                                               .fall_back_to_cpu = true,
                                                               .cpu_threads = threads,
                                                               .max_logit_rows = std::max(256, eo.max_num_seqs),
                                                               .max_slices = std::max(256, eo.max_num_seqs + 1)});
    eo.speculative = spec.options;

    // The model and its tokenizer.
    const char* script = std::getenv("OSPREY_TEST_SCRIPT");
    const bool scripted = script && *script;
    fs::path dir;
    if (args.has("model")) {
        dir = args.get("model");
    } else if (!scripted) {
        dir = cli::builtin_model_dir();
    }
    std::optional<tok::Tokenizer> tokenizer;
    try {
        tokenizer = args.has("tokenizer") ? tok::Tokenizer::from_file(args.get("tokenizer"))
                                          : tok::Tokenizer::from_model_dir(dir);
    } catch (const Error& e) {
        OSPREY_FAIL("the server needs the o200k_harmony tokenizer: ", e.what(),
                    " (pass --tokenizer FILE or set OSPREY_TIKTOKEN_FILE to o200k_base.tiktoken)");
    }

    backends::Runner made;  // the model backend (and, for CUDA, the weights it was loaded from)
    std::unique_ptr<model::ModelRunner> runner;
    std::string loaded;
    if (scripted) {
        // Several scripts, one per agent turn, are separated by kNextTurn (model/scripted_runner.h).
        constexpr std::string_view kNextTurn = "<<next turn>>";
        std::vector<std::vector<int32_t>> scripts;
        const std::string text = script;
        for (size_t at = 0;;) {
            const size_t end = text.find(kNextTurn, at);
            scripts.push_back(tokenizer->encode(text.substr(at, end - at), tok::Specials::allowed));
            if (end == std::string::npos) break;
            at = end + kNextTurn.size();
        }
        runner = std::make_unique<model::ScriptedRunner>(model::preset_config("tiny"), scripts);
        loaded = str("a SCRIPTED test backend ($OSPREY_TEST_SCRIPT, ", scripts.size(), " script(s), ",
                     scripts[0].size(), " tokens in the first)");
        so.model_name = "osprey-scripted";
    } else {
        model::Weights weights = model::Weights::load(dir);
        const model::Config c = weights.config;
        loaded =
            str(fs::absolute(dir).lexically_normal().string(), " (", c.n_layers, " layers, d_model ", c.d_model, ", ",
                c.n_experts, " experts, vocab ", c.vocab_size, ", ", weights.total_bytes() / (1 << 20), " MiB)");
        // A speculative verify asks for 1 + k logit rows per sequence.
        const int logit_rows = spec.options.enabled() ? std::max(256, eo.max_num_seqs * (1 + spec.options.num_tokens)) : 0;
        backends::RunnerOptions ro{.backend = backend,
                                   .fall_back_to_cpu = true,
                                   .cpu_threads = threads,
                                   .max_logit_rows = logit_rows,
                                   .layout = layout};
        cli::format_flags(args, ro);
        if (!cli::format_summary(ro).empty()) loaded += str(", ", cli::format_summary(ro));
        made = backends::make_runner(std::move(weights), ro);
        runner = std::move(made.runner);
        std::string name = fs::absolute(dir).lexically_normal().filename().string();
        so.model_name = name.empty() ? "osprey" : name;
        so.model_path = fs::absolute(dir).lexically_normal().string();
    }
    if (!scripted) {
        cli::attach_eagle3(spec, *runner, dir);
        eo.speculative = spec.options;
    }
    if (!model_names.empty()) {
        so.model_name = model_names[0];
        so.extra_model_names.assign(model_names.begin() + 1, model_names.end());
    }

    engine::Engine engine(*runner, eo);
    engine.start();
    api = std::make_unique<server::OpenAiServer>(engine, *tokenizer, so);

    // Many concurrent clients need many descriptors: raise the soft limit to the hard one.
    rlimit files{};
    if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
        files.rlim_cur = files.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &files);
    }

    // SIGINT / SIGTERM drain the server: one thread waits for them (blocked everywhere else, see
    // above). The first lets running requests finish within --shutdown-timeout, a second ends them now.
    std::atomic<bool> exiting{false};
    std::thread waiter([&http, &api, &exiting, signals, shutdown_timeout] {
        for (int n = 0;; ++n) {
            int sig = 0;
            sigwait(&signals, &sig);
            if (exiting) return;
            api->context().draining = true;
            if (n == 0) std::printf("osprey serve: draining (up to %.0f s for running requests)\n", shutdown_timeout);
            std::fflush(stdout);
            http.drain(n == 0 ? shutdown_timeout : 0.0);
        }
    });

    const engine::EngineStats stats = engine.stats();
    const double startup = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("osprey serve: model %s\n", loaded.c_str());
    std::printf("  backend %s; served as '%s'\n", runner->name().c_str(), so.model_name.c_str());
    std::printf("  KV cache: %lld tokens (%d pages of %d), max %d sequences, max_model_len %d\n",
                static_cast<long long>(stats.kv_capacity_tokens), stats.n_pages, stats.page_size, eo.max_num_seqs,
                engine.max_model_len());
    if (eo.speculative.enabled())
        std::printf("  speculative decoding: %s, k = %d%s\n", stats.spec_method.c_str(), eo.speculative.num_tokens,
                    eo.speculative.forced() ? " (FORCED ACCEPTANCE: test mode, output is not the model's)" : "");
    std::printf("  API key %s; started in %.2f s\n", so.api_key.empty() ? "off" : "required", startup);
    const std::string shown_host = ho.host.find(':') != std::string::npos ? "[" + ho.host + "]" : ho.host;
    std::printf("  listening on %s://%s:%d  (chat page at /, API under /v1)\n", http.tls() ? "https" : "http",
                shown_host.c_str(), http.port());
    std::fflush(stdout);

    http.run();
    std::printf("osprey serve: shutting down\n");
    std::fflush(stdout);
    exiting = true;
    pthread_kill(waiter.native_handle(), SIGTERM);
    waiter.join();
    engine.stop();
    return 0;
}

}  // namespace

OSPREY_COMMAND(serve, "OpenAI-compatible HTTP server (chat, completions, responses, metrics, chat page)", run_serve);
