// bench_forward: end-to-end timings of the CUDA forward on a checkpoint folder: weight load (GB/s),
// prefill latency per prompt length, and greedy decode tokens/s after a prompt, with or without
// CUDA graphs. Random prompt tokens (the model may be a random synthetic checkpoint, which
// --make-preset writes first, as `osprey make-model` does).

#include <algorithm>
#include <map>
#include <string>
#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>

#include "core/check.h"
#include "kernel_trace.h"
#include "kernels/cuda/timeline.cuh"
#include "timeline_summary.h"
#include "model/cuda/gpt_oss_cuda.h"
#include "model/synthetic.h"
#include "model/weights.h"

namespace {

constexpr const char* kHelp =
    "usage: bench_forward --model DIR [--make-preset tiny|20b|120b] [--prefill 1024,8192,32768]\n"
    "                     [--prompt 1024] [--decode 256] [--chunk 8192] [--batch 1] [--no-graphs] [--profile]\n"
    "                     [--trace] [--timeline]\n"
    "\n"
    "With --make-preset, first writes a synthetic checkpoint of that preset into DIR (seed 0).\n"
    "Loads DIR onto the GPU and reports: load time and GB/s; for each --prefill length, the latency\n"
    "of prefilling one sequence of that many random tokens (in chunks of --chunk tokens) up to its\n"
    "logits; then --batch sequences each with a --prompt token prompt followed by --decode greedy\n"
    "steps (decode tokens/s per sequence and in total), with CUDA graphs unless --no-graphs.\n"
    "--profile then times every step of 32 decode steps and of one --prompt-token prefill with CUDA\n"
    "events (eager launches) and prints GPU time per step kind.\n"
    "--timeline (a build with -DOSPREY_TIMELINE=ON) replays the last decode graph and prints when each\n"
    "instrumented kernel's warps land, pass their PDL wait and leave (kernels/cuda/timeline.cuh).\n"
    "--trace records 32 decode steps as they run (CUDA graphs included) with CUPTI and prints each\n"
    "kernel's GPU time per step, the step's span and the time the GPU was idle inside it.\n";

constexpr int kExtraSteps = 32;  // decode steps of --profile and of --trace each

void print_profile(const osprey::model::CudaRunner& m, const char* what, int forwards) {
    double total = 0;
    for (const auto& r : m.profile()) total += r.us;
    std::printf("profile of %s: %.1f us of GPU time per forward\n", what, total / forwards);
    for (const auto& r : m.profile())
        std::printf("  %-20s %10.1f us per forward %6.1f%%  (%ld launches groups)\n", r.step.c_str(), r.us / forwards,
                    100.0 * r.us / total, r.calls / forwards);
}

using Clock = std::chrono::steady_clock;

// --name value flags and boolean --flag; anything else is an error naming it.
class Flags {
public:
    Flags(const std::vector<std::string>& argv, std::vector<std::string> valued, std::vector<std::string> booleans) {
        for (size_t i = 0; i < argv.size(); ++i) {
            const std::string& a = argv[i];
            OSPREY_CHECK(a.rfind("--", 0) == 0, "unexpected argument '", a, "'");
            const std::string name = a.substr(2);
            if (std::find(booleans.begin(), booleans.end(), name) != booleans.end()) {
                values_[name] = "1";
            } else {
                OSPREY_CHECK(std::find(valued.begin(), valued.end(), name) != valued.end(), "unknown flag '", a, "'");
                OSPREY_CHECK(i + 1 < argv.size(), "flag '", a, "' needs a value");
                values_[name] = argv[++i];
            }
        }
    }
    bool has(const std::string& n) const { return values_.count(n) > 0; }
    std::string get(const std::string& n, const std::string& fallback = "") const {
        auto it = values_.find(n);
        return it == values_.end() ? fallback : it->second;
    }
    long long get_int(const std::string& n, long long fallback) const {
        if (!has(n)) return fallback;
        char* end = nullptr;
        const long long v = std::strtoll(get(n).c_str(), &end, 10);
        OSPREY_CHECK(end && *end == '\0', "--", n, " expects an integer, got '", get(n), "'");
        return v;
    }

private:
    std::map<std::string, std::string> values_;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<int> parse_list(const std::string& s) {
    std::vector<int> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        char* end = nullptr;
        const long v = std::strtol(item.c_str(), &end, 10);
        OSPREY_CHECK(end && *end == '\0' && v > 0, "--prefill expects positive integers separated by commas, got '",
                     s, "'");
        out.push_back(int(v));
    }
    return out;
}

struct Seq {
    std::vector<int32_t> pages;
    int slot = 0;
    int n_computed = 0;
};

// Runs `tokens` of one sequence in chunks; returns when its last logits are ready (greedy token read).
int32_t prefill(osprey::model::CudaRunner& m, Seq& s, const std::vector<int32_t>& tokens, int chunk) {
    std::vector<int32_t> next;
    for (size_t i = 0; i < tokens.size(); i += chunk) {
        const int n = int(std::min<size_t>(chunk, tokens.size() - i));
        osprey::model::ForwardBatch b;
        b.tokens.assign(tokens.begin() + i, tokens.begin() + i + n);
        osprey::model::SequenceSlice sl;
        sl.first_token = 0, sl.n_tokens = n, sl.start_pos = s.n_computed, sl.window_slot = s.slot, sl.pages = s.pages;
        sl.want_logits = i + n == tokens.size();
        b.slices.push_back(sl);
        m.forward(b);
        s.n_computed += n;
    }
    m.greedy(next);
    return next.at(0);
}

// --timeline (a build with -DOSPREY_TIMELINE=ON): the last decode graph replayed kTimelineReplays times
// with every instrumented kernel's warps stamped (kernels/cuda/timeline.cuh), summarised per kernel
// (timeline_summary.h: us from the previous kernel's last warp exit, medians over the middle replays).
constexpr int kTimelineReplays = 4;
void print_timeline(osprey::model::CudaRunner& m) {
    using namespace osprey;
    std::vector<cuda::TimelineRec> recs;
    cuda::timeline_collect_all(recs);  // drop what the earlier steps left
    recs.clear();
    m.replay_last_graph_us(kTimelineReplays);
    cuda::timeline_collect_all(recs);
    if (recs.empty()) {
        std::printf("timeline: no records (build with -DOSPREY_TIMELINE=ON)\n");
        return;
    }
    std::printf("timeline of %d graph replays (%zu warp records; per kernel, medians over the middle replays' "
                "calls; us from the previous instrumented call's last warp exit):\n",
                kTimelineReplays, recs.size());
    std::printf("  %-18s %6s %5s %5s | %7s %7s %7s | %7s %7s | %7s %7s | after\n", "kernel", "calls", "CTAs", "SMs",
                "enter0", "enter50", "enter1", "wait0", "wait1", "exit50", "exit1");
    for (const bench::TimelineRow& r : bench::summarize_timeline(recs, kTimelineReplays))
        std::printf("  %-18s %6d %5.0f %5.0f | %7.2f %7.2f %7.2f | %7.2f %7.2f | %7.2f %7.2f | %s\n",
                    r.kernel.c_str(), r.calls, r.ctas, r.sms, r.enter0, r.enter50, r.enter1, r.wait0, r.wait1,
                    r.exit50, r.exit1, r.after.c_str());
}

int run_bench_forward(const std::vector<std::string>& argv) {
    using namespace osprey;
    const Flags args(argv, {"model", "make-preset", "prefill", "prompt", "decode", "chunk", "batch"},
                         {"help", "no-graphs", "profile", "trace", "timeline"});
    if (args.has("help")) {
        std::fputs(kHelp, stdout);
        return 0;
    }
    OSPREY_CHECK(args.has("model"), "--model DIR is required");
    const std::vector<int> prefills = parse_list(args.get("prefill", "1024,8192,32768"));
    const int prompt = int(args.get_int("prompt", 1024));
    const int decode = int(args.get_int("decode", 256));
    const int chunk = int(args.get_int("chunk", 8192));
    const int batch = int(args.get_int("batch", 1));
    OSPREY_CHECK(prompt > 0 && decode > 0 && chunk > 0 && batch > 0 && batch <= 256,
                 "--prompt, --decode, --chunk must be positive and --batch in [1, 256]");

    if (args.has("make-preset")) {
        model::SyntheticOptions o;
        o.preset = args.get("make-preset");
        o.out = args.get("model");
        const auto t0 = Clock::now();
        const model::SyntheticResult r = model::write_synthetic_checkpoint(o);
        std::printf("wrote synthetic %s checkpoint: %.2f GB in %.1f s\n", o.preset.c_str(), r.bytes / 1e9,
                    seconds_since(t0));
    }
    const model::Weights weights = model::Weights::load(args.get("model"));
    const model::Config& c = weights.config;
    model::CudaRunner m(weights, model::CudaRunnerOptions{.max_tokens = std::max(chunk, batch),
                                                         .max_logit_rows = std::max(batch, 1),
                                                         .max_slices = std::max(batch, 1),
                                                         .progress = true,
                                                         .graphs = !args.has("no-graphs")});
    std::printf("device: %s\n", m.name().c_str());
    std::printf("weights: %.2f GB on the device, loaded in %.2f s (%.2f GB/s)\n", m.weight_bytes() / 1e9,
                m.load_stats().seconds, m.load_stats().gb_per_s());

    const int page_size = 32;
    // A decode run writes the prompt, then one position per step after the first token: prompt + decode + 1
    // positions at most (the warm-up step included).
    const int extra = (args.has("profile") ? kExtraSteps : 0) + (args.has("trace") ? kExtraSteps : 0);
    const int longest = std::max(*std::max_element(prefills.begin(), prefills.end()), prompt + decode + 1 + extra);
    const int pages_per_seq = (longest + page_size - 1) / page_size;
    const int n_pages = pages_per_seq * std::max(batch, 1);
    const model::KvLayout layout = model::kv_layout_for(m, page_size, n_pages, std::max(batch, 1));
    m.allocate_kv(layout);
    std::printf("kv: %d pages of %d rows (%.2f GB), budget %.2f GB\n", n_pages, page_size, layout.bytes() / 1e9,
                m.kv_budget_bytes() / 1e9);

    std::mt19937 rng(1);
    auto random_tokens = [&](int n) {
        std::vector<int32_t> t(n);
        for (int32_t& x : t) x = int32_t(rng() % 200000);
        return t;
    };
    auto fresh_seq = [&](int i) {
        Seq s;
        s.slot = i;
        for (int p = 0; p < pages_per_seq; ++p) s.pages.push_back(i * pages_per_seq + p);
        return s;
    };

    // Warm-up (cuBLASLt plans, first launches).
    {
        Seq s = fresh_seq(0);
        prefill(m, s, random_tokens(std::min(prompt, 512)), chunk);
    }
    for (int len : prefills) {
        Seq s = fresh_seq(0);
        const std::vector<int32_t> tokens = random_tokens(len);
        const auto t0 = Clock::now();
        prefill(m, s, tokens, chunk);
        const double sec = seconds_since(t0);
        std::printf("prefill %6d tokens: %9.2f ms  (%.0f tokens/s, chunks of %d)\n", len, 1e3 * sec, len / sec,
                    std::min(chunk, len));
    }

    // Decode: `batch` sequences after a `prompt`-token prompt each.
    std::vector<Seq> seqs;
    std::vector<int32_t> last;
    for (int i = 0; i < batch; ++i) {
        seqs.push_back(fresh_seq(i));
        last.push_back(prefill(m, seqs.back(), random_tokens(prompt), chunk));
    }
    std::vector<int32_t> next;
    auto decode_step = [&] {
        model::ForwardBatch b;
        for (int i = 0; i < batch; ++i) {
            model::SequenceSlice sl;
            sl.first_token = i, sl.n_tokens = 1, sl.start_pos = seqs[i].n_computed, sl.window_slot = seqs[i].slot;
            sl.pages = seqs[i].pages;
            b.slices.push_back(sl);
            b.tokens.push_back(last[i]);
        }
        m.forward(b);
        m.greedy(next);
        for (int i = 0; i < batch; ++i) seqs[i].n_computed += 1, last[i] = next[i];
    };
    const int warm = std::min(8, decode);
    for (int i = 0; i < warm; ++i) decode_step();
    const auto t0 = Clock::now();
    for (int i = warm; i < decode; ++i) decode_step();
    const double sec = seconds_since(t0);
    const int steps = decode - warm;
    std::printf("decode batch %d after a %d-token prompt: %d steps in %.3f s = %.1f tokens/s per sequence, "
                "%.1f tokens/s total, %.3f ms per step (graphs %s, %d captured)\n",
                batch, prompt, steps, sec, steps / sec, steps * batch / sec, 1e3 * sec / std::max(steps, 1),
                args.has("no-graphs") ? "off" : "on", m.graphs_captured());
    if (!args.has("no-graphs") && steps > 0) {
        // The same step's graph replayed back to back: the GPU's time per step without the host's part
        // (sampled ids copied back, the next batch built and its metadata uploaded, the graph launched).
        const double gpu_us = m.replay_last_graph_us(kExtraSteps);
        const double step_us = 1e6 * sec / steps;
        std::printf("graph replayed back to back: %.1f us per step on the GPU; the host adds %.1f us per step "
                    "(%.1f%% of the step)\n",
                    gpu_us, step_us - gpu_us, 100.0 * (step_us - gpu_us) / step_us);
    }
    if (args.has("timeline") && !args.has("no-graphs") && steps > 0) print_timeline(m);
    if (args.has("trace")) {
        bench::KernelTrace trace;
        trace.start();
        const auto t_trace = Clock::now();
        for (int i = 0; i < kExtraSteps; ++i) decode_step();
        const double wall_us = 1e6 * seconds_since(t_trace) / kExtraSteps;
        const bench::KernelTraceSummary s = bench::summarize_trace(trace.stop(), kExtraSteps);
        std::printf("trace of %d decode steps (batch %d, graphs %s): %.1f us wall per step (host included), GPU "
                    "span %.1f us, busy %.1f us (%.1f%% of the span), %.0f kernels per step\n",
                    kExtraSteps, batch, args.has("no-graphs") ? "off" : "on", wall_us, s.span_us_per_step,
                    s.busy_us_per_step, 100.0 * s.busy_us_per_step / std::max(s.span_us_per_step, 1e-9),
                    s.kernels_per_step);
        std::printf("  %-48s %12s %19s %7s %24s\n", "kernel", "calls", "GPU time", "", "share of the busy time");
        for (const bench::KernelTraceRow& r : s.rows)
            std::printf("  %-48s %6.1f calls %9.1f us per step %6.1f%% %9.1f us per step %6.1f%%\n", r.name.c_str(),
                        r.calls_per_step, r.us_per_step, 100.0 * r.us_per_step / std::max(s.busy_us_per_step, 1e-9),
                        r.busy_us_per_step, 100.0 * r.busy_us_per_step / std::max(s.busy_us_per_step, 1e-9));
    }
    if (args.has("profile")) {
        m.set_profile(true);
        for (int i = 0; i < kExtraSteps; ++i) decode_step();
        print_profile(m, "decode steps", kExtraSteps);
        m.set_profile(true);
        Seq s = fresh_seq(0);
        prefill(m, s, random_tokens(std::min(prompt, chunk)), chunk);
        print_profile(m, "one prefill chunk", 1);
        m.set_profile(false);
    }
    (void)c;
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run_bench_forward(std::vector<std::string>(argv + 1, argv + argc));
    } catch (const osprey::Error& e) {
        std::fprintf(stderr, "bench_forward: %s\n", e.what());
        return 2;
    }
}
