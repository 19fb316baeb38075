// An EAGLE-3 draft head in the layout of the published gpt-oss heads (LlamaForCausalLMEagle3: e.g.
// nvidia/gpt-oss-120b-Eagle3, lmsys EAGLE3 heads trained with SpecForge), on the CPU:
//
//   config.json  hidden_size H (the target's d_model), num_attention_heads, num_key_value_heads,
//                head_dim, intermediate_size, rms_norm_eps, rope_theta, vocab_size (the target's),
//                draft_vocab_size Vd, target_hidden_size (default H), and
//                eagle_config.eagle_aux_hidden_state_layer_ids: the three target layers whose
//                outputs feed the head (e.g. [1, 17, 33] for gpt-oss-120b).
//   tensors      fc.weight [H, 3 Ht]; one decoder layer under "midlayer." (or "layers.0."):
//                hidden_norm, input_layernorm, post_attention_layernorm [H];
//                self_attn.{q,k,v}_proj [heads · head_dim, 2H] (input: the normed token embedding
//                and the normed hidden, concatenated), self_attn.o_proj [H, heads · head_dim];
//                mlp.{gate,up}_proj [I, H], mlp.down_proj [H, I] (SiLU-gated);
//                norm.weight [H]; lm_head.weight [Vd, H]; d2t int64 [Vd] (target id = draft id +
//                d2t[draft id]); t2d bool [V] (unused here); embed_tokens.weight [V, H] optional
//                (absent: the target's embedding, which is what the published heads use).
//
// One draft position p takes the embedding of token p + 1 and a hidden g_p: fc(concat of the target's
// three layer outputs at p) where the target computed p, else the head's own output at p - 1 (the
// pre-norm residual), and predicts token p + 2. Plain causal attention (no sinks, no window) over the
// head's own K/V of earlier positions (Eagle3Cache), Llama RoPE with rope_theta (no scaling).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/tensor.h"
#include "model/config.h"

namespace osprey::model {

struct Eagle3Config {
    int hidden = 0;         // H
    int target_hidden = 0;  // Ht (fc takes 3 Ht)
    int n_heads = 0, n_kv_heads = 0, head_dim = 0, intermediate = 0;
    int vocab = 0, draft_vocab = 0;
    float eps = 1e-5f;
    float rope_theta = 10000.0f;
    std::vector<int> aux_layers;  // target layers whose outputs feed fc, in order

    static Eagle3Config from_file(const std::filesystem::path& config_json);
    std::string to_json() const;  // config.json in the published layout
    void validate() const;
};

// A head shaped like the published ones for `target` (hidden = d_model, 64 heads of 64, 8 KV heads,
// intermediate 6 d_model, draft vocabulary min(32000, vocab / 2), aux layers 1, L/2 - 1, L - 3; the
// tiny presets get a proportionally small head).
Eagle3Config eagle3_config_for(const Config& target);
// Writes a random (deterministic from seed) head for `target` into `out` (config.json,
// model.safetensors). The draft vocabulary maps to spread-out target ids.
void write_synthetic_eagle3(const Config& target, const std::filesystem::path& out, uint64_t seed);

// The head's own K/V of one sequence: positions [first, first + n) of its layer, rows of
// n_kv_heads · head_dim floats. Rolling back is shrinking n.
struct Eagle3Cache {
    int first = 0;
    int n = 0;
    std::vector<float> k, v;
    int end() const { return first + n; }
    void truncate(int end_pos);   // keep positions < end_pos
    void reset(int first_pos);    // empty, the next position is first_pos
};

class Eagle3Head {
public:
    // `target_embedding`: the target's [V, H] bf16 table, used when the head has none (must outlive it).
    Eagle3Head(const std::filesystem::path& dir, const TensorView* target_embedding);
    ~Eagle3Head();
    const Eagle3Config& config() const { return config_; }

    // g = fc(aux): aux [n, 3 Ht] -> g [n, H].
    void project(std::span<const float> aux, int n, std::vector<float>& g) const;
    // Runs positions [cache.end(), cache.end() + n) with next tokens `next` [n] (token p + 1 for
    // position p) and hiddens g [n, H]; appends their K/V to the cache. out: [n, H] the layer's
    // output (the next step's g); predicted: the target id of the most likely draft token per row.
    void step(Eagle3Cache& cache, std::span<const int32_t> next, std::span<const float> g, std::vector<float>& out,
              std::vector<int32_t>& predicted) const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    Eagle3Config config_;
};

}  // namespace osprey::model
