// `osprey make-model`: writes a random-weight gpt-oss checkpoint in the exact published layout.
#include <cstdio>
#include <cstdlib>

#include "cli/command.h"
#include "core/check.h"
#include "model/eagle3.h"
#include "model/synthetic.h"

namespace {

constexpr const char* kHelp =
    "usage: osprey make-model --out DIR [--preset tiny|tiny-tp|20b|120b] [--seed N] [--layout hf|original]\n"
    "                         [--max-shard-mb N] [--threads N] [--tokenizer-file PATH]\n"
    "       osprey make-model --eagle3 --out DIR [--preset tiny|20b|120b] [--seed N]\n"
    "\n"
    "Writes a synthetic (random, deterministic from --seed) gpt-oss checkpoint: config.json,\n"
    "generation_config.json, model-0000k-of-0000N.safetensors + model.safetensors.index.json\n"
    "(--layout hf, default), or original/{config.json,dtypes.json,model.safetensors} (--layout original).\n"
    "Experts are MXFP4, everything else BF16. --tokenizer-file (or env OSPREY_TIKTOKEN_FILE) is copied\n"
    "into DIR as o200k_base.tiktoken. Defaults: preset tiny, seed 0, shards of at most 4800 MB.\n"
    "Files of an earlier run in DIR are overwritten; stale model-*-of-*.safetensors shards are removed.\n"
    "--eagle3 writes a synthetic EAGLE-3 draft head for the preset instead, in the layout of the\n"
    "published gpt-oss heads (LlamaForCausalLMEagle3: fc over three target layers' outputs, one decoder\n"
    "layer, a reduced draft vocabulary with d2t/t2d; model/eagle3.h), for --speculative eagle3.\n";

int run_make_model(const std::vector<std::string>& argv) {
    using namespace osprey;
    const cli::Args args(argv, {"out", "preset", "seed", "layout", "max-shard-mb", "threads", "tokenizer-file"},
                         {"help", "eagle3"});
    if (args.has("help")) {
        std::fputs(kHelp, stdout);
        return 0;
    }
    OSPREY_CHECK(args.positional().empty(), "unexpected argument '", args.positional().empty() ? "" : args.positional()[0],
                 "'");
    OSPREY_CHECK(args.has("out"), "--out DIR is required");
    model::SyntheticOptions o;
    o.out = args.get("out");
    o.preset = args.get("preset", "tiny");
    const long long seed = args.get_int("seed", 0);
    OSPREY_CHECK(seed >= 0, "--seed must be >= 0, got ", seed);
    o.seed = uint64_t(seed);
    const std::string layout = args.get("layout", "hf");
    OSPREY_CHECK(layout == "hf" || layout == "original", "--layout must be hf or original, got '", layout, "'");
    o.layout = layout == "hf" ? model::Layout::hf : model::Layout::original;
    const cli::WriterFlags wf = cli::writer_flags(args);
    o.max_shard_bytes = wf.max_shard_bytes;
    o.threads = wf.threads;
    if (args.has("tokenizer-file")) {
        o.tokenizer_file = args.get("tokenizer-file");
    } else if (const char* env = std::getenv("OSPREY_TIKTOKEN_FILE"); env != nullptr && *env) {
        o.tokenizer_file = env;
    }

    if (args.has("eagle3")) {
        const model::Config target = model::preset_config(o.preset);
        model::write_synthetic_eagle3(target, o.out, o.seed);
        const model::Eagle3Config c = model::eagle3_config_for(target);
        std::printf("wrote an EAGLE-3 head for preset %s (hidden %d, draft vocabulary %d, target layers %d, %d, %d) to %s\n",
                    o.preset.c_str(), c.hidden, c.draft_vocab, c.aux_layers[0], c.aux_layers[1], c.aux_layers[2],
                    o.out.string().c_str());
        return 0;
    }
    const model::SyntheticResult r = model::write_synthetic_checkpoint(o);
    const double mb = double(r.bytes) / 1e6;
    std::printf("wrote %s checkpoint (preset %s, seed %llu) to %s\n", layout.c_str(), o.preset.c_str(),
                (unsigned long long)o.seed, o.out.string().c_str());
    for (const auto& f : r.files) std::printf("  %s\n", f.string().c_str());
    std::printf("%.1f MB of tensors in %.2f s (%.0f MB/s)\n", mb, r.seconds, r.seconds > 0 ? mb / r.seconds : 0.0);
    return 0;
}

}  // namespace

// The name has a hyphen, so it registers without the OSPREY_COMMAND macro (which needs an identifier).
static const bool osprey_command_registered_make_model =
    osprey::cli::register_command({"make-model", "write a synthetic gpt-oss checkpoint (tiny, 20b, 120b)", run_make_model});
