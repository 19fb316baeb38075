// `osprey generate --batch N`: the same command's prompt run as N requests at once through the
// engine (continuous batching, paged KV, prefix cache), printing throughput. Lives apart from
// cmd_generate.cpp so that the single-sequence path stays a plain loop.
#pragma once

#include <cstdint>
#include <vector>

#include "cli/command.h"
#include "cli/speculative_flags.h"
#include "model/runner.h"
#include "tokenizer/tokenizer.h"

namespace osprey::cli {

// Flags this adds to `osprey generate` (value flags).
inline const std::vector<std::string>& generate_batch_flags() {
    static const std::vector<std::string> flags = [] {
        std::vector<std::string> f = {"batch",
                                                   "kv-memory-fraction",
                                                   "max-batch-tokens",
                                                   "max-mixed-prefill-tokens",
                                                   "max-num-seqs",
                                                   "page-size",
                                                   "temperature",
                                                   "seed",
                                                   "prefix-cache",
                                                   "prompts",
                                                   "n"};
        f.insert(f.end(), speculative_flag_names().begin(), speculative_flag_names().end());
        return f;
    }();
    return flags;
}

// Request i's prompt is `prompt` followed by one token that differs per request, so outputs
// differ while the common prefix is shared through the prefix cache (--prompts shared, the default);
// --prompts distinct shifts every token of request i's prompt by i instead, so nothing is shared.
// --prefix-cache on|off switches the engine's prefix cache. --n S asks S samples per request (they
// fork from the first sample's prompt state). --max-mixed-prefill-tokens N caps the prefill tokens of
// steps that also decode (default 0, off: an offline batch wants throughput, not steady decode
// latency; `osprey serve` defaults to 512). Greedy unless --temperature. Besides the
// overall rate it prints the decode rate (and, with --speculative, the acceptance counts): tokens generated after every request had its first token,
// over the time since then.
int run_generate_batch(const Args& args, model::ModelRunner& runner, const std::vector<int32_t>& prompt, int max_tokens,
                       bool stop_at_eos, const tok::Tokenizer* tokenizer);

}  // namespace osprey::cli
