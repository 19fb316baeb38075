// `osprey convert --to fp8`: writes a checkpoint whose linear weights are FP8 E4M3 with one F32
// multiplier per 128 x 128 block, in the Hugging Face "fp8" layout other engines load (docs/fp8.md).
#include <cstdio>

#include "cli/command.h"
#include "core/check.h"
#include "model/weight_convert.h"

namespace {

constexpr const char* kHelp =
    "usage: osprey convert --to fp8 --model IN --out OUT [--convert attention,experts,unembedding]\n"
    "                      [--max-shard-mb N] [--threads N]\n"
    "\n"
    "Writes OUT, a Hugging Face layout checkpoint whose chosen linear weights are FP8 E4M3 with one F32\n"
    "dequantisation multiplier per 128x128 block (`<module>.weight` + `<module>.weight_scale_inv` for the\n"
    "attention projections and lm_head; `mlp.experts.gate_up_proj`/`down_proj` [E, out, in] +\n"
    "`*_scales_inv` for the experts), and config.json with quantization_config {quant_method: fp8,\n"
    "fmt: e4m3, weight_block_size: [128, 128], activation_scheme: dynamic}. A partial last block (2880 =\n"
    "22.5 x 128) has its scale computed over the elements it holds. Experts are decoded from MXFP4\n"
    "exactly and requantised per expert matrix; attention and lm_head come from BF16; the router, the\n"
    "embedding, norms, biases and sinks are copied. Every other file at the top of IN (tokenizer,\n"
    "generation config, chat template) is copied. IN may be either published layout.\n"
    "--convert picks the parts (default: all three). Shards of at most --max-shard-mb (default 4800).\n";

int run_convert(const std::vector<std::string>& argv) {
    using namespace osprey;
    const cli::Args args(argv, {"to", "model", "out", "convert", "max-shard-mb", "threads"}, {"help"});
    if (args.has("help")) {
        std::fputs(kHelp, stdout);
        return 0;
    }
    OSPREY_CHECK(args.positional().empty(), "unexpected argument '",
                 args.positional().empty() ? "" : args.positional()[0], "'");
    OSPREY_CHECK(args.get("to", "fp8") == "fp8", "--to: only fp8 is supported, got '", args.get("to"), "'");
    OSPREY_CHECK(args.has("model") && args.has("out"), "--model IN and --out OUT are required");
    model::ConvertOptions o;
    o.model = args.get("model");
    o.out = args.get("out");
    if (args.has("convert")) o.parts = model::parse_fp8_parts(args.get("convert"));
    const cli::WriterFlags wf = cli::writer_flags(args);
    o.max_shard_bytes = wf.max_shard_bytes;
    o.threads = wf.threads;
    const model::ConvertResult r = model::write_fp8_checkpoint(o);
    std::printf("converted %s to fp8 (%s) in %s\n", o.model.string().c_str(), model::fp8_parts_name(o.parts).c_str(),
                o.out.string().c_str());
    for (const auto& f : r.files) std::printf("  %s\n", f.string().c_str());
    const double mb = double(r.bytes) / 1e6;
    std::printf("%.1f MB of tensors in %.2f s\n", mb, r.seconds);
    return 0;
}

}  // namespace

OSPREY_COMMAND(convert, "write an FP8 (128x128 block-scaled) checkpoint", run_convert);
