// EAGLE-3 head on the CPU (see eagle3.h).
#include "model/eagle3.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <fstream>
#include <random>

#include "core/check.h"
#include "core/file.h"
#include "core/json.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rmsnorm.h"

namespace osprey::model {

namespace fs = std::filesystem;

namespace {

int json_int(const json::Value& j, std::string_view key, std::optional<int> fallback) {
    const json::Value* v = j.find(key);
    if (!v || v->is_null()) {
        OSPREY_CHECK(fallback.has_value(), "EAGLE-3 config: '", key, "' is missing");
        return *fallback;
    }
    return int(v->as_int());
}

}  // namespace

Eagle3Config Eagle3Config::from_file(const fs::path& path) {
    const json::Value j = json::parse(read_file(path));
    Eagle3Config c;
    c.hidden = json_int(j, "hidden_size", std::nullopt);
    c.target_hidden = json_int(j, "target_hidden_size", c.hidden);
    c.n_heads = json_int(j, "num_attention_heads", std::nullopt);
    c.n_kv_heads = json_int(j, "num_key_value_heads", c.n_heads);
    c.head_dim = json_int(j, "head_dim", c.hidden / std::max(1, c.n_heads));
    c.intermediate = json_int(j, "intermediate_size", std::nullopt);
    c.vocab = json_int(j, "vocab_size", std::nullopt);
    c.draft_vocab = json_int(j, "draft_vocab_size", c.vocab);
    if (const json::Value* e = j.find("rms_norm_eps"); e && e->is_number()) c.eps = float(e->as_double());
    if (const json::Value* t = j.find("rope_theta"); t && t->is_number()) c.rope_theta = float(t->as_double());
    const json::Value* ids = nullptr;
    if (const json::Value* ec = j.find("eagle_config"); ec && ec->is_object())
        ids = ec->find("eagle_aux_hidden_state_layer_ids");
    if (!ids) ids = j.find("eagle_aux_hidden_state_layer_ids");
    OSPREY_CHECK(ids && ids->is_array(), "EAGLE-3 config ", path.string(),
                 ": no eagle_config.eagle_aux_hidden_state_layer_ids (the three target layers)");
    for (const json::Value& v : ids->as_array()) c.aux_layers.push_back(int(v.as_int()));
    c.validate();
    return c;
}

void Eagle3Config::validate() const {
    OSPREY_CHECK(hidden > 0 && target_hidden > 0 && n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 &&
                     head_dim > 0 && head_dim % 2 == 0 && intermediate > 0 && vocab > 0 && draft_vocab > 0 &&
                     draft_vocab <= vocab,
                 "EAGLE-3 config: bad shape (hidden ", hidden, ", heads ", n_heads, "/", n_kv_heads, " of ", head_dim,
                 ", intermediate ", intermediate, ", vocab ", vocab, ", draft vocab ", draft_vocab, ")");
    OSPREY_CHECK(aux_layers.size() == 3, "EAGLE-3 config: ", aux_layers.size(), " aux layers, expected 3");
}

std::string Eagle3Config::to_json() const {
    json::Value j;
    json::Array arch;
    arch.push_back("LlamaForCausalLMEagle3");
    j.set("architectures", json::Value(std::move(arch)));
    j.set("model_type", "llama");
    json::Array ids;
    for (int l : aux_layers) ids.push_back(l);
    json::Value ec;
    ec.set("eagle_aux_hidden_state_layer_ids", json::Value(std::move(ids)));
    j.set("eagle_config", std::move(ec));
    j.set("hidden_size", hidden);
    j.set("target_hidden_size", target_hidden);
    j.set("num_attention_heads", n_heads);
    j.set("num_key_value_heads", n_kv_heads);
    j.set("head_dim", head_dim);
    j.set("intermediate_size", intermediate);
    j.set("num_hidden_layers", 1);
    j.set("hidden_act", "silu");
    j.set("rms_norm_eps", double(eps));
    j.set("rope_theta", double(rope_theta));
    j.set("vocab_size", vocab);
    j.set("draft_vocab_size", draft_vocab);
    j.set("tie_word_embeddings", false);
    j.set("torch_dtype", "bfloat16");
    return j.dump(2) + "\n";
}

Eagle3Config eagle3_config_for(const Config& t) {
    Eagle3Config c;
    c.hidden = c.target_hidden = t.d_model;
    const bool small = t.d_model < 1024;
    c.head_dim = small ? t.head_dim : 64;
    c.n_heads = small ? t.n_heads : 64;
    c.n_kv_heads = small ? t.n_kv_heads : 8;
    c.intermediate = 6 * t.d_model;
    c.vocab = t.vocab_size;
    c.draft_vocab = std::min(32000, t.vocab_size / 2);
    c.rope_theta = t.rope_theta > 0 ? float(t.rope_theta) : 150000.0f;
    const int L = t.n_layers;
    c.aux_layers = {std::min(1, L - 1), std::max(0, L / 2 - 1), std::max(0, L - 3)};
    c.validate();
    return c;
}

void write_synthetic_eagle3(const Config& target, const fs::path& out, uint64_t seed) {
    const Eagle3Config c = eagle3_config_for(target);
    fs::create_directories(out);
    const int64_t H = c.hidden, Q = int64_t(c.n_heads) * c.head_dim, K = int64_t(c.n_kv_heads) * c.head_dim;
    const int64_t I = c.intermediate;
    std::vector<io::TensorSpec> specs = {
        {"fc.weight", DType::bf16, {H, 3 * int64_t(c.target_hidden)}},
        {"midlayer.hidden_norm.weight", DType::bf16, {H}},
        {"midlayer.input_layernorm.weight", DType::bf16, {H}},
        {"midlayer.post_attention_layernorm.weight", DType::bf16, {H}},
        {"midlayer.self_attn.q_proj.weight", DType::bf16, {Q, 2 * H}},
        {"midlayer.self_attn.k_proj.weight", DType::bf16, {K, 2 * H}},
        {"midlayer.self_attn.v_proj.weight", DType::bf16, {K, 2 * H}},
        {"midlayer.self_attn.o_proj.weight", DType::bf16, {H, Q}},
        {"midlayer.mlp.gate_proj.weight", DType::bf16, {I, H}},
        {"midlayer.mlp.up_proj.weight", DType::bf16, {I, H}},
        {"midlayer.mlp.down_proj.weight", DType::bf16, {H, I}},
        {"norm.weight", DType::bf16, {H}},
        {"lm_head.weight", DType::bf16, {int64_t(c.draft_vocab), H}},
        {"d2t", DType::i64, {int64_t(c.draft_vocab)}},
        {"t2d", DType::boolean, {int64_t(c.vocab)}},
    };
    // Draft id i stands for target id i * stride (spread over the vocabulary).
    const int64_t stride = std::max<int64_t>(1, c.vocab / c.draft_vocab);
    auto target_of = [&](int64_t i) { return (i * stride) % c.vocab; };
    const io::FillFn fill = [&](size_t index, uint64_t offset, uint8_t* dst, size_t n) {
        const io::TensorSpec& s = specs[index];
        if (s.dtype == DType::i64) {
            for (size_t b = 0; b < n; b += 8) {
                const int64_t i = int64_t((offset + b) / 8);
                const int64_t v = target_of(i) - i;
                std::memcpy(dst + b, &v, 8);
            }
            return;
        }
        if (s.dtype == DType::boolean) {
            for (size_t b = 0; b < n; ++b) {
                const int64_t t = int64_t(offset + b);
                dst[b] = uint8_t(t % stride == 0 && t / stride < c.draft_vocab);
            }
            return;
        }
        const bool norm = s.shape.size() == 1;
        const double scale = norm ? 0.0 : 1.0 / std::sqrt(double(s.shape[1]));
        for (size_t b = 0; b < n; b += 2) {
            const uint64_t e = (offset + b) / 2;
            // A counter-based hash: the same bytes whatever the chunking.
            uint64_t x = (seed * 0x9E3779B97F4A7C15ull) ^ (uint64_t(index) << 48) ^ e;
            x ^= x >> 33;
            x *= 0xff51afd7ed558ccdull;
            x ^= x >> 33;
            x *= 0xc4ceb9fe1a85ec53ull;
            x ^= x >> 33;
            const double u = double(x >> 11) * 0x1.0p-53 * 2.0 - 1.0;  // [-1, 1)
            const float v = norm ? float(1.0 + 0.05 * u) : float(u * scale * std::sqrt(3.0));
            const bf16 h = float_to_bf16(v);
            std::memcpy(dst + b, &h, 2);
        }
    };
    io::write_safetensors(out / "model.safetensors", specs, {{"format", "pt"}}, fill);
    std::ofstream cfg(out / "config.json", std::ios::binary | std::ios::trunc);
    cfg << c.to_json();
    OSPREY_CHECK(cfg.good(), "cannot write ", (out / "config.json").string());
}

void Eagle3Cache::truncate(int end_pos) {
    const int keep = std::clamp(end_pos - first, 0, n);
    const size_t row = n > 0 ? k.size() / size_t(n) : 0;
    n = keep;
    k.resize(size_t(keep) * row);
    v.resize(size_t(keep) * row);
}

void Eagle3Cache::reset(int first_pos) {
    first = first_pos;
    n = 0;
    k.clear();
    v.clear();
}

struct Eagle3Head::Impl {
    std::shared_ptr<const io::SafetensorsFile> file;
    std::vector<std::vector<bf16>> owned;  // tensors converted to bf16
    std::span<const bf16> fc, q, k, v, o, gate, up, down, lm_head, embedding;
    std::vector<float> hidden_norm, input_norm, post_norm, final_norm;
    std::vector<int64_t> d2t;
    std::vector<float> inv_freq;  // [head_dim / 2]
};

namespace {

const TensorView& need(const io::SafetensorsFile& f, const std::vector<std::string>& names,
                       std::vector<int64_t> shape) {
    for (const std::string& n : names)
        if (const TensorView* t = f.find(n)) {
            OSPREY_CHECK(t->shape == shape, "EAGLE-3 head: ", n, " is ", t->describe(), ", expected shape [",
                         shape.size() > 0 ? shape[0] : 0, shape.size() > 1 ? ", ..." : "", "]");
            return *t;
        }
    OSPREY_FAIL("EAGLE-3 head ", f.path().string(), ": no tensor ", names.front());
}

}  // namespace

Eagle3Head::Eagle3Head(const fs::path& dir, const TensorView* target_embedding)
    : impl_(std::make_unique<Impl>()), config_(Eagle3Config::from_file(dir / "config.json")) {
    const Eagle3Config& c = config_;
    Impl& m = *impl_;
    m.file = io::SafetensorsFile::open(dir / "model.safetensors");
    const io::SafetensorsFile& f = *m.file;
    auto as_bf16 = [&](const TensorView& t) -> std::span<const bf16> {
        if (t.dtype == DType::bf16) return {t.as<bf16>(), size_t(t.numel())};
        OSPREY_CHECK(t.dtype == DType::f32, "EAGLE-3 head: ", t.name, " is ", t.describe(), " (bf16 or f32 only)");
        std::vector<bf16> w(size_t(t.numel()));
        for (size_t i = 0; i < w.size(); ++i) w[i] = float_to_bf16(t.as<float>()[i]);
        m.owned.push_back(std::move(w));
        return m.owned.back();
    };
    auto as_f32 = [&](const TensorView& t) {
        std::vector<float> out(size_t(t.numel()));
        for (size_t i = 0; i < out.size(); ++i)
            out[i] = t.dtype == DType::bf16 ? bf16_to_float(t.as<bf16>()[i]) : t.as<float>()[i];
        return out;
    };
    auto layer = [](const std::string& n) { return std::vector<std::string>{"midlayer." + n, "layers.0." + n}; };
    const int64_t H = c.hidden, Q = int64_t(c.n_heads) * c.head_dim, K = int64_t(c.n_kv_heads) * c.head_dim;
    const int64_t I = c.intermediate;
    m.fc = as_bf16(need(f, {"fc.weight"}, {H, 3 * int64_t(c.target_hidden)}));
    m.q = as_bf16(need(f, layer("self_attn.q_proj.weight"), {Q, 2 * H}));
    m.k = as_bf16(need(f, layer("self_attn.k_proj.weight"), {K, 2 * H}));
    m.v = as_bf16(need(f, layer("self_attn.v_proj.weight"), {K, 2 * H}));
    m.o = as_bf16(need(f, layer("self_attn.o_proj.weight"), {H, Q}));
    m.gate = as_bf16(need(f, layer("mlp.gate_proj.weight"), {I, H}));
    m.up = as_bf16(need(f, layer("mlp.up_proj.weight"), {I, H}));
    m.down = as_bf16(need(f, layer("mlp.down_proj.weight"), {H, I}));
    m.lm_head = as_bf16(need(f, {"lm_head.weight"}, {int64_t(c.draft_vocab), H}));
    m.hidden_norm = as_f32(need(f, layer("hidden_norm.weight"), {H}));
    m.input_norm = as_f32(need(f, layer("input_layernorm.weight"), {H}));
    m.post_norm = as_f32(need(f, layer("post_attention_layernorm.weight"), {H}));
    m.final_norm = as_f32(need(f, {"norm.weight"}, {H}));
    if (const TensorView* e = f.find("embed_tokens.weight")) {
        OSPREY_CHECK(e->shape == std::vector<int64_t>({int64_t(c.vocab), H}), "EAGLE-3 head: embed_tokens is ",
                     e->describe());
        m.embedding = as_bf16(*e);
    } else {
        OSPREY_CHECK(target_embedding && target_embedding->dtype == DType::bf16 &&
                         target_embedding->shape == std::vector<int64_t>({int64_t(c.vocab), H}),
                     "EAGLE-3 head: no embed_tokens.weight and the target's embedding does not fit [", c.vocab, ", ",
                     H, "]");
        m.embedding = {target_embedding->as<bf16>(), size_t(target_embedding->numel())};
    }
    if (const TensorView* d = f.find("d2t")) {
        OSPREY_CHECK(d->dtype == DType::i64 && d->numel() == c.draft_vocab, "EAGLE-3 head: d2t is ", d->describe());
        m.d2t.assign(d->as<int64_t>(), d->as<int64_t>() + c.draft_vocab);
    } else {
        OSPREY_CHECK(c.draft_vocab == c.vocab, "EAGLE-3 head: a reduced draft vocabulary needs d2t");
        m.d2t.assign(size_t(c.draft_vocab), 0);
    }
    for (int i = 0; i < c.draft_vocab; ++i) {
        const int64_t t = i + m.d2t[size_t(i)];
        OSPREY_CHECK(t >= 0 && t < c.vocab, "EAGLE-3 head: d2t maps draft id ", i, " to ", t, ", outside the vocabulary");
    }
    const int half = c.head_dim / 2;
    m.inv_freq.resize(size_t(half));
    for (int i = 0; i < half; ++i)
        m.inv_freq[size_t(i)] = float(std::pow(double(c.rope_theta), -2.0 * i / double(c.head_dim)));
}

Eagle3Head::~Eagle3Head() = default;

void Eagle3Head::project(std::span<const float> aux, int n, std::vector<float>& g) const {
    const Eagle3Config& c = config_;
    OSPREY_CHECK(aux.size() == size_t(n) * 3 * size_t(c.target_hidden), "EAGLE-3 project: ", aux.size(),
                 " values for ", n, " rows of 3 x ", c.target_hidden);
    g.resize(size_t(n) * c.hidden);
    cpu::matmul_bf16w(g, aux, impl_->fc, {}, n, 3 * c.target_hidden, c.hidden);
}

void Eagle3Head::step(Eagle3Cache& cache, std::span<const int32_t> next, std::span<const float> g,
                      std::vector<float>& out, std::vector<int32_t>& predicted) const {
    const Eagle3Config& c = config_;
    const Impl& m = *impl_;
    const int n = int(next.size()), H = c.hidden, D = c.head_dim, half = D / 2;
    const int Q = c.n_heads * D, K = c.n_kv_heads * D, group = c.n_heads / c.n_kv_heads;
    OSPREY_CHECK(g.size() == size_t(n) * H, "EAGLE-3 step: hidden of ", g.size(), " values for ", n, " rows");
    // x2 = [rmsnorm(embed(next)) · input_norm, rmsnorm(g) · hidden_norm]    [n, 2H]
    std::vector<float> emb(size_t(n) * H), en(emb.size()), gn(emb.size()), x2(size_t(n) * 2 * H);
    for (int r = 0; r < n; ++r) {
        OSPREY_CHECK(next[size_t(r)] >= 0 && next[size_t(r)] < c.vocab, "EAGLE-3 step: token ", next[size_t(r)]);
        const bf16* row = m.embedding.data() + size_t(next[size_t(r)]) * H;
        for (int j = 0; j < H; ++j) emb[size_t(r) * H + j] = bf16_to_float(row[j]);
    }
    cpu::rmsnorm(en, emb, m.input_norm, n, H, c.eps);
    cpu::rmsnorm(gn, g, m.hidden_norm, n, H, c.eps);
    for (int r = 0; r < n; ++r) {
        std::copy_n(en.begin() + ptrdiff_t(r) * H, H, x2.begin() + ptrdiff_t(r) * 2 * H);
        std::copy_n(gn.begin() + ptrdiff_t(r) * H, H, x2.begin() + ptrdiff_t(r) * 2 * H + H);
    }
    std::vector<float> q(size_t(n) * Q), k(size_t(n) * K), v(size_t(n) * K);
    cpu::matmul_bf16w(q, x2, m.q, {}, n, 2 * H, Q);
    cpu::matmul_bf16w(k, x2, m.k, {}, n, 2 * H, K);
    cpu::matmul_bf16w(v, x2, m.v, {}, n, 2 * H, K);
    // Llama RoPE (rotate-half pairs d, d + D/2) at each row's position
    auto rope = [&](float* x, int heads, int pos) {
        for (int h = 0; h < heads; ++h)
            for (int d = 0; d < half; ++d) {
                const double a = double(pos) * m.inv_freq[size_t(d)];
                const float cs = float(std::cos(a)), sn = float(std::sin(a));
                float& x0 = x[h * D + d];
                float& x1 = x[h * D + d + half];
                const float y0 = x0 * cs - x1 * sn, y1 = x1 * cs + x0 * sn;
                x0 = y0;
                x1 = y1;
            }
    };
    const int pos0 = cache.end();
    for (int r = 0; r < n; ++r) {
        rope(q.data() + size_t(r) * Q, c.n_heads, pos0 + r);
        rope(k.data() + size_t(r) * K, c.n_kv_heads, pos0 + r);
    }
    cache.k.insert(cache.k.end(), k.begin(), k.end());
    cache.v.insert(cache.v.end(), v.begin(), v.end());
    cache.n += n;
    // causal attention over the cache (which now includes these rows)
    std::vector<float> attn(size_t(n) * Q, 0.0f), scores;
    const float scale = 1.0f / std::sqrt(float(D));
    for (int r = 0; r < n; ++r) {
        const int n_keys = cache.n - n + r + 1;
        scores.resize(size_t(n_keys));
        for (int h = 0; h < c.n_heads; ++h) {
            const int kh = h / group;
            const float* qv = q.data() + size_t(r) * Q + size_t(h) * D;
            float mx = -INFINITY;
            for (int j = 0; j < n_keys; ++j) {
                const float* kv = cache.k.data() + size_t(j) * K + size_t(kh) * D;
                float s = 0;
                for (int d = 0; d < D; ++d) s += qv[d] * kv[d];
                scores[size_t(j)] = s * scale;
                mx = std::max(mx, scores[size_t(j)]);
            }
            double sum = 0;
            for (float& s : scores) sum += (s = std::exp(s - mx));
            float* o = attn.data() + size_t(r) * Q + size_t(h) * D;
            for (int j = 0; j < n_keys; ++j) {
                const float w = float(scores[size_t(j)] / sum);
                const float* vv = cache.v.data() + size_t(j) * K + size_t(kh) * D;
                for (int d = 0; d < D; ++d) o[d] += w * vv[d];
            }
        }
    }
    // h = g + attn · Woᵀ; out = h + down(silu(gate(hn)) · up(hn)), hn = rmsnorm(h) · post_norm
    std::vector<float> proj(size_t(n) * H), hn(proj.size());
    cpu::matmul_bf16w(proj, attn, m.o, {}, n, Q, H);
    out.assign(g.begin(), g.end());
    for (size_t i = 0; i < out.size(); ++i) out[i] += proj[i];
    cpu::rmsnorm(hn, out, m.post_norm, n, H, c.eps);
    const int I = c.intermediate;
    std::vector<float> gate(size_t(n) * I), up(gate.size()), down(size_t(n) * H);
    cpu::matmul_bf16w(gate, hn, m.gate, {}, n, H, I);
    cpu::matmul_bf16w(up, hn, m.up, {}, n, H, I);
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    cpu::matmul_bf16w(down, gate, m.down, {}, n, I, H);
    for (size_t i = 0; i < out.size(); ++i) out[i] += down[i];
    // logits = rmsnorm(out) · lm_headᵀ over the draft vocabulary; argmax -> target id
    std::vector<float> fn(out.size()), logits(size_t(n) * c.draft_vocab);
    cpu::rmsnorm(fn, out, m.final_norm, n, H, c.eps);
    cpu::matmul_bf16w(logits, fn, m.lm_head, {}, n, H, c.draft_vocab);
    predicted.resize(size_t(n));
    for (int r = 0; r < n; ++r) {
        const float* l = logits.data() + size_t(r) * c.draft_vocab;
        const int best = int(std::max_element(l, l + c.draft_vocab) - l);
        predicted[size_t(r)] = int32_t(best + m.d2t[size_t(best)]);
    }
}

}  // namespace osprey::model
