// Random-weight gpt-oss checkpoints in the exact published layouts (`osprey make-model`), so every
// command and test runs without downloading weights. Deterministic from the seed: each value is a
// counter-based hash of (seed, logical tensor, layer, element index), so tensors are generated in
// parallel chunks in any order, and the HF and original layouts of one seed hold the same model.
// The initialisation scheme (well-conditioned on purpose) is described in synthetic.cpp, with its
// scales in one struct (SyntheticInit) so they are easy to adjust.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors_writer.h"
#include "model/config.h"
#include "model/weights.h"

namespace osprey::model {

// Presets: "tiny" (4 layers, d_model 128, 8 experts; real vocab and RoPE), "tiny-tp" (tiny with 16
// query / 8 KV heads, for tensor parallelism up to 8), "20b", "120b".
Config preset_config(std::string_view preset);
std::vector<std::string> preset_names();

// Scales of the random initialisation (see synthetic.cpp for what each one controls).
struct SyntheticInit {
    float embed_scale = 1.0f;        // every embedding entry is ±embed_scale (residual RMS)
    float top_logit = 20.0f;         // logit of the structured next token for an unperturbed state
    float attn_update = 0.05f;       // RMS of one attention update relative to the residual RMS
    float mlp_update = 0.05f;        // RMS of one MoE update relative to the residual RMS
    float qkv_bias = 0.1f;           // RMS of q/k/v biases (q, k, v themselves have RMS ~1)
    float out_bias = 0.2f;           // RMS of o_proj / down_proj biases, relative to the update RMS
    float mlp1_bias = 0.1f;          // RMS of gate_up biases (pre-activations have RMS ~1)
    float norm_gain_jitter = 0.05f;  // norm gains are 1 + uniform noise of this RMS
    float sink_scale = 1.0f;         // sinks uniform in [-sink_scale, sink_scale]
    float router_class_logit = 4.0f; // router logit of the experts chosen for a token's class
    float router_bias_jitter = 0.5f; // router biases uniform in [-jitter, jitter] (softmax weights vary)
    float router_noise = 0.15f;      // RMS of the router logit part from the non-code dimensions
    int route_code_dims = 0;         // embedding dims carrying the routing class; 0 = min(32, 2^k <= H/8)
};

struct SyntheticOptions {
    std::string preset = "tiny";
    uint64_t seed = 0;
    Layout layout = Layout::hf;
    std::filesystem::path out;
    uint64_t max_shard_bytes = 4'800'000'000ull;  // HF layout shard limit (the converter's 4.8 GB)
    int threads = 0;                              // generation threads; 0 = all cores
    std::filesystem::path tokenizer_file;         // copied to out/o200k_base.tiktoken when set
    SyntheticInit init;
};

struct SyntheticResult {
    std::vector<std::filesystem::path> files;  // every file written
    uint64_t bytes = 0;                        // safetensors bytes written
    double seconds = 0;                        // wall time of the tensor writes
};

// Writes a full checkpoint for `config` (normally preset_config(options.preset)) into options.out.
SyntheticResult write_synthetic_checkpoint(const Config& config, const SyntheticOptions& options);
SyntheticResult write_synthetic_checkpoint(const SyntheticOptions& options);

// Every tensor (name, dtype, shape) a `layout` checkpoint of `config` holds, in model order.
std::vector<io::TensorSpec> checkpoint_tensor_specs(const Config& config, Layout layout);

// The token the synthetic unembedding favours after `token` (the greedy continuation of an
// unperturbed residual state): a known answer for end-to-end tests on synthetic checkpoints.
int64_t synthetic_next_token(const Config& config, uint64_t seed, int64_t token);

// The top_k experts (ascending ids) the synthetic router of `layer` picks for an unperturbed residual
// state of `token` (by the token's routing class); `init` must be the one the checkpoint was written with.
std::vector<int> synthetic_expert_set(const Config& config, uint64_t seed, int layer, int64_t token,
                                      const SyntheticInit& init = {});

}  // namespace osprey::model
