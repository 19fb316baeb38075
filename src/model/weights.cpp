#include "model/weights.h"

#include <algorithm>
#include <set>

#include "core/check.h"
#include "core/file.h"
#include "core/fp8.h"
#include "core/json.h"
#include "io/checkpoint.h"

namespace osprey::model {

namespace fs = std::filesystem;

const char* layout_name(Layout l) { return l == Layout::hf ? "hf" : "original"; }

const char* weight_format_name(WeightFormat f) {
    switch (f) {
        case WeightFormat::mxfp4: return "mxfp4";
        case WeightFormat::fp8: return "fp8";
        case WeightFormat::bf16: return "bf16";
    }
    return "?";
}

WeightFormat LayerWeights::experts_format() const {
    if (mlp1_w.shape.empty()) return WeightFormat::mxfp4;
    return mlp1_w.dtype == DType::fp8_e4m3 ? WeightFormat::fp8 : WeightFormat::bf16;
}

WeightFormat LayerWeights::attention_format() const {
    return q_w.dtype == DType::fp8_e4m3 ? WeightFormat::fp8 : WeightFormat::bf16;
}

WeightFormat Weights::unembedding_format() const {
    return unembedding.dtype == DType::fp8_e4m3 ? WeightFormat::fp8 : WeightFormat::bf16;
}

std::string Weights::formats() const {
    if (layers.empty()) return str("unembedding ", weight_format_name(unembedding_format()));
    return str("experts ", weight_format_name(layers[0].experts_format()), ", attention ",
               weight_format_name(layers[0].attention_format()), ", unembedding ",
               weight_format_name(unembedding_format()));
}

namespace {

// Tensor names of one layout (spec §6.2 / §6.3).
struct Names {
    Layout layout;
    std::string embedding() const { return layout == Layout::hf ? "model.embed_tokens.weight" : "embedding.weight"; }
    std::string final_norm() const { return layout == Layout::hf ? "model.norm.weight" : "norm.scale"; }
    std::string unembedding() const { return layout == Layout::hf ? "lm_head.weight" : "unembedding.weight"; }
    std::string hf(int i, const char* rest) const { return str("model.layers.", i, ".", rest); }
    std::string orig(int i, const char* rest) const { return str("block.", i, ".", rest); }
};

// Expectation for one tensor: dtype (or any of two for norm gains) and shape.
struct Expect {
    std::vector<DType> dtypes;
    std::vector<int64_t> shape;
};

std::string describe_expect(const Expect& e) {
    std::string s;
    for (size_t i = 0; i < e.dtypes.size(); ++i) s += (i ? " or " : "") + std::string(dtype_name(e.dtypes[i]));
    return s + " " + format_shape(e.shape);
}

class Loader {
public:
    Loader(const io::Checkpoint& ckpt) : ckpt_(ckpt) {}

    // The view for `name`, checked against `e`. Missing tensors are collected (reported together).
    TensorView take(const std::string& name, const Expect& e) {
        used_.insert(name);
        const TensorView* v = ckpt_.find(name);
        if (v == nullptr) {
            missing_.push_back(name);
            return TensorView{.name = name, .dtype = e.dtypes[0], .shape = e.shape, .data = nullptr};
        }
        const bool dtype_ok = std::find(e.dtypes.begin(), e.dtypes.end(), v->dtype) != e.dtypes.end();
        if ((!dtype_ok || v->shape != e.shape) && mismatch_.empty()) {
            mismatch_ = str(name, ": expected ", describe_expect(e), ", got ", v->describe(), " (in ",
                            ckpt_.file_of(name).string(), ")");
        }
        return *v;
    }

    bool has(const std::string& name) const { return ckpt_.find(name) != nullptr; }

    // A linear weight [rows, cols]: BF16, or F8_E4M3 when `<prefix>.weight_scale_inv` exists, with
    // its F32 block multipliers [nb(rows), nb(cols)] in `scale`.
    TensorView take_linear(const std::string& prefix, int64_t rows, int64_t cols, TensorView& scale) {
        const std::string scale_name = prefix + ".weight_scale_inv";
        if (!has(scale_name)) return take(prefix + ".weight", {{DType::bf16}, {rows, cols}});
        scale = take(scale_name, {{DType::f32}, {fp8::n_blocks(rows), fp8::n_blocks(cols)}});
        return take(prefix + ".weight", {{DType::fp8_e4m3}, {rows, cols}});
    }

    void finish() const {
        if (!missing_.empty()) {
            std::string list;
            for (size_t i = 0; i < missing_.size() && i < 8; ++i) list += (i ? ", " : "") + missing_[i];
            if (missing_.size() > 8) list += str(" and ", missing_.size() - 8, " more");
            OSPREY_FAIL(ckpt_.dir().string(), ": ", missing_.size(), " missing tensor", missing_.size() > 1 ? "s" : "",
                        ": ", list);
        }
        OSPREY_CHECK(mismatch_.empty(), mismatch_);
        std::vector<std::string> extra;
        for (const std::string& n : ckpt_.names())
            if (!used_.count(n)) extra.push_back(n);
        if (!extra.empty()) {
            std::string list;
            for (size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? ", " : "") + extra[i];
            if (extra.size() > 8) list += str(" and ", extra.size() - 8, " more");
            OSPREY_FAIL(ckpt_.dir().string(), ": ", extra.size(), " unexpected tensor", extra.size() > 1 ? "s" : "",
                        " not part of gpt-oss with this config: ", list);
        }
    }

private:
    const io::Checkpoint& ckpt_;
    std::set<std::string> used_;
    std::vector<std::string> missing_;
    std::string mismatch_;
};

// Rows [row_begin, row_begin + n_rows) of a row-major view (a 1-D bias when shape has one dim).
TensorView row_slice(const TensorView& v, int64_t row_begin, int64_t n_rows, const char* part) {
    TensorView s = v;
    s.name = str(v.name, " (", part, " rows ", row_begin, "..", row_begin + n_rows, ")");
    s.shape[0] = n_rows;
    const int64_t row_elems = v.shape.size() > 1 ? v.numel() / v.shape[0] : 1;
    if (v.data != nullptr)
        s.data = static_cast<const uint8_t*>(v.data) + size_t(row_begin * row_elems) * dtype_size(v.dtype);
    return s;
}

bool has_safetensors(const fs::path& dir) {
    if (fs::is_regular_file(dir / "model.safetensors.index.json")) return true;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.is_regular_file() && e.path().extension() == ".safetensors") return true;
    return false;
}

// True for a config.json in HF spelling, false for the original spelling.
bool is_hf_config(const fs::path& config_file) {
    json::Value j;
    try {
        j = json::parse(read_file(config_file));
    } catch (const Error& e) {
        OSPREY_FAIL(config_file.string(), ": ", e.what());
    }
    return j.contains("model_type") || j.contains("num_local_experts") || j.contains("rope_scaling") ||
           j.contains("rope_parameters");
}

// original/dtypes.json, when present, must list exactly the logical dtypes of the stored tensors.
void check_dtypes_json(const fs::path& dir, const io::Checkpoint& ckpt) {
    const fs::path p = dir / "dtypes.json";
    if (!fs::is_regular_file(p)) return;
    json::Value j;
    try {
        j = json::parse(read_file(p));
    } catch (const Error& e) {
        OSPREY_FAIL(p.string(), ": ", e.what());
    }
    OSPREY_CHECK(j.is_object(), p.string(), ": must be a JSON object");
    for (const auto& [name, t] : j.as_object()) {
        const TensorView* v = ckpt.find(name);
        OSPREY_CHECK(v != nullptr, p.string(), ": lists '", name, "', which is not in the checkpoint");
        OSPREY_CHECK(t.is_string(), p.string(), ": '", name, "' must map to a dtype string");
        const std::string& s = t.as_string();
        const bool ok = (s == "FP4" || s == "UE8") ? v->dtype == DType::u8 : s == dtype_name(v->dtype);
        OSPREY_CHECK(ok, p.string(), ": '", name, "' is ", s, " but stored as ", dtype_name(v->dtype));
    }
}

}  // namespace

Layout detect_layout(const fs::path& dir) {
    OSPREY_CHECK(fs::is_directory(dir), dir.string(), ": not a directory");
    if (fs::is_regular_file(dir / "config.json") && has_safetensors(dir))
        return is_hf_config(dir / "config.json") ? Layout::hf : Layout::original;
    if (fs::is_regular_file(dir / "original" / "config.json") && has_safetensors(dir / "original"))
        return Layout::original;
    OSPREY_FAIL(dir.string(), ": no checkpoint found (expected config.json with *.safetensors, "
                              "or original/config.json with original/*.safetensors)");
}

fs::path layout_dir(const fs::path& dir, Layout layout) {
    if (layout == Layout::original && fs::is_regular_file(dir / "original" / "config.json")) return dir / "original";
    return dir;
}

Weights Weights::load(const fs::path& dir, std::optional<Layout> layout) {
    const Layout l = layout ? *layout : detect_layout(dir);
    const fs::path folder = layout_dir(dir, l);
    const fs::path config_file = folder / "config.json";
    OSPREY_CHECK(fs::is_regular_file(config_file), config_file.string(), ": missing (", layout_name(l), " layout)");
    const bool hf_config = is_hf_config(config_file);
    OSPREY_CHECK(hf_config == (l == Layout::hf), config_file.string(), ": is in the ",
                 hf_config ? "Hugging Face" : "original", " spelling but the ", layout_name(l), " layout was requested");
    const Config config = Config::load(config_file);
    auto ckpt = io::Checkpoint::open_dir(folder);
    if (l == Layout::original) check_dtypes_json(folder, *ckpt);
    Weights w = from_checkpoint(config, l, std::move(ckpt));
    w.dir = folder;
    return w;
}

Weights Weights::from_checkpoint(const Config& c, Layout layout, std::shared_ptr<const io::Checkpoint> ckpt) {
    OSPREY_CHECK(ckpt != nullptr, "no checkpoint");
    c.validate();
    const int64_t H = c.d_model, Q = c.q_dim(), K = c.kv_dim(), E = c.n_experts, I = c.d_ff, V = c.vocab_size;
    const std::vector<DType> bf16{DType::bf16}, u8{DType::u8}, norm{DType::bf16, DType::f32};
    Loader ld(*ckpt);
    Names n{layout};

    Weights w;
    w.config = c;
    w.layout = layout;
    w.dir = ckpt->dir();
    w.embedding = ld.take(n.embedding(), {bf16, {V, H}});
    w.layers.resize(size_t(c.n_layers));
    for (int i = 0; i < c.n_layers; ++i) {
        LayerWeights& L = w.layers[size_t(i)];
        if (layout == Layout::hf) {
            L.attn_norm = ld.take(n.hf(i, "input_layernorm.weight"), {norm, {H}});
            L.q_w = ld.take_linear(n.hf(i, "self_attn.q_proj"), Q, H, L.q_scale);
            L.q_b = ld.take(n.hf(i, "self_attn.q_proj.bias"), {bf16, {Q}});
            L.k_w = ld.take_linear(n.hf(i, "self_attn.k_proj"), K, H, L.k_scale);
            L.k_b = ld.take(n.hf(i, "self_attn.k_proj.bias"), {bf16, {K}});
            L.v_w = ld.take_linear(n.hf(i, "self_attn.v_proj"), K, H, L.v_scale);
            L.v_b = ld.take(n.hf(i, "self_attn.v_proj.bias"), {bf16, {K}});
            L.sinks = ld.take(n.hf(i, "self_attn.sinks"), {bf16, {c.n_heads}});
            L.out_w = ld.take_linear(n.hf(i, "self_attn.o_proj"), H, Q, L.out_scale);
            L.out_b = ld.take(n.hf(i, "self_attn.o_proj.bias"), {bf16, {H}});
            L.mlp_norm = ld.take(n.hf(i, "post_attention_layernorm.weight"), {norm, {H}});
            L.router_w = ld.take(n.hf(i, "mlp.router.weight"), {bf16, {E, H}});
            L.router_b = ld.take(n.hf(i, "mlp.router.bias"), {bf16, {E}});
            if (ld.has(n.hf(i, "mlp.experts.gate_up_proj"))) {
                // Converted experts (docs/fp8.md): [E, out, in] matrices, F8_E4M3 with block scales or BF16.
                const bool fp8 = ld.has(n.hf(i, "mlp.experts.gate_up_proj_scales_inv"));
                const std::vector<DType> w_dtype{fp8 ? DType::fp8_e4m3 : DType::bf16};
                L.mlp1_w = ld.take(n.hf(i, "mlp.experts.gate_up_proj"), {w_dtype, {E, 2 * I, H}});
                L.mlp2_w = ld.take(n.hf(i, "mlp.experts.down_proj"), {w_dtype, {E, H, I}});
                if (fp8) {
                    L.mlp1_scale = ld.take(n.hf(i, "mlp.experts.gate_up_proj_scales_inv"),
                                           {{DType::f32}, {E, fp8::n_blocks(2 * I), fp8::n_blocks(H)}});
                    L.mlp2_scale = ld.take(n.hf(i, "mlp.experts.down_proj_scales_inv"),
                                           {{DType::f32}, {E, fp8::n_blocks(H), fp8::n_blocks(I)}});
                }
            } else {
                L.mlp1_blocks = ld.take(n.hf(i, "mlp.experts.gate_up_proj_blocks"), {u8, {E, 2 * I, H / 32, 16}});
                L.mlp1_scales = ld.take(n.hf(i, "mlp.experts.gate_up_proj_scales"), {u8, {E, 2 * I, H / 32}});
                L.mlp2_blocks = ld.take(n.hf(i, "mlp.experts.down_proj_blocks"), {u8, {E, H, I / 32, 16}});
                L.mlp2_scales = ld.take(n.hf(i, "mlp.experts.down_proj_scales"), {u8, {E, H, I / 32}});
            }
            L.mlp1_bias = ld.take(n.hf(i, "mlp.experts.gate_up_proj_bias"), {bf16, {E, 2 * I}});
            L.mlp2_bias = ld.take(n.hf(i, "mlp.experts.down_proj_bias"), {bf16, {E, H}});
        } else {
            L.attn_norm = ld.take(n.orig(i, "attn.norm.scale"), {norm, {H}});
            const TensorView qkv_w = ld.take(n.orig(i, "attn.qkv.weight"), {bf16, {Q + 2 * K, H}});
            const TensorView qkv_b = ld.take(n.orig(i, "attn.qkv.bias"), {bf16, {Q + 2 * K}});
            L.q_w = row_slice(qkv_w, 0, Q, "q");
            L.k_w = row_slice(qkv_w, Q, K, "k");
            L.v_w = row_slice(qkv_w, Q + K, K, "v");
            L.q_b = row_slice(qkv_b, 0, Q, "q");
            L.k_b = row_slice(qkv_b, Q, K, "k");
            L.v_b = row_slice(qkv_b, Q + K, K, "v");
            L.sinks = ld.take(n.orig(i, "attn.sinks"), {bf16, {c.n_heads}});
            L.out_w = ld.take(n.orig(i, "attn.out.weight"), {bf16, {H, Q}});
            L.out_b = ld.take(n.orig(i, "attn.out.bias"), {bf16, {H}});
            L.mlp_norm = ld.take(n.orig(i, "mlp.norm.scale"), {norm, {H}});
            L.router_w = ld.take(n.orig(i, "mlp.gate.weight"), {bf16, {E, H}});
            L.router_b = ld.take(n.orig(i, "mlp.gate.bias"), {bf16, {E}});
            L.mlp1_blocks = ld.take(n.orig(i, "mlp.mlp1_weight.blocks"), {u8, {E, 2 * I, H / 32, 16}});
            L.mlp1_scales = ld.take(n.orig(i, "mlp.mlp1_weight.scales"), {u8, {E, 2 * I, H / 32}});
            L.mlp1_bias = ld.take(n.orig(i, "mlp.mlp1_bias"), {bf16, {E, 2 * I}});
            L.mlp2_blocks = ld.take(n.orig(i, "mlp.mlp2_weight.blocks"), {u8, {E, H, I / 32, 16}});
            L.mlp2_scales = ld.take(n.orig(i, "mlp.mlp2_weight.scales"), {u8, {E, H, I / 32}});
            L.mlp2_bias = ld.take(n.orig(i, "mlp.mlp2_bias"), {bf16, {E, H}});
        }
    }
    w.final_norm = ld.take(n.final_norm(), {norm, {H}});
    if (layout == Layout::hf)
        w.unembedding = ld.take_linear("lm_head", V, H, w.unembedding_scale);
    else
        w.unembedding = ld.take(n.unembedding(), {bf16, {V, H}});
    ld.finish();
    w.checkpoint = std::move(ckpt);
    return w;
}

void Weights::for_each(const std::function<void(const TensorView&)>& fn) const {
    fn(embedding);
    for (const LayerWeights& L : layers) {
        for (const TensorView* v : {&L.attn_norm, &L.q_w, &L.q_b, &L.k_w, &L.k_b, &L.v_w, &L.v_b, &L.sinks, &L.out_w,
                                    &L.out_b, &L.mlp_norm, &L.router_w, &L.router_b, &L.mlp1_blocks, &L.mlp1_scales,
                                    &L.mlp1_bias, &L.mlp2_blocks, &L.mlp2_scales, &L.mlp2_bias, &L.q_scale,
                                    &L.k_scale, &L.v_scale, &L.out_scale, &L.mlp1_w, &L.mlp1_scale, &L.mlp2_w,
                                    &L.mlp2_scale})
            if (!v->shape.empty()) fn(*v);
    }
    fn(final_norm);
    fn(unembedding);
    if (!unembedding_scale.shape.empty()) fn(unembedding_scale);
}

size_t Weights::n_tensors() const { return checkpoint ? checkpoint->n_tensors() : 0; }

size_t Weights::total_bytes() const { return checkpoint ? checkpoint->data_bytes() : 0; }

}  // namespace osprey::model
