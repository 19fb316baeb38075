// `osprey generate`: greedy generation with the CPU reference backend, for smoke tests and for
// measuring the reference's speed. Prints the generated token ids (and text when the model folder
// has a tokenizer) and the prefill and decode rates.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/backend.h"
#include "cli/command.h"
#include "cli/generate_batch.h"
#include "core/check.h"
#include "engine/engine.h"
#include "model/synthetic.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using namespace osprey;

constexpr const char* kHelp =
    "usage: osprey generate [--model DIR] (--prompt-ids 1,2,3 | --prompt TEXT) [--max-tokens N]\n"
    "                       [--threads N] [--ignore-eos] [--device cpu|cuda]\n"
    "                       [--weights fp8|mxfp4|bf16 [--convert attention,experts,unembedding]]\n"
    "                       [--kv-cache-dtype auto|fp8|f32]\n"
    "                       [--batch N [--kv-memory-fraction F] [--max-batch-tokens N] [--max-num-seqs N]\n"
    "                        [--max-mixed-prefill-tokens N (default 0: off)]\n"
    "                        [--speculative ngram|draft|eagle3 [--num-speculative-tokens K] ...]\n"
    "                        [--page-size N] [--temperature T] [--seed S]]\n"
    "\n"
    "Greedy generation on the CPU reference backend. Without --model, uses the built-in tiny model\n"
    "(synthetic, seed 0), written on first use to $OSPREY_CACHE/tiny (default ~/.cache/osprey/tiny).\n"
    "--prompt needs a tokenizer in the model folder (or $OSPREY_TIKTOKEN_FILE). Generation stops after\n"
    "--max-tokens (default 32) or at the config's eos token unless --ignore-eos.\n"
    "--batch N runs N requests (the prompt plus one distinct token each) at once through the engine\n"
    "(continuous batching, paged KV cache sized to --kv-memory-fraction of the backend's budget) and\n"
    "prints the throughput.\n"
    "--device cuda runs the CUDA backend (greedy sampling on the GPU) when osprey was built with it.\n"
    "--weights converts the weights at load (fp8: 128x128 block-scaled E4M3; bf16: BF16 experts);\n"
    "--kv-cache-dtype fp8 keeps an E4M3 KV cache; both options run on the CPU and CUDA backends (docs/fp8.md).\n";

std::vector<int32_t> parse_ids(const std::string& text) {
    std::vector<int32_t> ids;
    size_t pos = 0;
    while (pos <= text.size()) {
        const size_t comma = std::min(text.find(',', pos), text.size());
        std::string item = text.substr(pos, comma - pos);
        while (!item.empty() && item.front() == ' ') item.erase(item.begin());
        while (!item.empty() && item.back() == ' ') item.pop_back();
        const std::optional<long long> v = cli::parse_integer(item);
        OSPREY_CHECK(v && *v >= 0 && *v <= INT32_MAX,
                     "--prompt-ids: '", item, "' (item ", ids.size() + 1, ") is not a token id");
        ids.push_back(int32_t(*v));
        pos = comma + 1;
    }
    return ids;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_generate(const std::vector<std::string>& argv) {
    std::vector<std::string> value_flags = {"model", "prompt-ids", "prompt", "max-tokens", "threads", "device"};
    value_flags.insert(value_flags.end(), cli::generate_batch_flags().begin(), cli::generate_batch_flags().end());
    value_flags.insert(value_flags.end(), cli::format_flag_names().begin(), cli::format_flag_names().end());
    const cli::Args args(argv, value_flags, {"help", "ignore-eos"});
    if (args.has("help")) {
        std::fputs(kHelp, stdout);
        return 0;
    }
    OSPREY_CHECK(args.positional().empty(), "unexpected argument '",
                 args.positional().empty() ? "" : args.positional()[0], "'");
    OSPREY_CHECK(args.has("prompt-ids") != args.has("prompt"), "give exactly one of --prompt-ids and --prompt");
    const long long max_tokens = args.get_int("max-tokens", 32);
    OSPREY_CHECK(max_tokens >= 1 && max_tokens <= 1000000, "--max-tokens must be in [1, 1000000], got ", max_tokens);
    const long long threads = args.get_int("threads", 0);
    OSPREY_CHECK(threads >= 0 && threads <= 1024, "--threads must be in [0, 1024], got ", threads);

    const fs::path dir = cli::model_dir_flag(args);
    const std::string device = args.get("device", "cpu");
    OSPREY_CHECK(device == "cpu" || device == "cuda", "--device must be cpu or cuda, got '", device, "'");
    backends::RunnerOptions ro{.backend = device, .cpu_threads = int(threads)};
    cli::format_flags(args, ro);
    const backends::Runner made = backends::make_runner(model::Weights::load(dir), ro);
    model::ModelRunner& runner = *made.runner;
    const model::Config& c = runner.config();

    std::optional<tok::Tokenizer> tokenizer;
    std::vector<int32_t> prompt;
    if (args.has("prompt")) {
        try {
            tokenizer = tok::Tokenizer::from_model_dir(dir);
        } catch (const Error& e) {
            OSPREY_FAIL("--prompt needs a tokenizer, and the model folder ", dir.string(), " has none (", e.what(),
                        "); use --prompt-ids or set OSPREY_TIKTOKEN_FILE");
        }
        prompt = tokenizer->encode(args.get("prompt"));
        OSPREY_CHECK(!prompt.empty(), "--prompt is empty");
    } else {
        prompt = parse_ids(args.get("prompt-ids"));
        try {
            tokenizer = tok::Tokenizer::from_model_dir(dir);
        } catch (const Error&) {
            // ids only: text output is optional
        }
    }
    for (int32_t id : prompt)
        OSPREY_CHECK(id < c.vocab_size, "prompt token id ", id, " outside the model's vocabulary [0, ", c.vocab_size, ")");
    const int64_t total = int64_t(prompt.size()) + max_tokens;
    OSPREY_CHECK(total <= c.max_position, "prompt (", prompt.size(), ") + --max-tokens (", max_tokens,
                 ") exceeds the model's ", c.max_position, " positions");

    if (args.has("batch"))
        return cli::run_generate_batch(args, runner, prompt, int(max_tokens), !args.has("ignore-eos"),
                                       tokenizer ? &*tokenizer : nullptr);

    // One sequence from position 0 in ring 0 (window_first stays 0): pages for all its positions.
    const int page_size = engine::EngineOptions{}.page_size;
    const model::KvLayout layout = model::kv_layout_for(runner, page_size, int((total + page_size - 1) / page_size), 1);
    runner.allocate_kv(layout);
    model::SequenceSlice slice;
    slice.window_slot = 0;
    for (int p = 0; p < layout.n_pages; ++p) slice.pages.push_back(p);

    SamplingParams greedy;
    greedy.temperature = 0.0f;
    SamplingState state;
    state.prompt_tokens = prompt.data();
    state.n_prompt_tokens = int32_t(prompt.size());
    std::vector<int32_t> output;
    SampleResult result;
    auto run_step = [&](std::vector<int32_t> tokens) {
        model::ForwardBatch batch;
        slice.n_tokens = int32_t(tokens.size());
        batch.tokens = std::move(tokens);
        batch.slices = {slice};
        runner.forward(batch);
        slice.start_pos += slice.n_tokens;
        state.output_tokens = output.data();
        state.n_output_tokens = int32_t(output.size());
        state.step = output.size();
        runner.sample({&greedy, 1}, {&state, 1}, {&result, 1});
        output.push_back(result.token);
    };

    const auto t0 = std::chrono::steady_clock::now();
    run_step(prompt);  // prefill, and the first generated token
    const double prefill_s = seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    const bool stop_at_eos = !args.has("ignore-eos");
    while (int64_t(output.size()) < max_tokens && !(stop_at_eos && output.back() == c.eos_token_id))
        run_step({output.back()});
    const double decode_s = seconds_since(t1);
    const size_t n_decoded = output.size() - 1;

    std::printf("tokens:");
    for (size_t i = 0; i < output.size(); ++i) std::printf("%s%d", i ? "," : " ", output[i]);
    std::printf("\n");
    if (tokenizer) std::printf("text: %s\n", tokenizer->decode_bytes(output).c_str());
    std::printf("prefill: %zu tokens in %.3f s (%.1f tokens/s)\n", prompt.size(), prefill_s,
                double(prompt.size()) / prefill_s);
    if (n_decoded > 0)
        std::printf("decode: %zu tokens in %.3f s (%.1f tokens/s)\n", n_decoded, decode_s, double(n_decoded) / decode_s);
    return 0;
}

}  // namespace

OSPREY_COMMAND(generate, "greedy generation on the CPU reference backend", run_generate);
