// `osprey inspect --model DIR`: loads and validates a checkpoint folder (memory-mapped, nothing is
// copied into RAM) and prints a summary: layout, config, tensors, bytes.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <map>

#include "cli/command.h"
#include "core/check.h"
#include "io/checkpoint.h"
#include "model/weights.h"

namespace {

constexpr const char* kHelp =
    "usage: osprey inspect --model DIR [--layout hf|original] [--tensors]\n"
    "\n"
    "Loads the checkpoint in DIR (a Hugging Face folder, an original/ folder, or a root holding\n"
    "original/), checks every tensor by name, dtype and shape against its config, and prints a\n"
    "summary. --tensors also lists every tensor with its dtype, shape and file.\n";

long max_rss_mb() {
    struct rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss / 1024;  // Linux: kilobytes
}

int run_inspect(const std::vector<std::string>& argv) {
    using namespace osprey;
    const cli::Args args(argv, {"model", "layout"}, {"tensors", "help"});
    if (args.has("help")) {
        std::fputs(kHelp, stdout);
        return 0;
    }
    OSPREY_CHECK(args.positional().empty(), "unexpected argument '", args.positional().empty() ? "" : args.positional()[0],
                 "'");
    OSPREY_CHECK(args.has("model"), "--model DIR is required");
    std::optional<model::Layout> layout;
    if (args.has("layout")) {
        const std::string l = args.get("layout");
        OSPREY_CHECK(l == "hf" || l == "original", "--layout must be hf or original, got '", l, "'");
        layout = l == "hf" ? model::Layout::hf : model::Layout::original;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const model::Weights w = model::Weights::load(args.get("model"), layout);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const model::Config& c = w.config;

    std::printf("checkpoint   %s (%s layout), valid\n", w.dir.string().c_str(), model::layout_name(w.layout));
    std::printf("config       %d layers, d_model %d, %d heads / %d kv heads x %d, %d experts (top %d), d_ff %d,\n",
                c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.n_experts, c.top_k, c.d_ff);
    std::printf("             vocab %d, window %d, max positions %d, rope theta %g, YaRN factor %g (context %d, beta "
                "%g/%g%s)\n",
                c.vocab_size, c.sliding_window, c.max_position, c.rope_theta, c.rope_factor, c.rope_original_context,
                c.rope_beta_fast, c.rope_beta_slow, c.rope_truncate ? ", truncated" : "");
    std::map<std::string, std::pair<size_t, size_t>> by_dtype;  // dtype -> (tensors, bytes)
    for (const auto& f : w.checkpoint->files())
        for (const TensorView& v : f->tensors()) {
            auto& e = by_dtype[dtype_name(v.dtype)];
            e.first += 1;
            e.second += v.nbytes();
        }
    std::printf("tensors      %zu in %zu file%s, %.3f GB (", w.n_tensors(), w.checkpoint->files().size(),
                w.checkpoint->files().size() == 1 ? "" : "s", double(w.total_bytes()) / 1e9);
    bool first = true;
    for (const auto& [dt, e] : by_dtype) {
        std::printf("%s%s: %zu, %.3f GB", first ? "" : "; ", dt.c_str(), e.first, double(e.second) / 1e9);
        first = false;
    }
    std::printf(")\n");
    std::printf("loaded in    %.3f s, max resident memory %ld MB (tensors are mapped, not read)\n", secs, max_rss_mb());
    if (args.has("tensors")) {
        for (const std::string& name : w.checkpoint->names()) {
            const TensorView& v = w.checkpoint->at(name);
            std::printf("  %-60s %-24s %s\n", name.c_str(), v.describe().c_str(),
                        w.checkpoint->file_of(name).filename().string().c_str());
        }
    }
    return 0;
}

}  // namespace

OSPREY_COMMAND(inspect, "load and validate a checkpoint folder, print a summary", run_inspect);
