// The model-level benchmarks behind `osprey bench prefill` and `osprey bench decode`. They drive a
// ModelRunner directly (no engine, no scheduler): one ForwardBatch per step, greedy sampling on the
// backend, wall time measured on the host around forward + sample (sampling copies the token ids
// back, so every timed step is complete on the device when its clock stops).
//
// Prefill: one sequence of N random tokens, run in chunks of `chunk` tokens; time to first token is
// the time from the first chunk's launch to the first sampled token on the host.
//
// Decode: `batch` sequences whose KV cache already holds `context` positions each, then one token
// per sequence per step. The cache is filled in one of three ways (recorded in every row):
//   prefill  every sequence is prefilled for real with its own random tokens (distinct K/V per
//            sequence, as in production; costs batch * context prefill tokens per context length);
//   copy     one sequence is prefilled for real, then its pages and window ring are copied
//            (ModelRunner::copy_kv) into every other sequence's own pages and ring, and each
//            sequence gets a different random next token. Every sequence owns and reads `context`
//            distinct rows of K/V in device memory, as in production (the same bytes, which
//            costs nothing extra: no cache deduplicates by content), and the different next tokens
//            make the batch route to different experts from the first step on. Memory as
//            `prefill`, fill time of one prefill: the mode for long contexts;
//   shared   one prefill per context length writes the whole pages of the prompt once and every
//            sequence's page table points at them; each sequence then writes its own partial last
//            page and refills its sliding-window ring by replaying the last
//            n_sliding_layers * (sliding_window - 1) positions. Attention still reads `context`
//            rows of K/V for every sequence in every step, but the sequences read the same pages,
//            so on a GPU those reads may hit L2 more than distinct caches would, and the cache
//            takes the memory of one sequence: numbers for batches that would not fit otherwise,
//            marked as such.
// Batch sizes whose KV cache does not fit the backend's budget (prefill and copy) are skipped and
// listed in the results (DecodeSkip) rather than failing the run.
// Batch sizes run in ascending order over the same sequences, which keep growing: positions
// advance by (warmup + steps) per batch size, and each row reports the mean context it measured.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "benchtool/stats.h"
#include "core/json.h"
#include "model/runner.h"

namespace osprey::benchtool {

enum class KvFill { prefill, copy, shared };
const char* kv_fill_name(KvFill f);
KvFill parse_kv_fill(const std::string& s);  // throws naming the value

using ProgressFn = std::function<void(const std::string& line)>;

struct PrefillOptions {
    std::vector<int> lengths = {1024, 2048, 4096, 8192, 16384, 32768};  // prompt tokens
    int repeats = 5;   // timed runs per length
    int warmup = 1;    // untimed runs per length, before the timed ones
    int chunk = 8192;  // tokens per forward
    int page_size = 32;
    uint64_t seed = 1;
};

struct PrefillRow {
    int prompt_tokens = 0;
    Summary ttft_s;                   // seconds
    double input_tokens_per_s = 0;    // prompt_tokens / median TTFT
    double cost_per_million_input = 0;  // USD
    json::Value to_json() const;
};

struct DecodeOptions {
    std::vector<int> batches = {1, 2, 4, 8, 16, 32, 64, 128};
    std::vector<int> contexts = {8192, 32768};
    int steps = 32;   // timed steps per batch size
    int warmup = 4;   // untimed steps per batch size, before the timed ones
    int chunk = 8192; // tokens per forward while filling the cache
    int page_size = 32;
    KvFill fill = KvFill::prefill;
    uint64_t seed = 1;
};

struct DecodeRow {
    int context = 0;          // requested context length
    int batch = 0;
    double mean_context = 0;  // mean KV length the timed steps attended over
    std::string kv_fill;
    double fill_s = 0;        // time spent filling the cache for this context (shared by its rows)
    Summary step_s;           // seconds per step
    double tokens_per_s_per_user = 0;  // 1 / median step
    double total_tokens_per_s = 0;     // batch / median step
    double cost_per_million_output = 0;  // USD
    json::Value to_json() const;
};

// A batch size left out of one context because its KV cache does not fit.
struct DecodeSkip {
    int context = 0;
    int batch = 0;
    size_t kv_bytes_needed = 0, kv_bytes_available = 0;
    json::Value to_json() const;
};

struct DecodeResults {
    std::vector<DecodeRow> rows;
    std::vector<DecodeSkip> skipped;
};

// One sequence of the decode benchmark after the cache fill.
struct DecodeSequence {
    std::vector<int32_t> prompt;  // [context] the tokens whose K/V the cache holds for it
    std::vector<int32_t> pages;   // position p lives in pages[p / page_size] (shared mode: leading pages shared;
                                  // copy mode: sequences 1.. hold copies of sequence 0's prompt)
    int slot = 0;                 // window ring
    int window_first = 0;         // first position the ring holds (SequenceSlice::window_first)
    int pos = 0;                  // positions [0, pos) are in the cache
    int32_t last = 0;             // the token to feed next (greedy after the prompt)
    int dp_group = 0;             // data-parallel group whose cache holds it (sequence i: i % dp_groups)
};

// The cache fill of run_decode for one context length (exposed for tests): allocates the KV layout
// and fills max(batches) sequences as o.fill says, from random prompts seeded by `seed`. With data
// parallelism (runner.dp_groups() > 1) sequence i lives in group i % dp, at index i / dp of that
// group's cache (every group has the layout of ceil(max(batches) / dp) sequences; KV summed over groups).
std::vector<DecodeSequence> fill_decode_cache(model::ModelRunner& runner, const DecodeOptions& o, int context,
                                              uint64_t seed);

// KV bytes the decode benchmark needs for one context length (pages plus window rings).
size_t decode_kv_bytes(const model::ModelRunner& runner, const DecodeOptions& o, int context);

std::vector<PrefillRow> run_prefill(model::ModelRunner& runner, const PrefillOptions& o, double price_per_hour,
                                    const ProgressFn& progress);
DecodeResults run_decode(model::ModelRunner& runner, const DecodeOptions& o, double price_per_hour,
                         const ProgressFn& progress);

}  // namespace osprey::benchtool
