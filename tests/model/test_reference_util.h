// Shared by the CPU-reference tests: synthetic checkpoints written once per test process into a
// temporary folder, and helpers that drive a ModelRunner through prefill and decode steps.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/gpt_oss_ref.h"
#include "model/synthetic.h"

namespace osprey::model::test {

// Writes (once per process and name) a synthetic checkpoint of `config` with `seed` in `layout`;
// removed at exit.
inline std::filesystem::path synthetic_checkpoint(const std::string& name, const Config& config, uint64_t seed,
                                                  Layout layout = Layout::hf) {
    struct Dirs {
        std::map<std::string, std::filesystem::path> made;
        ~Dirs() {
            for (const auto& [n, d] : made) {
                std::error_code ec;
                std::filesystem::remove_all(d, ec);
            }
        }
    };
    static Dirs dirs;
    auto it = dirs.made.find(name);
    if (it != dirs.made.end()) return it->second;
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("osprey-test-" + name + "-" + std::to_string(::getpid()));
    SyntheticOptions o;
    o.seed = seed;
    o.out = dir;
    o.layout = layout;
    write_synthetic_checkpoint(config, o);
    dirs.made[name] = dir;
    return dir;
}

// A small model that still has every gpt-oss feature: GQA (4 query heads per kv head), YaRN, sinks,
// a sliding window (16, so that tests pass it with few tokens), 8 experts with top-4.
inline Config small_config() {
    Config c;
    c.n_layers = 4;
    c.d_model = 64;
    c.n_heads = 8;
    c.n_kv_heads = 2;
    c.head_dim = 64;
    c.n_experts = 8;
    c.top_k = 4;
    c.d_ff = 64;
    c.vocab_size = 512;
    c.sliding_window = 16;
    c.eos_token_id = 1;
    c.pad_token_id = 0;
    return c;
}

// small_config with gpt-oss's partial 128-blocks in miniature (d_model 160 = 1.25 x 128, d_ff 192 =
// 1.5 x 128, vocab 300) and 8 KV heads (tensor parallel up to 8): the 8-bit formats' tests.
inline Config partial_blocks_config() {
    Config c = small_config();
    c.d_model = 160;
    c.d_ff = 192;
    c.n_heads = 16;
    c.n_kv_heads = 8;
    c.vocab_size = 300;
    return c;
}

// One sequence's bookkeeping, as the engine would keep it.
struct Seq {
    std::vector<int32_t> tokens;  // all tokens so far
    std::vector<int32_t> pages;   // page table
    int window_slot = 0;
    int window_first = 0;         // first position the ring holds (as the engine's KvCacheManager says)
    int n_computed = 0;           // positions with K/V in the cache
};

inline SequenceSlice slice_for(const Seq& s, int first_token, int n_tokens, int n_full_kv_cached = 0) {
    SequenceSlice sl;
    sl.first_token = first_token;
    sl.n_tokens = n_tokens;
    sl.start_pos = s.n_computed;
    sl.n_full_kv_cached = n_full_kv_cached;
    sl.window_slot = s.window_slot;
    sl.window_first = s.window_first;
    sl.pages = s.pages;
    sl.want_logits = true;
    return sl;
}

// Runs tokens [n_computed, n_computed + n) of one sequence as one step; returns its logits row.
inline std::vector<float> step(ModelRunner& m, Seq& s, int n) {
    ForwardBatch b;
    b.tokens.assign(s.tokens.begin() + s.n_computed, s.tokens.begin() + s.n_computed + n);
    b.slices.push_back(slice_for(s, 0, n));
    m.forward(b);
    s.n_computed += n;
    std::vector<float> logits;
    m.logits_to_host(logits);
    return logits;
}

inline std::vector<int32_t> pages_from(int first, int count) {
    std::vector<int32_t> p(count);
    for (int i = 0; i < count; ++i) p[i] = first + i;
    return p;
}

}  // namespace osprey::model::test
