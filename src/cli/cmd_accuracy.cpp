// `osprey accuracy`: how far a weight or KV format moves the model from a baseline
// (model/format_accuracy.h, docs/fp8.md): per-layer relative error, routing flips, next-token KL and
// top-1 agreement over teacher-forced positions, greedy agreement. Optional bounds make it a check.
#include <cstdio>
#include <fstream>

#include "backends/runner_factory.h"
#include "cli/backend.h"
#include "cli/command.h"
#include "core/check.h"
#include "model/format_accuracy.h"
#include "model/weights.h"

namespace {

constexpr const char* kHelp =
    "usage: osprey accuracy [--model DIR] [--backend auto|cpu|cuda] [--threads N]\n"
    "                       [--base-weights mxfp4|bf16|fp8] [--base-kv-cache-dtype auto|f32|fp8]\n"
    "                       [--weights fp8|mxfp4|bf16 [--convert LIST]] [--kv-cache-dtype auto|f32|fp8]\n"
    "                       [--moe-gemm w4a16|w4a8] [--base-moe-gemm w4a16|w4a8]\n"
    "                       [--positions 256] [--chunk 64] [--prompt-tokens 16] [--greedy 64] [--seed S]\n"
    "                       [--out REPORT.json] [--max-kl X] [--min-top1 F] [--min-greedy-prefix N]\n"
    "                       [--max-layer-error X]\n"
    "\n"
    "Loads the model twice: the baseline (--base-weights, default the folder's own formats, exact KV\n"
    "cache) and the candidate (--weights / --kv-cache-dtype / --moe-gemm), feeds both the same seeded random tokens\n"
    "and prints the per-layer relative L2 error of every step, the (position, layer) pairs whose expert\n"
    "set changed, the KL divergence and top-1 agreement of the next-token distributions at every\n"
    "position, and the greedy agreement over --greedy tokens from the first --prompt-tokens tokens.\n"
    "The bounds (--max-kl on the mean KL, --min-top1, --min-greedy-prefix, --max-layer-error on the\n"
    "largest per-layer `resid_mlp` error) turn it into a check: exit status 1 when one is broken.\n";

int run_accuracy(const std::vector<std::string>& argv) {
    using namespace osprey;
    std::vector<std::string> flags = {"model",
                                      "backend",
                                      "threads",
                                      "base-weights",
                                      "base-kv-cache-dtype",
                                      "base-moe-gemm",
                                      "positions",
                                      "chunk",
                                      "prompt-tokens",
                                      "greedy",
                                      "seed",
                                      "out",
                                      "max-kl",
                                      "min-top1",
                                      "min-greedy-prefix",
                                      "max-layer-error"};
    flags.insert(flags.end(), cli::format_flag_names().begin(), cli::format_flag_names().end());
    const cli::Args args(argv, flags, {"help"});
    if (args.has("help")) {
        std::fputs(kHelp, stdout);
        return 0;
    }
    OSPREY_CHECK(args.positional().empty(), "unexpected argument '",
                 args.positional().empty() ? "" : args.positional()[0], "'");
    const std::filesystem::path dir = cli::model_dir_flag(args);
    const long long threads = args.get_int("threads", 0);
    OSPREY_CHECK(threads >= 0 && threads <= 1024, "--threads must be in [0, 1024], got ", threads);
    model::AccuracyOptions o;
    const auto count = [&](const char* flag, long long fallback, long long lo, long long hi) {
        const long long v = args.get_int(flag, fallback);
        OSPREY_CHECK(v >= lo && v <= hi, "--", flag, " must be in [", lo, ", ", hi, "], got ", v);
        return int(v);
    };
    o.positions = count("positions", 256, 1, 1 << 20);
    o.chunk = count("chunk", 64, 1, 1 << 16);
    o.prompt_tokens = count("prompt-tokens", 16, 1, o.positions);
    o.greedy_tokens = count("greedy", 64, 0, 1 << 20);
    o.seed = uint64_t(count("seed", 0, 0, INT32_MAX));

    backends::RunnerOptions base{.backend = cli::backend_flag(args),
                                 .cpu_threads = int(threads),
                                 .max_tokens = o.chunk,
                                 .max_logit_rows = o.chunk,
                                 .max_slices = 2};
    backends::RunnerOptions cand = base;
    if (args.has("base-weights"))
        base.weights_format = model::parse_weight_format(args.get("base-weights"), "--base-weights");
    if (args.has("base-kv-cache-dtype"))
        base.kv_dtype = model::parse_kv_dtype(args.get("base-kv-cache-dtype"), "--base-kv-cache-dtype");
    if (args.has("base-moe-gemm")) base.moe_w4a8 = cli::parse_moe_gemm(args.get("base-moe-gemm"), "--base-moe-gemm");
    cli::format_flags(args, cand);
    OSPREY_CHECK(cand.weights_format || cand.kv_dtype || args.has("moe-gemm"),
                 "give the candidate format: --weights, --kv-cache-dtype and/or --moe-gemm");
    backends::Runner rb = backends::make_runner(model::Weights::load(dir), base);
    backends::Runner rc = backends::make_runner(model::Weights::load(dir), cand);
    std::printf("baseline: %s%s\ncandidate: %s\n", rb.runner->name().c_str(),
                cli::format_summary(base).empty() ? "" : (", " + cli::format_summary(base)).c_str(),
                (rc.runner->name() + ", " + cli::format_summary(cand)).c_str());
    const model::AccuracyReport r = model::compare_formats(*rb.runner, *rc.runner, o, backends::dump_hook(*rb.runner),
                                                           backends::dump_hook(*rc.runner));
    std::fputs(r.table().c_str(), stdout);
    if (args.has("out")) {
        std::ofstream f(args.get("out"));
        f << r.to_json().dump(2) << "\n";
        OSPREY_CHECK(f.good(), args.get("out"), ": write failed");
    }
    bool ok = true;
    const auto bound = [&](bool holds, const std::string& what) {
        if (!holds) std::printf("BOUND BROKEN: %s\n", what.c_str());
        ok = ok && holds;
    };
    if (args.has("max-kl"))
        bound(r.mean_kl <= args.get_double("max-kl", 0), str("mean KL ", r.mean_kl, " > ", args.get("max-kl")));
    if (args.has("min-top1"))
        bound(r.top1_agreement >= args.get_double("min-top1", 0),
              str("top-1 agreement ", r.top1_agreement, " < ", args.get("min-top1")));
    if (args.has("min-greedy-prefix"))
        bound(r.greedy_common_prefix >= args.get_int("min-greedy-prefix", 0),
              str("greedy common prefix ", r.greedy_common_prefix, " < ", args.get("min-greedy-prefix")));
    if (args.has("max-layer-error"))
        bound(r.max_step_error("resid_mlp") <= args.get_double("max-layer-error", 0),
              str("largest resid_mlp error ", r.max_step_error("resid_mlp"), " > ", args.get("max-layer-error")));
    return ok ? 0 : 1;
}

}  // namespace

OSPREY_COMMAND(accuracy, "compare a weight/KV format with a baseline (KL, top-1, greedy, per layer)", run_accuracy);
