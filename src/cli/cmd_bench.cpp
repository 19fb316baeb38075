// `osprey bench`: prefill and decode benchmarks of a model backend, a load generator for an
// OpenAI-compatible server, and charts of the results. Each run writes PREFIX.json and PREFIX.md
// (the run's layout, model, weight format, device, commit and date, then the results).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "benchtool/chart.h"
#include "benchtool/model_bench.h"
#include "benchtool/png.h"
#include "benchtool/report.h"
#include "benchtool/run_info.h"
#include "benchtool/serve_bench.h"
#include "backends/eagle3_proposer.h"
#include "cli/backend.h"
#include "cli/command.h"
#include "core/check.h"
#include "core/file.h"
#include "engine/engine.h"
#include "engine/speculative.h"
#include "model/weights.h"

namespace {

namespace fs = std::filesystem;
using namespace osprey;
using benchtool::fixed;

constexpr const char* kHelp =
    "usage: osprey bench prefill [common] [--lengths 1024,2048,4096,8192,16384,32768] [--repeats 5] [--warmup 1]\n"
    "       osprey bench decode  [common] [--batches 1,2,4,8,16,32,64,128] [--contexts 8192,32768]\n"
    "                            [--speculative ngram|draft [--num-speculative-tokens K]\n"
    "                             [--forced-accept-len 0,1,2,3,4] [--forced-accept-fraction 0.5,0.8]\n"
    "                             [--spec-adaptive 1] [--draft-model DIR] [--eagle3-model DIR]]\n"
    "                            [--steps 32] [--warmup 4] [--kv-fill prefill|copy|shared]\n"
    "       osprey bench serve   [--url http://127.0.0.1:8000] [--served-model ID] [--api-key KEY]\n"
    "                            [--concurrency 1,2,4,8,16,32,64,128] [--requests N] [--request-rate R]\n"
    "                            [--input-len 256] [--prefix-len 0] [--output-len 128] [--len-sigma 0.5]\n"
    "                            [--timeout S]\n"
    "                            [--endpoint chat|completions] [--gpu-price 3.00] [--tp N --ep N --dp N]\n"
    "                            [--out PREFIX] [--seed S]\n"
    "       osprey bench plot    REPORT.json... [--out DIR] [--width 960] [--height 640]\n"
    "\n"
    "common: [--model DIR] [--backend auto|cpu|cuda] [--threads N] [--tp 1] [--ep 1] [--dp 1]\n"
    "        [--gpu-price 3.00] [--chunk 8192] [--page-size 32] [--seed S] [--out PREFIX]\n"
    "        [--weights fp8|mxfp4|bf16 [--convert LIST]] [--kv-cache-dtype auto|fp8|f32|bf16]\n"
    "        [--moe-gemm w4a16|w4a8] (docs/fp8.md)\n"
    "\n"
    "prefill: batch 1, random prompts of each length (chunks of --chunk tokens); time to first token\n"
    "  (median, p90 over --repeats after --warmup), input tokens/s, USD per million input tokens.\n"
    "decode: every batch size at every context length (the KV cache holds that many positions per\n"
    "  sequence before timing); step latency (median, p90), tokens/s per user and in total, USD per\n"
    "  million output tokens. --kv-fill prefill (default) prefills every sequence for real; copy\n"
    "  prefills one and copies its K/V into every sequence's own pages; shared prefills each context\n"
    "  once and shares its pages (see docs/benchmarks.md). Batch sizes whose KV cache does not fit\n"
    "  are skipped and listed. With --speculative, decode runs through the engine instead: the batch\n"
    "  without speculation, then with it at each --forced-accept-len L (a test mode accepting the first\n"
    "  L proposals: mean accepted length L + 1 on random weights) and each --forced-accept-fraction F\n"
    "  (each proposal accepted with probability F), or at the proposer's own acceptance when neither is\n"
    "  given; tokens/s against accepted length (docs/speculative.md). Speculative runs default to\n"
    "  --steps 128 --warmup 64, so that the timed steps see the adaptive policy's and the back-off's\n"
    "  steady state (and every verify shape's CUDA graph captured); --spec-adaptive 0 proposes on every\n"
    "  step (the policy off).\n"
    "serve: streamed chat completions against a running server at each concurrency (Poisson arrivals\n"
    "  at --request-rate req/s, or all at once when 0); TTFT, inter-token latency, TPOT, end-to-end\n"
    "  latency percentiles and throughput. Reasoning deltas count as generated tokens. --endpoint\n"
    "  completions sends raw-text /v1/completions instead (no chat format: for random-weight models).\n"
    "plot: speed per user vs cost per million tokens, one curve per layout and context, as PNG + SVG.\n"
    "\n"
    "Without --model, the built-in tiny model (random weights) is used. --gpu-price is USD per\n"
    "GPU-hour (times the GPUs of the layout: max(tp, ep) x dp). --tp/--ep/--dp above 1 run on the CPU\n"
    "backend (one thread per rank; --threads is shared out over the ranks); the CUDA backend runs\n"
    "only 1 for now. With --dp N, decode spreads its sequences over the N groups' caches (sequence i in\n"
    "group i mod N); a prefill is one request, run by one group. --out PREFIX writes PREFIX.json and\n"
    "PREFIX.md (default osprey-bench-<command>).\n";

std::vector<int> parse_int_list(const std::string& flag, const std::string& text, int lo = 1) {
    std::vector<int> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        const std::optional<long long> v = cli::parse_integer(item);
        OSPREY_CHECK(v && *v >= lo && *v <= (1 << 24), "--", flag, ": '", item, "' is not a ",
                     lo > 0 ? "positive" : "non-negative", " integer (expected a list like 1,2,4)");
        out.push_back(int(*v));
    }
    OSPREY_CHECK(!out.empty(), "--", flag, " is empty");
    return out;
}

int int_flag(const cli::Args& a, const char* flag, int fallback, int lo, int hi) {
    const long long v = a.get_int(flag, fallback);
    OSPREY_CHECK(v >= lo && v <= hi, "--", flag, " must be in [", lo, ", ", hi, "], got ", v);
    return int(v);
}

double price_flag(const cli::Args& a) {
    const double p = a.get_double("gpu-price", 3.0);
    OSPREY_CHECK(p >= 0 && p <= 1e6, "--gpu-price must be in [0, 1e6] USD per GPU-hour, got ", p);
    return p;
}

std::string model_summary(const model::Config& c) {
    std::string shape = c.n_layers == 24 && c.n_experts == 32   ? "gpt-oss-20b shape"
                        : c.n_layers == 36 && c.n_experts == 128 ? "gpt-oss-120b shape"
                                                                 : "gpt-oss family";
    return str(shape, ": ", c.n_layers, " layers, d_model ", c.d_model, ", ", c.n_experts, " experts (top-", c.top_k,
               "), vocab ", c.vocab_size);
}

// The model and backend of a prefill/decode run, with the run's metadata filled in.
struct Backend {
    std::optional<model::Weights> weights;  // kept beside a CUDA runner
    std::unique_ptr<model::ModelRunner> runner;
    benchtool::RunInfo info;
};

Backend open_backend(const cli::Args& a, const std::string& command, int max_tokens, int max_rows) {
    Backend b;
    b.info = benchtool::RunInfo::now(command);
    b.info.layout = cli::layout_flags(a);
    b.info.price_per_gpu_hour = price_flag(a);
    const std::string backend = cli::backend_flag(a);
    const int threads = int_flag(a, "threads", 0, 0, 1024);
    const fs::path dir = cli::model_dir_flag(a);
    b.weights = model::Weights::load(dir);
    const model::Config c = b.weights->config;
    b.info.checkpoint = fs::absolute(dir).lexically_normal().string();
    b.info.checkpoint_layout = model::layout_name(b.weights->layout);
    b.info.model = model_summary(c);
    backends::RunnerOptions ro{.backend = backend,
                               .cpu_threads = threads,
                               .max_tokens = max_tokens,
                               .max_logit_rows = std::max(max_rows, 1),
                               .max_slices = std::max(max_rows, 1) + 1,
                               .layout = b.info.layout};
    cli::format_flags(a, ro);
    backends::Runner made = backends::make_runner(std::move(*b.weights), ro);
    b.runner = std::move(made.runner);
    b.weights = std::move(made.weights);
    b.info.backend = made.backend;
    const std::string formats = ro.weights_format || ro.kv_dtype ? cli::format_summary(ro) + "; " : std::string();
    if (made.backend == "cuda") {
        b.info.device = b.runner->name();
        b.info.weight_format = str("MXFP4 experts (as shipped), BF16 attention/router/embeddings; BF16 activations, ",
                                   b.runner->kv_dtype() == model::KvDtype::fp8_e4m3 ? "FP8 (E4M3) KV" : "BF16 KV");
    } else {
        const unsigned n = threads > 0 ? unsigned(threads) : std::max(1u, std::thread::hardware_concurrency());
        b.info.device = str(b.runner->name(), " (", benchtool::cpu_model_name(), ", ", n, " threads)");
        b.info.weight_format = ro.weights_format || ro.kv_dtype
                                   ? str(formats, "FP32 activations, KV ", model::kv_dtype_name(b.runner->kv_dtype()))
                                   : "MXFP4 experts (as shipped), BF16 attention/router/embeddings; FP32 activations "
                                     "and KV";
    }
    return b;
}

std::string out_prefix(const cli::Args& a, const std::string& command) {
    const std::string p = a.get("out", "osprey-bench-" + command);
    OSPREY_CHECK(!p.empty(), "--out is empty");
    const fs::path parent = fs::path(p).parent_path();
    if (!parent.empty()) fs::create_directories(parent);
    return p;
}

void write_outputs(const std::string& prefix, const json::Value& report, const std::string& markdown) {
    benchtool::write_text_file(prefix + ".json", report.dump(2) + "\n");
    benchtool::write_text_file(prefix + ".md", markdown);
    std::printf("wrote %s.json and %s.md\n", prefix.c_str(), prefix.c_str());
}

json::Array int_array(const std::vector<int>& v) {
    json::Array a;
    for (int x : v) a.push_back(x);
    return a;
}

void print_line(const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
}

const std::vector<std::string> kModelFlags = {"model", "backend",   "threads", "tp",   "ep",  "dp",
                                              "gpu-price", "chunk", "page-size", "seed", "out", "warmup",
                                              "weights",   "convert", "kv-cache-dtype", "moe-gemm"};

int bench_prefill(const std::vector<std::string>& argv) {
    std::vector<std::string> flags = kModelFlags;
    flags.insert(flags.end(), {"lengths", "repeats"});
    const cli::Args a(argv, flags);
    OSPREY_CHECK(a.positional().empty(), "unexpected argument '", a.positional().empty() ? "" : a.positional()[0], "'");
    benchtool::PrefillOptions o;
    if (a.has("lengths")) o.lengths = parse_int_list("lengths", a.get("lengths"));
    o.repeats = int_flag(a, "repeats", o.repeats, 1, 100000);
    o.warmup = int_flag(a, "warmup", o.warmup, 0, 100000);
    o.chunk = int_flag(a, "chunk", o.chunk, 1, 1 << 20);
    o.page_size = cli::page_size_flag(a, o.page_size);
    o.seed = uint64_t(a.get_int("seed", 1));
    const std::string prefix = out_prefix(a, "prefill");
    Backend b = open_backend(a, "prefill", o.chunk, 1);
    print_line(str("osprey bench prefill: ", b.info.model, " on ", b.info.device, ", layout ", b.info.layout.label()));
    const auto rows = benchtool::run_prefill(*b.runner, o, b.info.price_per_hour(), print_line);

    json::Value settings = json::Object{};
    settings.set("lengths", int_array(o.lengths));
    settings.set("batch", 1);
    settings.set("repeats", o.repeats);
    settings.set("warmup", o.warmup);
    settings.set("chunk", o.chunk);
    settings.set("page_size", o.page_size);
    settings.set("seed", int64_t(o.seed));
    json::Array results;
    std::vector<std::vector<std::string>> table;
    for (const auto& r : rows) {
        results.push_back(r.to_json());
        table.push_back({std::to_string(r.prompt_tokens), fixed(r.ttft_s.median * 1e3, 2), fixed(r.ttft_s.p90 * 1e3, 2),
                         fixed(r.input_tokens_per_s, 1), fixed(r.cost_per_million_input, 4)});
    }
    const std::string md =
        str("# osprey bench prefill\n\n", benchtool::markdown_run_info(b.info), "- settings: batch 1, ", o.repeats,
            " timed runs after ", o.warmup, " warm-up per length, chunks of ", o.chunk, " tokens\n\n",
            benchtool::markdown_table({"prompt tokens", "TTFT median (ms)", "TTFT p90 (ms)", "input tokens/s",
                                       "USD / M input tokens"},
                                      table));
    write_outputs(prefix, benchtool::make_report(b.info, std::move(settings), std::move(results)), md);
    return 0;
}

// `bench decode --speculative M`: decode through the engine (its scheduler, verify steps and
// rollback), the same batch first without speculation, then with M at every --forced-accept-len L
// (the test mode that accepts the first L proposals: mean accepted length L + 1 on random weights),
// or at M's own acceptance when no L is given. Reports tokens/s against the mean accepted length.
int bench_decode_speculative(const cli::Args& a, const benchtool::DecodeOptions& o) {
    engine::SpeculativeOptions base;
    base.method = engine::parse_spec_method(a.get("speculative"));
    base.num_tokens = int_flag(a, "num-speculative-tokens", base.num_tokens, 1, 16);
    base.ngram_min = int_flag(a, "ngram-min", base.ngram_min, 1, 64);
    base.ngram_max = int_flag(a, "ngram-max", std::max(base.ngram_max, base.ngram_min), 1, 64);
    base.adaptive = int_flag(a, "spec-adaptive", 1, 0, 1) == 1;
    const int k = base.num_tokens;
    std::vector<int> lens;
    if (a.has("forced-accept-len")) lens = parse_int_list("forced-accept-len", a.get("forced-accept-len"), 0);
    for (int l : lens) OSPREY_CHECK(l >= 0 && l <= k, "--forced-accept-len values must be in [0, k = ", k, "]");
    std::vector<double> fractions;
    if (a.has("forced-accept-fraction")) {
        std::stringstream ss(a.get("forced-accept-fraction"));
        for (std::string item; std::getline(ss, item, ',');) {
            char* end = nullptr;
            const double f = std::strtod(item.c_str(), &end);
            OSPREY_CHECK(!item.empty() && end && *end == '\0' && f >= 0.0 && f <= 1.0,
                         "--forced-accept-fraction values must be numbers in [0, 1], got '", item, "'");
            fractions.push_back(f);
        }
    }
    const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
    std::optional<backends::Runner> draft;
    Backend b = open_backend(a, "decode-speculative", std::max(o.chunk, max_batch * (1 + k)), max_batch * (1 + k));
    if (base.method == engine::SpecMethod::draft) {
        OSPREY_CHECK(a.has("draft-model"), "--speculative draft needs --draft-model DIR");
        draft = backends::make_runner(model::Weights::load(a.get("draft-model")),
                                      {.backend = b.info.backend,
                                       .max_tokens = std::max(o.chunk, max_batch),
                                       .max_logit_rows = max_batch,
                                       .max_slices = max_batch + 1});
        base.draft_runner = draft->runner.get();
    }
    std::optional<model::Weights> target_weights;  // an EAGLE-3 head reads the target's embedding
    if (base.method == engine::SpecMethod::eagle3) {
        OSPREY_CHECK(a.has("eagle3-model"), "--speculative eagle3 needs --eagle3-model DIR");
        base.eagle3_dir = a.get("eagle3-model");
        target_weights = model::Weights::load(cli::model_dir_flag(a));
        base.custom = backends::make_eagle3_proposer(base.eagle3_dir, *b.runner, &target_weights->embedding);
    }
    base.validate();
    print_line(str("osprey bench decode --speculative ", engine::spec_method_name(base.method), " (k = ", k, "): ",
                   b.info.model, " on ", b.info.device));
    const std::string prefix = out_prefix(a, "decode-speculative");
    const int vocab = b.runner->config().vocab_size;
    std::mt19937_64 rng(o.seed);
    json::Array results;
    std::vector<std::vector<std::string>> table;
    for (int context : o.contexts)
        for (int batch : o.batches) {
            double base_rate = 0;
            // Each run: no speculation (the baseline), the proposer's own acceptance, forced L, forced F.
            struct Run {
                std::string mode;
                int len = -1;         // forced_accept_len
                double frac = -1.0;   // forced_accept_fraction
                bool spec = true;
            };
            std::vector<Run> runs = {{.mode = "off", .spec = false}};
            if (lens.empty() && fractions.empty()) runs.push_back({.mode = "proposer"});
            for (int l : lens) runs.push_back({.mode = str("forced L=", l), .len = l});
            for (double f : fractions) runs.push_back({.mode = str("forced F=", fixed(f, 2)), .frac = f});
            for (const Run& run : runs) {
                engine::EngineOptions eo;
                eo.page_size = o.page_size;
                eo.max_num_seqs = batch;
                eo.max_batch_tokens = std::max(o.chunk, batch * (1 + k));
                eo.max_mixed_prefill_tokens = 0;  // every prompt at full speed before the timed steps
                eo.enable_prefix_caching = false;
                // Sequences prefilled first decode (1 + k tokens a step) while the later ones prefill.
                const int prefill_steps = int((int64_t(batch) * context + eo.max_batch_tokens - 1) / eo.max_batch_tokens);
                const int max_new = (o.warmup + o.steps + prefill_steps + 2) * (k + 1) + 1;
                eo.max_kv_tokens = int64_t(batch) * (context + max_new + 2 * o.page_size);
                if (run.spec) {
                    eo.speculative = base;
                    eo.speculative.forced_accept_len = run.len;
                    eo.speculative.forced_accept_fraction = run.frac;
                }
                engine::Engine eng(*b.runner, eo);
                std::vector<std::shared_ptr<engine::RequestStream>> streams;
                for (int i = 0; i < batch; ++i) {
                    engine::Request r;
                    r.id = str("bench-", i);
                    r.prompt.resize(size_t(context));
                    for (int32_t& t : r.prompt) t = int32_t(rng() % uint64_t(vocab));
                    r.max_new_tokens = max_new;
                    r.sampling.temperature = 0;
                    streams.push_back(eng.submit(std::move(r)));
                }
                auto drain = [&] {
                    for (auto& st : streams)
                        while (st->try_pop()) {
                        }
                };
                while (eng.stats().n_generated_tokens < uint64_t(batch)) {  // prefills: every first token
                    OSPREY_CHECK(eng.step(), "bench: the engine stopped before every request started");
                    drain();
                }
                for (int i = 0; i < o.warmup; ++i) eng.step(), drain();
                const engine::EngineStats s0 = eng.stats();
                const auto t0 = std::chrono::steady_clock::now();
                for (int i = 0; i < o.steps; ++i) eng.step(), drain();
                const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                const engine::EngineStats s1 = eng.stats();
                OSPREY_CHECK(s1.n_finished == 0, "bench: a request finished during the timed steps");
                const double tokens = double(s1.n_generated_tokens - s0.n_generated_tokens);
                const double verifies = double(s1.n_spec_verifies - s0.n_spec_verifies);
                const double accepted = double(s1.n_spec_accepted_tokens - s0.n_spec_accepted_tokens);
                const double mean_len = verifies > 0 ? (verifies + accepted) / verifies : 1.0;
                const double rate = tokens / sec;
                if (!run.spec) base_rate = rate;
                const std::string& mode = run.mode;
                print_line(str("context ", context, " batch ", batch, " ", mode, ": mean accepted length ",
                               fixed(mean_len, 2), ", ", fixed(rate, 1), " tokens/s (", fixed(rate / batch, 1),
                               " per user), step ", fixed(sec / o.steps * 1e3, 3), " ms, ",
                               fixed(rate / base_rate, 3), "x"));
                json::Value row = json::Object{};
                row.set("context", context);
                row.set("batch", batch);
                row.set("mode", mode);
                row.set("forced_accept_len", run.len);
                row.set("forced_accept_fraction", run.frac);
                row.set("draft_tokens_per_step",
                        double(s1.n_spec_draft_tokens - s0.n_spec_draft_tokens) / double(o.steps));
                row.set("mean_accepted_length", mean_len);
                row.set("tokens_per_s", rate);
                row.set("tokens_per_s_per_user", rate / batch);
                row.set("step_ms", sec / o.steps * 1e3);
                row.set("speedup", rate / base_rate);
                results.push_back(std::move(row));
                table.push_back({std::to_string(context), std::to_string(batch), mode, fixed(mean_len, 2),
                                 fixed(sec / o.steps * 1e3, 3), fixed(rate / batch, 1), fixed(rate, 1),
                                 fixed(rate / base_rate, 3)});
            }
        }
    json::Value settings = json::Object{};
    settings.set("speculative", engine::spec_method_name(base.method));
    settings.set("num_speculative_tokens", k);
    settings.set("steps", o.steps);
    settings.set("warmup", o.warmup);
    settings.set("adaptive", base.adaptive);
    const std::string md =
        str("# osprey bench decode --speculative ", engine::spec_method_name(base.method), "\n\n",
            benchtool::markdown_run_info(b.info), "- settings: k = ", k, ", ", o.steps, " timed engine steps after ",
            o.warmup, " warm-up; random prompts, greedy; forced L accepts the first L proposals, forced F each\n"
            "  with probability F (test modes); adaptive proposing ", base.adaptive ? "on" : "off", "\n\n",
            benchtool::markdown_table({"context", "batch", "mode", "mean accepted length", "step (ms)",
                                       "tokens/s per user", "total tokens/s", "vs off"},
                                      table));
    write_outputs(prefix, benchtool::make_report(b.info, std::move(settings), std::move(results)), md);
    return 0;
}

int bench_decode(const std::vector<std::string>& argv) {
    std::vector<std::string> flags = kModelFlags;
    flags.insert(flags.end(), {"batches", "contexts", "steps", "kv-fill", "speculative", "num-speculative-tokens",
                               "ngram-min", "ngram-max", "draft-model", "eagle3-model", "forced-accept-len",
                               "forced-accept-fraction", "spec-adaptive"});
    const cli::Args a(argv, flags);
    OSPREY_CHECK(a.positional().empty(), "unexpected argument '", a.positional().empty() ? "" : a.positional()[0], "'");
    benchtool::DecodeOptions o;
    if (a.has("batches")) o.batches = parse_int_list("batches", a.get("batches"));
    if (a.has("contexts")) o.contexts = parse_int_list("contexts", a.get("contexts"));
    // Speculative runs: long enough for the adaptive policy's and the back-off's steady state (the
    // back-off reaches its longest pause after ~130 output tokens; a probe at batch 1 runs every few
    // dozen steps), after a warm-up that also captures the verify shapes' CUDA graphs.
    const bool spec = a.has("speculative");
    o.steps = int_flag(a, "steps", spec ? 128 : o.steps, 1, 1000000);
    o.warmup = int_flag(a, "warmup", spec ? 64 : o.warmup, 0, 1000000);
    o.chunk = int_flag(a, "chunk", o.chunk, 1, 1 << 20);
    o.page_size = cli::page_size_flag(a, o.page_size);
    o.fill = benchtool::parse_kv_fill(a.get("kv-fill", "prefill"));
    o.seed = uint64_t(a.get_int("seed", 1));
    if (a.has("speculative")) return bench_decode_speculative(a, o);
    const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
    const std::string prefix = out_prefix(a, "decode");
    Backend b = open_backend(a, "decode", std::max(o.chunk, max_batch), max_batch);
    print_line(str("osprey bench decode: ", b.info.model, " on ", b.info.device, ", layout ", b.info.layout.label()));
    const benchtool::DecodeResults res = benchtool::run_decode(*b.runner, o, b.info.price_per_hour(), print_line);

    json::Value settings = json::Object{};
    settings.set("batches", int_array(o.batches));
    settings.set("contexts", int_array(o.contexts));
    settings.set("steps", o.steps);
    settings.set("warmup", o.warmup);
    settings.set("chunk", o.chunk);
    settings.set("page_size", o.page_size);
    settings.set("kv_fill", benchtool::kv_fill_name(o.fill));
    settings.set("seed", int64_t(o.seed));
    json::Array results;
    std::vector<std::vector<std::string>> table;
    for (const auto& r : res.rows) {
        results.push_back(r.to_json());
        table.push_back({std::to_string(r.context), std::to_string(r.batch), fixed(r.mean_context, 0),
                         fixed(r.step_s.median * 1e3, 3), fixed(r.step_s.p90 * 1e3, 3),
                         fixed(r.tokens_per_s_per_user, 1), fixed(r.total_tokens_per_s, 1),
                         fixed(r.cost_per_million_output, 4)});
    }
    json::Array skipped;
    std::string skipped_md;
    for (const auto& k : res.skipped) {
        skipped.push_back(k.to_json());
        skipped_md += str("- context ", k.context, ", batch ", k.batch, ": not run, its KV cache needs ",
                          fixed(double(k.kv_bytes_needed) / double(1 << 30), 1), " GiB and ",
                          fixed(double(k.kv_bytes_available) / double(1 << 30), 1), " GiB are free\n");
    }
    const std::string md =
        str("# osprey bench decode\n\n", benchtool::markdown_run_info(b.info), "- settings: ", o.steps,
            " timed steps after ", o.warmup, " warm-up per batch size; KV cache filled by --kv-fill ",
            benchtool::kv_fill_name(o.fill), "\n\n",
            benchtool::markdown_table({"context", "batch", "mean context", "step median (ms)", "step p90 (ms)",
                                       "tokens/s per user", "total tokens/s", "USD / M output tokens"},
                                      table),
            skipped_md.empty() ? "" : "\nBatch sizes that do not fit:\n\n" + skipped_md);
    json::Value report = benchtool::make_report(b.info, std::move(settings), std::move(results));
    report.set("skipped", std::move(skipped));
    write_outputs(prefix, report, md);
    return 0;
}

int bench_serve(const std::vector<std::string>& argv) {
    const cli::Args a(
        argv, {"url", "served-model", "api-key", "concurrency", "requests", "request-rate", "input-len", "output-len",
               "len-sigma", "timeout", "gpu-price", "tp", "ep", "dp", "out", "seed", "endpoint", "prefix-len"});
    OSPREY_CHECK(a.positional().empty(), "unexpected argument '", a.positional().empty() ? "" : a.positional()[0], "'");
    benchtool::ServeOptions o;
    o.url = a.get("url", o.url);
    o.model = a.get("served-model");
    o.api_key = a.get("api-key");
    if (o.api_key.empty())
        if (const char* env = std::getenv("OSPREY_API_KEY"); env) o.api_key = env;
    if (a.has("concurrency")) o.concurrencies = parse_int_list("concurrency", a.get("concurrency"));
    o.requests_per_level = int_flag(a, "requests", 0, 0, 1000000);
    o.request_rate = a.get_double("request-rate", 0.0);
    o.input_len = int_flag(a, "input-len", o.input_len, 1, 1000000);
    o.prefix_len = int_flag(a, "prefix-len", o.prefix_len, 0, 1000000);
    o.output_len = int_flag(a, "output-len", o.output_len, 1, 1000000);
    o.len_sigma = a.get_double("len-sigma", o.len_sigma);
    o.timeout_s = a.get_double("timeout", o.timeout_s);
    OSPREY_CHECK(o.timeout_s > 0 && o.timeout_s <= 86400, "--timeout must be in (0, 86400] seconds");
    o.seed = uint64_t(a.get_int("seed", 1));
    o.endpoint = a.get("endpoint", o.endpoint);
    benchtool::check_serve_options(o);  // before asking the server anything
    const std::string prefix = out_prefix(a, "serve");

    benchtool::RunInfo info = benchtool::RunInfo::now("serve");
    // The layout describes the server under test (recorded for the cost columns), so any degree is accepted.
    info.layout = cli::layout_flags(a);
    info.price_per_gpu_hour = price_flag(a);
    info.backend = "http";
    info.device = o.url;
    o.model = benchtool::resolve_model(o);
    info.checkpoint = o.model;
    info.model = "served model '" + o.model + "'";
    info.weight_format = "as served";
    print_line(str("osprey bench serve: ", o.url, ", model '", o.model, "'"));
    const auto levels = benchtool::run_serve(o, print_line);

    json::Value settings = json::Object{};
    settings.set("url", o.url);
    settings.set("endpoint", o.endpoint);
    settings.set("concurrency", int_array(o.concurrencies));
    settings.set("requests_per_level", o.requests_per_level);
    settings.set("request_rate", o.request_rate);
    settings.set("input_len", o.input_len);
    settings.set("prefix_len", o.prefix_len);
    settings.set("output_len", o.output_len);
    settings.set("len_sigma", o.len_sigma);
    settings.set("seed", int64_t(o.seed));
    json::Array results;
    std::vector<std::vector<std::string>> table;
    bool any_failed_level = false;
    for (const auto& L : levels) {
        json::Value v = L.to_json();
        const double cost = benchtool::cost_per_million(info.price_per_hour(), L.output_tokens_per_s);
        v.set("cost_per_million_output_usd", cost);
        results.push_back(std::move(v));
        any_failed_level = any_failed_level || L.n_ok == 0;
        table.push_back({std::to_string(L.concurrency), str(L.n_ok, "/", L.n_failed), fixed(L.request_throughput, 2),
                         fixed(L.output_tokens_per_s, 1), fixed(L.ttft_s.median * 1e3, 1), fixed(L.ttft_s.p90 * 1e3, 1),
                         fixed(L.itl_s.median * 1e3, 2), fixed(L.itl_s.p90 * 1e3, 2), fixed(L.tpot_s.median * 1e3, 2),
                         fixed(L.e2e_s.median, 3), fixed(L.e2e_s.p90, 3), fixed(cost, 4)});
    }
    std::string counters_md;
    for (const auto& L : levels) {
        if (L.server_counters.empty()) continue;
        counters_md += str("- concurrency ", L.concurrency, ":");
        for (size_t i = 0; i < L.server_counters.size(); ++i)
            counters_md += str(i ? ", " : " ", L.server_counters[i].first, " +", fixed(L.server_counters[i].second, 0));
        counters_md += "\n";
    }
    const std::string md =
        str("# osprey bench serve\n\n", benchtool::markdown_run_info(info),
            "- settings: ", o.endpoint == "chat" ? "/v1/chat/completions, " : "/v1/completions (raw text), ",
            o.request_rate > 0 ? str("Poisson arrivals at ", o.request_rate, " req/s") : std::string("closed loop"),
            ", prompts ", o.prefix_len > 0 ? str(o.prefix_len, " shared words + ") : std::string(), "~", o.input_len,
            " words, max_tokens ~", o.output_len, " (log-normal sigma ", o.len_sigma, ")\n\n",
            benchtool::markdown_table({"concurrency", "ok/failed", "req/s", "output tokens/s", "TTFT median (ms)",
                                       "TTFT p90 (ms)", "ITL median (ms)", "ITL p90 (ms)", "TPOT median (ms)",
                                       "E2E median (s)", "E2E p90 (s)", "USD / M output tokens"},
                                      table),
            counters_md.empty() ? "" : "\nServer counters during each level (osprey /metrics):\n\n" + counters_md);
    write_outputs(prefix, benchtool::make_report(info, std::move(settings), std::move(results)), md);
    OSPREY_CHECK(!any_failed_level, "every request of a concurrency level failed (first error in ", prefix, ".json)");
    return 0;
}

int bench_plot(const std::vector<std::string>& argv) {
    const cli::Args a(argv, {"out", "width", "height"});
    OSPREY_CHECK(!a.positional().empty(), "bench plot needs one or more report files (osprey bench decode/prefill --out)");
    const int width = int_flag(a, "width", 960, 480, 4096);
    const int height = int_flag(a, "height", 640, 320, 4096);
    std::vector<json::Value> reports;
    for (const std::string& path : a.positional()) {
        json::Value r;
        try {
            r = json::parse(read_file(path));
            benchtool::check_report(r);
        } catch (const Error& e) {
            OSPREY_FAIL(path, ": ", e.what());
        }
        reports.push_back(std::move(r));
    }
    const auto charts = benchtool::charts_from_reports(reports);
    OSPREY_CHECK(!charts.empty(), "no prefill or decode results in the given reports");
    const fs::path dir = a.get("out", ".");
    fs::create_directories(dir);
    for (const auto& [name, chart] : charts) {
        const std::string base = (dir / name).string();
        benchtool::write_text_file(base + ".svg", benchtool::render_svg(chart, width, height));
        benchtool::write_file(base + ".png", benchtool::render_png(chart, width, height));
        std::printf("wrote %s.svg and %s.png\n", base.c_str(), base.c_str());
    }
    return 0;
}

int run_bench(const std::vector<std::string>& argv) {
    if (argv.empty() || argv[0] == "--help" || argv[0] == "-h" || argv[0] == "help") {
        std::fputs(kHelp, stdout);
        return argv.empty() ? 2 : 0;
    }
    const std::vector<std::string> rest(argv.begin() + 1, argv.end());
    for (const auto& s : rest)
        if (s == "--help" || s == "-h") {
            std::fputs(kHelp, stdout);
            return 0;
        }
    if (argv[0] == "prefill") return bench_prefill(rest);
    if (argv[0] == "decode") return bench_decode(rest);
    if (argv[0] == "serve") return bench_serve(rest);
    if (argv[0] == "plot") return bench_plot(rest);
    OSPREY_FAIL("unknown bench command '", argv[0], "' (prefill, decode, serve or plot)");
}

}  // namespace

OSPREY_COMMAND(bench, "benchmarks: prefill, decode, serve (HTTP load), plot", run_bench);
