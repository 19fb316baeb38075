// gpt-oss hyperparameters, read from a checkpoint's config.json (HF layout with `rope_scaling` or
// `rope_parameters`, or OpenAI's original/config.json). Glossary: shared/spec/gpt-oss-model.md §2.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "core/json.h"

namespace osprey::model {

struct Config {
    int n_layers = 24;
    int d_model = 2880;
    int n_heads = 64;
    int n_kv_heads = 8;
    int head_dim = 64;
    int n_experts = 32;
    int top_k = 4;             // experts per token
    int d_ff = 2880;           // expert intermediate size
    int vocab_size = 201088;
    int sliding_window = 128;  // keys a sliding layer sees (which layers slide: model/kv_spec.h)
    int max_position = 131072;
    float norm_eps = 1e-5f;
    float swiglu_alpha = 1.702f;
    float swiglu_limit = 7.0f;
    // YaRN RoPE (not truncated: low/high stay fractional, see spec §3.4).
    double rope_theta = 150000.0;
    double rope_factor = 32.0;
    int rope_original_context = 4096;
    double rope_beta_fast = 32.0;
    double rope_beta_slow = 1.0;
    bool rope_truncate = false;
    int eos_token_id = 200002;
    int pad_token_id = 199999;

    int q_dim() const { return n_heads * head_dim; }      // 4096
    int kv_dim() const { return n_kv_heads * head_dim; }  // 512
    int group() const { return n_heads / n_kv_heads; }    // query heads per kv head (8)

    // Throws osprey::Error naming the field when a value is missing, mistyped or inconsistent.
    static Config from_json(const json::Value& config_json);
    static Config load(const std::filesystem::path& config_file);
    json::Value to_hf_json() const;        // the Hub's config.json (with `rope_scaling`)
    json::Value to_original_json() const;  // OpenAI's original/config.json
    json::Value to_generation_config_json() const;  // the Hub's generation_config.json
    void validate() const;
};

}  // namespace osprey::model
