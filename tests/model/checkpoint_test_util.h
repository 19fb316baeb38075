// Helpers for checkpoint tests: a small synthetic config, scratch folders, rewriting a shard.
#pragma once

#include <cstring>
#include <functional>

#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "io/io_test_util.h"
#include "model/synthetic.h"

namespace osprey::test {

// A gpt-oss-shaped model small enough to write in milliseconds (2 layers, 4 experts, vocab 1000).
inline model::Config small_config() {
    model::Config c = model::preset_config("tiny");
    c.vocab_size = 1000;
    c.eos_token_id = 999;
    c.pad_token_id = 998;
    c.n_layers = 2;
    c.d_model = 128;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 64;
    c.n_experts = 4;
    c.top_k = 2;
    c.d_ff = 64;
    return c;
}

inline model::SyntheticResult write_small(const std::filesystem::path& out, model::Layout layout, uint64_t seed = 1,
                                          int threads = 0, uint64_t max_shard = 4'800'000'000ull) {
    model::SyntheticOptions o;
    o.out = out;
    o.seed = seed;
    o.layout = layout;
    o.threads = threads;
    o.max_shard_bytes = max_shard;
    return model::write_synthetic_checkpoint(small_config(), o);
}

// Rewrites one safetensors file after `edit` changed its tensor list. Tensors whose name and size are
// unchanged keep their bytes; new or resized ones are zero-filled.
inline void rewrite(const std::filesystem::path& file, const std::function<void(std::vector<io::TensorSpec>&)>& edit) {
    auto f = io::SafetensorsFile::open(file);
    std::vector<io::TensorSpec> specs;
    for (const TensorView& v : f->tensors()) specs.push_back({v.name, v.dtype, v.shape});
    edit(specs);
    io::write_safetensors(file, specs, {}, [&](size_t i, uint64_t off, uint8_t* out, size_t n) {
        const TensorView* v = f->find(specs[i].name);
        if (v != nullptr && v->nbytes() == specs[i].nbytes())
            std::memcpy(out, static_cast<const uint8_t*>(v->data) + off, n);
        else
            std::memset(out, 0, n);
    });
}

inline io::TensorSpec* spec(std::vector<io::TensorSpec>& specs, const std::string& name) {
    for (auto& s : specs)
        if (s.name == name) return &s;
    ADD_FAILURE() << "no tensor " << name;
    static io::TensorSpec dummy;
    return &dummy;
}

}  // namespace osprey::test
