// Every tensor of a gpt-oss checkpoint as non-owning views into the memory-mapped shards, in one
// layout-independent form. Both published layouts load into the same struct:
//   - Hugging Face (repo root): config.json + model-0000k-of-0000N.safetensors (+ index json),
//     names `model.layers.N.self_attn.q_proj.weight`, ... (spec §6.3);
//   - OpenAI original/ : config.json (original keys) + *.safetensors, names `block.N.attn.qkv.weight`,
//     ... (spec §6.2). Its fused qkv tensors are split into q/k/v row ranges here (views, no copy).
// Loading validates every tensor by name, dtype and shape against the Config, reports missing and
// unexpected tensors, and keeps the mapped files alive (shared ownership) as long as any copy of the
// Weights lives. Nothing is read into RAM: views point into the mmap'ed files.
//
// A folder written by `osprey convert --to fp8` (HF layout, docs/fp8.md) loads as it is: its linear
// weights are F8_E4M3 with an F32 `*_scale_inv` per 128 x 128 block, its experts F8_E4M3
// `gate_up_proj`/`down_proj` [E, out, in] with `*_scales_inv`. Other formats are made at load time by
// model/weight_convert.h (--weights fp8|mxfp4|bf16), into buffers the Weights own.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace osprey::io {
class Checkpoint;  // io/checkpoint.h: a set of mapped safetensors shards with a name index
}

namespace osprey::model {

enum class Layout { hf, original };
const char* layout_name(Layout l);  // "hf" | "original"

// How a group of weights is stored: the published MXFP4 experts, FP8 E4M3 with 128 x 128 block
// scales (core/fp8.h), or BF16.
enum class WeightFormat : uint8_t { mxfp4, fp8, bf16 };
const char* weight_format_name(WeightFormat f);  // "mxfp4" | "fp8" | "bf16"

// One transformer block. Shapes with E = n_experts, H = d_model, I = d_ff, Q = q_dim, K = kv_dim,
// NH = n_heads, nb(n) = ceil(n / 128). Dense tensors are BF16, the four attention projections BF16 or
// F8_E4M3 with an F32 block-scale view beside them (`*_scale`, empty unless FP8); norm gains are BF16
// or F32 (spec §10.3, check `.dtype`); experts are MXFP4 U8 blocks/scales as published (spec §6.4,
// decode with core/mxfp4.h), or F8_E4M3 / BF16 matrices (experts_format()); expert biases BF16.
struct LayerWeights {
    TensorView attn_norm;    // [H]            BF16|F32  RMSNorm gain before attention
    TensorView q_w, q_b;     // [Q, H], [Q]    BF16|FP8  (original: qkv rows [0, Q))
    TensorView k_w, k_b;     // [K, H], [K]    BF16|FP8  (original: qkv rows [Q, Q+K))
    TensorView v_w, v_b;     // [K, H], [K]    BF16|FP8  (original: qkv rows [Q+K, Q+2K))
    TensorView sinks;        // [NH]           BF16      one sink logit per query head
    TensorView out_w, out_b; // [H, Q], [H]    BF16|FP8
    TensorView q_scale, k_scale, v_scale, out_scale;  // [nb(rows), nb(cols)] F32 with FP8 weights, else empty
    TensorView mlp_norm;     // [H]            BF16|F32  RMSNorm gain before the MoE
    TensorView router_w;     // [E, H]         BF16
    TensorView router_b;     // [E]            BF16
    TensorView mlp1_blocks;  // [E, 2I, H/32, 16] U8     rows interleaved gate (even) / up (odd)
    TensorView mlp1_scales;  // [E, 2I, H/32]     U8     E8M0 exponents, bias 127
    TensorView mlp1_bias;    // [E, 2I]           BF16
    TensorView mlp2_blocks;  // [E, H, I/32, 16]  U8
    TensorView mlp2_scales;  // [E, H, I/32]      U8
    TensorView mlp2_bias;    // [E, H]            BF16
    // Experts as matrices instead of MXFP4 blocks (the blocks/scales views above are then empty):
    TensorView mlp1_w;       // [E, 2I, H]  F8_E4M3|BF16  rows interleaved gate/up, as mlp1_blocks
    TensorView mlp1_scale;   // [E, nb(2I), nb(H)] F32    FP8 only
    TensorView mlp2_w;       // [E, H, I]   F8_E4M3|BF16
    TensorView mlp2_scale;   // [E, nb(H), nb(I)]  F32    FP8 only

    WeightFormat experts_format() const;    // mxfp4 (blocks), fp8 or bf16 (mlp1_w's dtype)
    WeightFormat attention_format() const;  // fp8 when q_w is F8_E4M3, else bf16
};

struct Weights {
    Config config;
    Layout layout = Layout::hf;
    std::filesystem::path dir;  // the folder the tensors were read from (root, or root/original)

    TensorView embedding;            // [vocab, H] BF16
    std::vector<LayerWeights> layers;  // [n_layers]
    TensorView final_norm;           // [H] BF16|F32
    TensorView unembedding;          // [vocab, H] BF16|FP8 (untied)
    TensorView unembedding_scale;    // [nb(vocab), nb(H)] F32 with an FP8 unembedding, else empty

    // Keeps the mapped shards alive; every TensorView above points into them (or into `owned`).
    std::shared_ptr<const io::Checkpoint> checkpoint;
    // Buffers made by load-time conversion (model/weight_convert.h), shared by copies of the Weights.
    std::vector<std::shared_ptr<const std::vector<uint8_t>>> owned;

    WeightFormat unembedding_format() const;  // fp8 or bf16
    // "experts mxfp4, attention bf16, unembedding bf16": what a run is using, for logs and errors.
    std::string formats() const;

    // Loads `dir`: a Hugging Face repo root (config.json + safetensors shards), an OpenAI original/
    // folder, or a root that only holds original/. With `layout` given, only that layout is tried.
    // Throws osprey::Error naming the file/tensor and the problem (shape, dtype, missing, extra).
    static Weights load(const std::filesystem::path& dir, std::optional<Layout> layout = std::nullopt);

    // Validates an already opened checkpoint against `config` (used by load() and by tests).
    static Weights from_checkpoint(const Config& config, Layout layout,
                                   std::shared_ptr<const io::Checkpoint> checkpoint);

    // Visits every view (q/k/v of a fused original qkv count separately), in model order.
    void for_each(const std::function<void(const TensorView&)>& fn) const;
    size_t n_tensors() const;    // tensors in the checkpoint files (fused qkv counted once)
    size_t total_bytes() const;  // bytes of all tensor data in the checkpoint files
};

// Which layout a folder holds, without loading tensors: Layout::hf when `dir` has a config.json
// with HF keys and safetensors files next to it, Layout::original for an original/ folder (or a
// root with only original/). Throws naming what was looked for when neither is present.
Layout detect_layout(const std::filesystem::path& dir);

// The folder holding the tensors of `layout` under `dir` (root for hf; root/original or dir itself).
std::filesystem::path layout_dir(const std::filesystem::path& dir, Layout layout);

}  // namespace osprey::model
