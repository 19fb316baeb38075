#include "model/gpt_oss_ref.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/bf16.h"
#include "core/check.h"
#include "kernels/cpu/add.h"
#include "core/fp8.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/fp8_matmul.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/mxfp4_matmul.h"
#include "kernels/cpu/w4a8_matmul.h"
#include "kernels/cpu/w8a8_matmul.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/routing.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cpu/swiglu.h"
#include "model/batch_check.h"
#include "model/prompt_scores.h"

namespace osprey::model {

namespace {

constexpr size_t kDefaultKvBudget = size_t(2) << 30;  // 2 GiB of host memory

std::span<const bf16> bf16_view(const TensorView& t) {
    OSPREY_CHECK(t.dtype == DType::bf16, t.name, ": expected bf16, got ", t.describe());
    return {t.as<bf16>(), size_t(t.numel())};
}

std::span<const uint8_t> u8_view(const TensorView& t) {
    OSPREY_CHECK(t.dtype == DType::u8, t.name, ": expected u8, got ", t.describe());
    return {t.as<uint8_t>(), size_t(t.numel())};
}

// A small tensor (gain, bias, sinks) widened to FP32; BF16 and F32 are accepted.
std::vector<float> to_floats(const TensorView& t) {
    std::vector<float> out(size_t(t.numel()));  // [numel]
    if (t.dtype == DType::f32) {
        std::copy_n(t.as<float>(), out.size(), out.begin());
    } else {
        OSPREY_CHECK(t.dtype == DType::bf16, t.name, ": expected bf16 or f32, got ", t.describe());
        for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(t.as<bf16>()[i]);
    }
    return out;
}

// Matrix `mat` of an FP8 weight (or stack [n_mats, rows, cols]) as a kernel window starting at
// (row0, col0); the block multipliers stay those of the whole matrix.
cpu::Fp8Matrix fp8_window(const TensorView& w, const TensorView& scale, size_t mat, size_t row0, size_t col0) {
    OSPREY_CHECK(w.dtype == DType::fp8_e4m3 && scale.dtype == DType::f32, w.name,
                 ": expected fp8 with f32 scales, got ", w.describe(), " and ", scale.describe());
    const int64_t rows = w.shape[w.shape.size() - 2], cols = w.shape.back();
    return {.data = w.as<uint8_t>() + int64_t(mat) * rows * cols,
            .scale_inv = scale.as<float>() + int64_t(mat) * fp8::n_blocks(rows) * fp8::n_blocks(cols),
            .ld = cols,
            .row0 = int64_t(row0),
            .col0 = int64_t(col0)};
}

// FP8 KV rows (kv_spec.h): each (token, KV head) of x [T, heads · head_dim] becomes head_dim E4M3
// codes and one multiplier amax / 448; x is replaced by the decoded values (what the cache holds).
void quantize_kv_rows(std::vector<float>& x, std::vector<uint8_t>& codes, std::vector<float>& scales, int T,
                      int heads, int head_dim) {
    const auto& table = fp8::e4m3_table();
    codes.resize(x.size());
    scales.resize(size_t(T) * heads);
    for (size_t th = 0; th < scales.size(); ++th) {
        float* v = x.data() + th * head_dim;  // [head_dim]
        float amax = 0.0f;
        for (int c = 0; c < head_dim; ++c) amax = std::fmax(amax, std::fabs(v[c]));
        const float s = fp8::block_scale_inv(amax);
        scales[th] = s;
        for (int c = 0; c < head_dim; ++c) {
            codes[th * head_dim + c] = fp8::quantize(v[c], s);
            v[c] = table[codes[th * head_dim + c]] * s;
        }
    }
}

size_t kv_budget_from_env() {
    const char* env = std::getenv("OSPREY_CPU_KV_BYTES");
    if (!env || !*env) return kDefaultKvBudget;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(env, &end, 10);
    OSPREY_CHECK(end && *end == '\0' && v > 0, "OSPREY_CPU_KV_BYTES must be a positive byte count, got '", env, "'");
    return size_t(v);
}

}  // namespace

// Per-token bookkeeping of one forward.
struct CpuReference::Step {
    const ForwardBatch* batch = nullptr;
    int n_tokens = 0;
    std::vector<int32_t> positions;   // [n_tokens]
    std::vector<int32_t> logit_rows;  // [n_logit_rows] tokens whose logits are wanted, in slice order
};

CpuReference::CpuReference(Weights weights, CpuReferenceOptions options)
    : weights_(std::move(weights)), config_(weights_.config), rope_(config_) {
    config_.validate();
    OSPREY_CHECK(int(weights_.layers.size()) == config_.n_layers, "cpu-reference: ", weights_.layers.size(),
                 " layers of weights for a config of ", config_.n_layers);
    if (options.n_threads > 0) own_pool_ = std::make_unique<ThreadPool>(options.n_threads);
    pool_ = own_pool_ ? own_pool_.get() : &ThreadPool::global();
    kv_budget_ = options.kv_budget_bytes > 0 ? options.kv_budget_bytes : kv_budget_from_env();
    OSPREY_CHECK(options.kv_dtype == KvDtype::f32 || options.kv_dtype == KvDtype::fp8_e4m3,
                 "cpu-reference: the KV cache is f32 or fp8, not ", kv_dtype_name(options.kv_dtype));
    kv_dtype_ = options.kv_dtype;
    moe_w4a8_ = options.moe_w4a8;
    moe_w8a8_ = options.moe_w8a8;
    piece_ = ModelShard::whole(config_);
    if (options.shard) {
        piece_ = options.shard->piece;
        attn_comm_ = options.shard->attn;
        moe_comm_ = options.shard->moe;
        vocab_comm_ = options.shard->vocab;
        if (options.shard->dp && options.shard->dp->size() > 1) dp_comm_ = options.shard->dp;
    }
    const Config& c = config_;
    OSPREY_CHECK(piece_.kv_heads.count > 0 && piece_.kv_heads.end() <= c.n_kv_heads &&
                     piece_.heads.first == piece_.kv_heads.first * c.group() &&
                     piece_.heads.count == piece_.kv_heads.count * c.group() && piece_.experts.count > 0 &&
                     piece_.experts.end() <= c.n_experts && piece_.ff.first % 32 == 0 && piece_.ff.count % 32 == 0 &&
                     piece_.ff.end() <= c.d_ff && piece_.vocab.count > 0 && piece_.vocab.end() <= c.vocab_size,
                 "cpu-reference: bad model shard (kv heads ", piece_.kv_heads.first, "+", piece_.kv_heads.count,
                 ", experts ", piece_.experts.first, "+", piece_.experts.count, ", ff ", piece_.ff.first, "+",
                 piece_.ff.count, ", vocab ", piece_.vocab.first, "+", piece_.vocab.count, ")");
    q_local_ = piece_.heads.count * c.head_dim;
    kv_local_ = piece_.kv_heads.count * c.head_dim;

    bf16_view(weights_.embedding);
    // This rank's vocabulary rows of the unembedding [V, d_model] (BF16 rows, or an FP8 window).
    const size_t d = size_t(c.d_model), v0 = size_t(piece_.vocab.first), nv = size_t(piece_.vocab.count);
    if (weights_.unembedding.dtype == DType::fp8_e4m3)
        unembedding_ = Linear::of_fp8(fp8_window(weights_.unembedding, weights_.unembedding_scale, 0, v0, 0));
    else
        unembedding_ = Linear::of_bf16(bf16_view(weights_.unembedding).subspan(v0 * d, nv * d));
    final_norm_ = to_floats(weights_.final_norm);
    vectors_.resize(c.n_layers);
    slices_.resize(c.n_layers);
    for (int i = 0; i < c.n_layers; ++i) slice_layer(i);
    kv_.resize(c.n_layers);
}

// Cuts this rank's piece of layer `layer` out of the checkpoint (spec shapes in weights.h). The
// whole model's piece is the checkpoint's views themselves.
void CpuReference::slice_layer(int layer) {
    const Config& c = config_;
    const LayerWeights& w = weights_.layers[layer];
    bf16_view(w.router_w);
    const size_t H = size_t(c.d_model), hd = size_t(c.head_dim), I = size_t(c.d_ff), Q = size_t(c.q_dim());
    const size_t h0 = size_t(piece_.heads.first) * hd, kv0 = size_t(piece_.kv_heads.first) * hd;
    const size_t e0 = size_t(piece_.experts.first), ne = size_t(piece_.experts.count);
    const size_t f0 = size_t(piece_.ff.first), nf = size_t(piece_.ff.count);
    // Rows [first, first + n) of a BF16 or FP8 [rows, H] weight.
    auto rows_of = [&](const TensorView& t, const TensorView& scale, size_t first, size_t n) -> Linear {
        if (t.dtype == DType::fp8_e4m3) return Linear::of_fp8(fp8_window(t, scale, 0, first, 0));
        return Linear::of_bf16(bf16_view(t).subspan(first * H, n * H));
    };
    auto part = [](const std::vector<float>& v, size_t first, size_t n) {
        return std::vector<float>(v.begin() + ptrdiff_t(first), v.begin() + ptrdiff_t(first + n));
    };

    LayerVectors& v = vectors_[layer];
    v.attn_norm = to_floats(w.attn_norm);
    v.q_b = part(to_floats(w.q_b), h0, size_t(q_local_));
    v.k_b = part(to_floats(w.k_b), kv0, size_t(kv_local_));
    v.v_b = part(to_floats(w.v_b), kv0, size_t(kv_local_));
    v.sinks = part(to_floats(w.sinks), size_t(piece_.heads.first), size_t(piece_.heads.count));
    // The out-projection and down-projection biases are added by one rank of each sum, so the
    // reduced result holds them once.
    if (piece_.out_bias) v.out_b = to_floats(w.out_b);
    v.mlp_norm = to_floats(w.mlp_norm);
    v.router_b = to_floats(w.router_b);
    const std::vector<float> mlp1_bias = to_floats(w.mlp1_bias);  // [E, 2I] gate/up interleaved
    v.mlp1_bias.clear();
    for (size_t e = e0; e < e0 + ne; ++e)
        v.mlp1_bias.insert(v.mlp1_bias.end(), mlp1_bias.begin() + ptrdiff_t(e * 2 * I + 2 * f0),
                           mlp1_bias.begin() + ptrdiff_t(e * 2 * I + 2 * (f0 + nf)));
    v.mlp2_bias.clear();
    if (piece_.down_bias) v.mlp2_bias = part(to_floats(w.mlp2_bias), e0 * H, ne * H);

    LayerSlices& sl = slices_[layer];
    sl.q_w = rows_of(w.q_w, w.q_scale, h0, size_t(q_local_));
    sl.k_w = rows_of(w.k_w, w.k_scale, kv0, size_t(kv_local_));
    sl.v_w = rows_of(w.v_w, w.v_scale, kv0, size_t(kv_local_));
    if (w.out_w.dtype == DType::fp8_e4m3) {  // [H, Q]: columns [h0, h0 + q_local) read in place
        sl.out_w = Linear::of_fp8(fp8_window(w.out_w, w.out_scale, 0, 0, h0));
    } else {
        const std::span<const bf16> out_w = bf16_view(w.out_w);  // [H, Q]
        if (size_t(q_local_) == Q) {
            sl.out_w = Linear::of_bf16(out_w);
        } else {  // columns [h0, h0 + q_local) of every row
            sl.out_w_owned.resize(H * size_t(q_local_));
            for (size_t r = 0; r < H; ++r)
                std::copy_n(out_w.begin() + ptrdiff_t(r * Q + h0), q_local_,
                            sl.out_w_owned.begin() + ptrdiff_t(r * q_local_));
            sl.out_w = Linear::of_bf16(sl.out_w_owned);
        }
    }
    sl.mlp1.clear();
    sl.mlp2.clear();
    const WeightFormat experts = w.experts_format();
    if (experts != WeightFormat::mxfp4) {
        // Expert matrices [E, 2I, H] and [E, H, I]: mlp1 rows [2 f0, 2 (f0 + nf)) and mlp2 columns
        // [f0, f0 + nf) of each local expert; FP8 windows in place, BF16 mlp2 columns copied when cut.
        for (size_t e = e0; e < e0 + ne; ++e) {
            if (experts == WeightFormat::fp8) {
                sl.mlp1.push_back(Linear::of_fp8(fp8_window(w.mlp1_w, w.mlp1_scale, e, 2 * f0, 0)));
                sl.mlp2.push_back(Linear::of_fp8(fp8_window(w.mlp2_w, w.mlp2_scale, e, 0, f0)));
                continue;
            }
            const std::span<const bf16> m1 = bf16_view(w.mlp1_w), m2 = bf16_view(w.mlp2_w);
            sl.mlp1.push_back(Linear::of_bf16(m1.subspan((e * 2 * I + 2 * f0) * H, 2 * nf * H)));
            if (nf == I) {
                sl.mlp2.push_back(Linear::of_bf16(m2.subspan(e * H * I, H * I)));
            } else {
                sl.mlp2_bf16_owned.emplace_back(H * nf);
                for (size_t r = 0; r < H; ++r)
                    std::copy_n(m2.begin() + ptrdiff_t((e * H + r) * I + f0), nf,
                                sl.mlp2_bf16_owned.back().begin() + ptrdiff_t(r * nf));
                sl.mlp2.push_back(Linear::of_bf16(sl.mlp2_bf16_owned.back()));
            }
        }
        return;
    }

    // mlp1 [E, 2I, H/32, 16]: columns [f0, f0 + nf) are rows [2 f0, 2 (f0 + nf)) (gate/up pairs), contiguous.
    const std::span<const uint8_t> b1 = u8_view(w.mlp1_blocks), s1 = u8_view(w.mlp1_scales);
    const std::span<const uint8_t> b2 = u8_view(w.mlp2_blocks), s2 = u8_view(w.mlp2_scales);
    const size_t row1_bytes = H / 2, row1_scales = H / 32;  // one mlp1 row
    for (size_t e = e0; e < e0 + ne; ++e)
        sl.mlp1.push_back(Linear::of_mxfp4(b1.subspan((e * 2 * I + 2 * f0) * row1_bytes, 2 * nf * row1_bytes),
                                            s1.subspan((e * 2 * I + 2 * f0) * row1_scales, 2 * nf * row1_scales)));
    // mlp2 [E, H, I/32, 16]: the input groups [f0/32, (f0 + nf)/32) of every row; a copy unless whole.
    const size_t g_all = I / 32, g0 = f0 / 32, ng = nf / 32;
    if (ng == g_all) {
        for (size_t e = e0; e < e0 + ne; ++e)
            sl.mlp2.push_back(Linear::of_mxfp4(b2.subspan(e * H * g_all * 16, H * g_all * 16),
                                                s2.subspan(e * H * g_all, H * g_all)));
        return;
    }
    const size_t blocks_per_expert = H * ng * 16, scales_per_expert = H * ng;
    sl.mlp2_owned.resize(ne * (blocks_per_expert + scales_per_expert));
    for (size_t le = 0; le < ne; ++le) {
        uint8_t* blocks = sl.mlp2_owned.data() + le * blocks_per_expert;
        uint8_t* scales = sl.mlp2_owned.data() + ne * blocks_per_expert + le * scales_per_expert;
        for (size_t r = 0; r < H; ++r) {
            const size_t row = (e0 + le) * H + r;
            std::copy_n(b2.begin() + ptrdiff_t((row * g_all + g0) * 16), ng * 16, blocks + r * ng * 16);
            std::copy_n(s2.begin() + ptrdiff_t(row * g_all + g0), ng, scales + r * ng);
        }
        sl.mlp2.push_back(Linear::of_mxfp4({blocks, blocks_per_expert}, {scales, scales_per_expert}));
    }
}

// y = x · Wᵀ + b with W in whichever form this weight is stored (spec §3: W is [out, in]).
void CpuReference::linear(std::span<float> y, std::span<const float> x, const Linear& w, std::span<const float> bias,
                          int n_rows, int n_in, int n_out) {
    if (!w.fp8.empty())
        cpu::fp8_matmul(y, x, w.fp8, bias, n_rows, n_in, n_out, *pool_);
    else if (!w.blocks.empty() && moe_w4a8_)
        cpu::w4a8::mxfp4_matmul(y, x, w.blocks, w.scales, bias, n_rows, n_in, n_out, *pool_);
    else if (!w.blocks.empty())
        cpu::mxfp4_matmul(y, x, w.blocks, w.scales, bias, n_rows, n_in, n_out, *pool_);
    else
        cpu::matmul_bf16w(y, x, w.dense, bias, n_rows, n_in, n_out, *pool_);
}

void CpuReference::expert_linear(std::span<float> y, std::span<const float> x, const Linear& w,
                                 std::span<const float> bias, int n_rows, int n_in, int n_out) {
    if (moe_w8a8_ && !w.fp8.empty())
        cpu::w8a8::fp8_matmul(y, x, w.fp8, bias, n_rows, n_in, n_out, *pool_);
    else
        linear(y, x, w, bias, n_rows, n_in, n_out);
}

KvSpec CpuReference::kv_spec(int page_size) const {
    return KvSpec(config_, kv_dtype(), page_size, config_.n_kv_heads / piece_.kv_heads.count);
}

void CpuReference::allocate_kv(const KvLayout& layout) {
    layout.check("cpu-reference");
    OSPREY_CHECK(layout.spec.dtype() == kv_dtype() && layout.spec.n_layers() == config_.n_layers &&
                     layout.spec.kv_dim() == kv_local_,
                 "cpu-reference: KV spec for ", layout.spec.n_layers(), " layers of ",
                 kv_dtype_name(layout.spec.dtype()), " rows of ", layout.spec.kv_dim(), ", this backend keeps ",
                 config_.n_layers, " layers of ", kv_dtype_name(kv_dtype()), " rows of ", kv_local_, " (kv_spec())");
    OSPREY_CHECK(layout.bytes() <= kv_budget_, "cpu-reference: KV layout needs ", layout.bytes(), " bytes, budget is ",
                 kv_budget_, " (OSPREY_CPU_KV_BYTES)");
    layout_ = layout;
    const size_t kv_dim = size_t(kv_local_);
    for (int i = 0; i < config_.n_layers; ++i) {
        const size_t rows = size_t(layout.rows(layout.spec.kind_of(i)));
        LayerKv& kv = kv_[i];
        if (kv_dtype_ == KvDtype::fp8_e4m3) {
            const size_t heads = size_t(piece_.kv_heads.count);
            kv.k8.assign(rows * kv_dim, 0);
            kv.v8.assign(rows * kv_dim, 0);
            kv.k_scale.assign(rows * heads, 0.0f);
            kv.v_scale.assign(rows * heads, 0.0f);
        } else {
            kv.k.assign(rows * kv_dim, 0.0f);
            kv.v.assign(rows * kv_dim, 0.0f);
        }
    }
}

void CpuReference::copy_kv(const KvCopyPlan& plan) {
    check_kv_copy_plan(plan, layout_);
    const size_t kv_dim = size_t(kv_local_);
    for (const KvRowRun& r : plan.runs)
        for (int layer : layout_.spec.group(r.group).layers)
            if (kv_dtype_ == KvDtype::fp8_e4m3) {
                const size_t heads = size_t(piece_.kv_heads.count);
                for (std::vector<uint8_t>* cache : {&kv_[layer].k8, &kv_[layer].v8})
                    std::copy_n(cache->data() + size_t(r.src) * kv_dim, size_t(r.n) * kv_dim,
                                cache->data() + size_t(r.dst) * kv_dim);
                for (std::vector<float>* scale : {&kv_[layer].k_scale, &kv_[layer].v_scale})
                    std::copy_n(scale->data() + size_t(r.src) * heads, size_t(r.n) * heads,
                                scale->data() + size_t(r.dst) * heads);
            } else {
                for (std::vector<float>* cache : {&kv_[layer].k, &kv_[layer].v})
                    std::copy_n(cache->data() + size_t(r.src) * kv_dim, size_t(r.n) * kv_dim,
                                cache->data() + size_t(r.dst) * kv_dim);
            }
}

void CpuReference::check_batch(const ForwardBatch& batch) const {
    check_forward_batch(batch, config_, layout_);
}

void CpuReference::dump(std::string_view name, int layer, std::span<const float> values) const {
    if (dump_) dump_(name, layer, values);
}

void CpuReference::forward(const ForwardBatch& batch) {
    if (!dp_comm_ || !batch.slices.empty()) check_batch(batch);  // DP: an idle group runs an empty step
    if (dp_comm_) {
        // Tokens per DP group, for the MoE's gather: every rank of a group sends the same count.
        const int32_t mine = batch.n_tokens();
        std::vector<int32_t> counts(size_t(dp_comm_->size()));
        dp_comm_->all_gather<int32_t>(std::span(&mine, 1), counts);
        dp_tokens_.assign(counts.begin(), counts.end());
        dp_first_ = 0;
        for (int g = 0; g < dp_comm_->rank(); ++g) dp_first_ += dp_tokens_[size_t(g)];
    }
    const Config& c = config_;
    Step step;
    step.batch = &batch;
    step.n_tokens = batch.n_tokens();
    int max_pos = 0;
    for (const SequenceSlice& sl : batch.slices) {
        for (int i = 0; i < sl.n_tokens; ++i) step.positions.push_back(sl.start_pos + i);
        for (int i = 0; i < sl.logit_rows(); ++i) step.logit_rows.push_back(sl.first_logit_token() + i);
        max_pos = std::max(max_pos, sl.start_pos + sl.n_tokens);
    }
    rope_.reserve(max_pos);
    const size_t T = size_t(step.n_tokens);
    x_.resize(T * c.d_model);
    xn_.resize(T * c.d_model);
    q_.resize(T * q_local_);
    k_.resize(T * kv_local_);
    v_.resize(T * kv_local_);
    attn_.resize(T * q_local_);
    proj_.resize(T * c.d_model);
    router_.resize(T * c.n_experts);
    moe_.resize(T * c.d_model);
    expert_ids_.resize(T * c.top_k);
    expert_weights_.resize(T * c.top_k);

    // x = embedding rows of the tokens                                  [T, d_model]
    const std::span<const bf16> embedding = bf16_view(weights_.embedding);
    for (size_t t = 0; t < T; ++t)
        for (int j = 0; j < c.d_model; ++j)
            x_[t * c.d_model + j] = bf16_to_float(embedding[size_t(batch.tokens[t]) * c.d_model + j]);
    dump("embedding", -1, x_);

    const size_t n_cap = capture_layers_.size();
    captured_.assign(T * n_cap * c.d_model, 0.0f);
    for (int layer = 0; layer < c.n_layers; ++layer) {
        attention_block(layer, step);
        moe_block(layer, step);
        // EAGLE-3: the residual stream after this block, for every token
        for (size_t j = 0; j < n_cap; ++j)
            if (capture_layers_[j] == layer)
                for (size_t t = 0; t < T; ++t)
                    std::copy_n(x_.begin() + ptrdiff_t(t * c.d_model), c.d_model,
                                captured_.begin() + ptrdiff_t((t * n_cap + j) * c.d_model));
    }
    unembed(step);
    score_prompt(step);
}

void CpuReference::set_capture_layers(std::span<const int> layers) {
    for (int l : layers)
        OSPREY_CHECK(l >= 0 && l < config_.n_layers, "cpu-reference: capture layer ", l, " outside [0, ",
                     config_.n_layers, ")");
    capture_layers_.assign(layers.begin(), layers.end());
    captured_.clear();
}

// One attention block (spec §3.3): x += Wout · attend(rope(Wqkv · rmsnorm(x))) + b. A tensor-parallel
// rank computes its heads only; the out-projection's partial sums are all-reduced over its TP group.
void CpuReference::attention_block(int layer, const Step& step) {
    const Config& c = config_;
    const LayerSlices& w = slices_[layer];
    const LayerVectors& lv = vectors_[layer];
    const int T = step.n_tokens;
    const int QL = q_local_, KL = kv_local_;  // this rank's widths (the whole q_dim, kv_dim unsharded)
    const int n_heads = piece_.heads.count, n_kv_heads = piece_.kv_heads.count;

    // xn = rmsnorm(x) · gain                                            [T, d_model]
    cpu::rmsnorm(xn_, x_, lv.attn_norm, T, c.d_model, c.norm_eps, *pool_);
    dump("attn_norm", layer, xn_);
    // q, k, v = xn · Wᵀ + b                                             [T, QL], [T, KL] x2
    linear(q_, xn_, w.q_w, lv.q_b, T, c.d_model, QL);
    linear(k_, xn_, w.k_w, lv.k_b, T, c.d_model, KL);
    linear(v_, xn_, w.v_w, lv.v_b, T, c.d_model, KL);
    // YaRN RoPE on every q and k head (half-split pairs, concentration in cos/sin)
    cpu::rope(q_, step.positions, n_heads, c.head_dim, rope_.cos(), rope_.sin());
    cpu::rope(k_, step.positions, n_kv_heads, c.head_dim, rope_.cos(), rope_.sin());
    dump("q", layer, q_);
    dump("k", layer, k_);
    dump("v", layer, v_);
    // (FP8 KV cache: k and v rounded to what the cache will hold, so this step's queries see the
    // same keys and values as every later step)
    if (kv_dtype_ == KvDtype::fp8_e4m3) {
        quantize_kv_rows(k_, k8_, k_scale_, T, n_kv_heads, c.head_dim);
        quantize_kv_rows(v_, v8_, v_scale_, T, n_kv_heads, c.head_dim);
    }

    // attn = softmax-with-sink(q·kᵀ / sqrt(head_dim)) · v per sequence: earlier positions from the
    // cache (pages on full layers, the window ring on sliding ones), this step's from k_, v_.
    const bool sliding = layout_.spec.is_ring(layer);
    const LayerKv& cache = kv_[layer];
    for (const SequenceSlice& sl : step.batch->slices) {
        const size_t t0 = size_t(sl.first_token);
        const std::span<const int32_t> blocks =
            sliding ? std::span<const int32_t>(&sl.window_slot, 1) : std::span<const int32_t>(sl.pages);
        cpu::attention_sinks({.out = std::span(attn_).subspan(t0 * QL, size_t(sl.n_tokens) * QL),
                              .q = std::span<const float>(q_).subspan(t0 * QL, size_t(sl.n_tokens) * QL),
                              .positions = std::span(step.positions).subspan(t0, sl.n_tokens),
                              .sinks = lv.sinks,
                              .kv = {.cache_k = cache.k.empty() ? nullptr : cache.k.data(),
                                     .cache_v = cache.v.empty() ? nullptr : cache.v.data(),
                                     .cache_k8 = cache.k8.empty() ? nullptr : cache.k8.data(),
                                     .cache_v8 = cache.v8.empty() ? nullptr : cache.v8.data(),
                                     .cache_k_scale = cache.k_scale.empty() ? nullptr : cache.k_scale.data(),
                                     .cache_v_scale = cache.v_scale.empty() ? nullptr : cache.v_scale.data(),
                                     .blocks = blocks,
                                     .block_rows = layout_.spec.group(layout_.spec.kind_of(layer)).rows_per_block,
                                     .ring = sliding,
                                     .n_cached = sl.start_pos,
                                     .first_cached = sliding ? sl.window_first : 0,
                                     .fresh_k = k_.data() + t0 * KL,
                                     .fresh_v = v_.data() + t0 * KL,
                                     .fresh_stride = KL,
                                     .n_fresh = sl.n_tokens},
                              .n_heads = n_heads,
                              .n_kv_heads = n_kv_heads,
                              .head_dim = c.head_dim,
                              .window = sliding ? c.sliding_window : 0,
                              .scale = 1.0f / std::sqrt(float(c.head_dim))},
                             *pool_);
    }
    dump("attn", layer, attn_);
    // append this step's k, v to the cache
    store_kv(layer, step);

    // x += attn · Woutᵀ + b                                             [T, d_model]
    // (TP: each rank's heads give a partial sum, the bias on one rank; summed over the TP group)
    linear(proj_, attn_, w.out_w, lv.out_b, T, QL, c.d_model);
    if (attn_comm_) attn_comm_->all_reduce_sum(proj_);
    dump("attn_out", layer, proj_);
    cpu::add(x_, proj_);
    dump("resid_attn", layer, x_);
}

// Writes the step's K/V rows: full layers into the sequence's pages (except rows already cached),
// sliding layers into the sequence's ring at row p % sliding_window (only the last window rows survive).
void CpuReference::store_kv(int layer, const Step& step) {
    const size_t kv_dim = size_t(kv_local_);
    LayerKv& cache = kv_[layer];
    const bool sliding = layout_.spec.is_ring(layer);
    const int rows = layout_.spec.group(layout_.spec.kind_of(layer)).rows_per_block;
    for (const SequenceSlice& sl : step.batch->slices) {
        const int first = sliding ? std::max(0, sl.n_tokens - rows) : sl.n_full_kv_cached;
        for (int i = first; i < sl.n_tokens; ++i) {
            const int p = sl.start_pos + i;
            const size_t block = size_t(sliding ? sl.window_slot : sl.pages[p / rows]);
            const size_t row = block * rows + size_t(p % rows);
            const size_t t = size_t(sl.first_token + i);
            if (kv_dtype_ == KvDtype::fp8_e4m3) {
                const size_t heads = size_t(piece_.kv_heads.count);
                std::copy_n(k8_.begin() + t * kv_dim, kv_dim, cache.k8.begin() + row * kv_dim);
                std::copy_n(v8_.begin() + t * kv_dim, kv_dim, cache.v8.begin() + row * kv_dim);
                std::copy_n(k_scale_.begin() + t * heads, heads, cache.k_scale.begin() + row * heads);
                std::copy_n(v_scale_.begin() + t * heads, heads, cache.v_scale.begin() + row * heads);
                continue;
            }
            std::copy_n(k_.begin() + t * kv_dim, kv_dim, cache.k.begin() + row * kv_dim);
            std::copy_n(v_.begin() + t * kv_dim, kv_dim, cache.v.begin() + row * kv_dim);
        }
    }
}

// One mixture-of-experts block (spec §3.6): x += Σ_top4 w_e · expert_e(rmsnorm(x)). Every rank routes
// every token (the router is replicated); a rank applies its experts' columns only, and the partial
// outputs are all-reduced over the MoE group (TP-style dispatch and combine).
void CpuReference::moe_block(int layer, const Step& step) {
    const Config& c = config_;
    const LayerSlices& w = slices_[layer];
    const LayerVectors& lv = vectors_[layer];
    const int H = c.d_model, I = piece_.ff.count, k = c.top_k;  // I: this rank's intermediate columns

    // xn = rmsnorm(x) · gain                                            [T, d_model]
    cpu::rmsnorm(xn_, x_, lv.mlp_norm, step.n_tokens, H, c.norm_eps, *pool_);
    dump("mlp_norm", layer, xn_);
    // (attention DP: the tokens of every DP group, gathered in group order; T counts them all)
    std::vector<float>& xn = dp_comm_ ? xn_all_ : xn_;     // [T, d_model]
    std::vector<float>& moe = dp_comm_ ? moe_all_ : moe_;  // [T, d_model]
    int T = step.n_tokens;
    if (dp_comm_) {
        std::vector<size_t> counts(dp_tokens_.size());
        size_t total = 0;
        for (size_t g = 0; g < counts.size(); ++g) total += dp_tokens_[g], counts[g] = dp_tokens_[g] * size_t(H);
        T = int(total);
        xn_all_.resize(total * H);
        moe_all_.resize(total * H);
        router_.resize(total * c.n_experts);
        expert_ids_.resize(total * k);
        expert_weights_.resize(total * k);
        dp_comm_->all_gather_v<float>(std::span<const float>(xn_).first(size_t(step.n_tokens) * H), xn_all_, counts);
    }
    // router logits = xn · Wgateᵀ + b                                   [T, n_experts]
    cpu::matmul_bf16w(router_, xn, bf16_view(weights_.layers[layer].router_w), lv.router_b, T, H, c.n_experts, *pool_);
    dump("router_logits", layer, router_);
    // top-4 experts on the raw logits, softmax over those four          [T, top_k]
    cpu::route_topk_softmax(expert_ids_, expert_weights_, router_, T, c.n_experts, k);

    // moe = Σ_e w_e · (W2_e · swiglu(W1_e · xn + b1_e) + b2_e), expert by expert over its tokens
    std::fill(moe.begin(), moe.end(), 0.0f);
    std::vector<int32_t> rows;             // [n] tokens routed to the expert
    std::vector<float> weights;            // [n] their routing weights
    std::vector<float> xe, gate_up, u, y;  // [n, d_model], [n, 2 I], [n, I], [n, d_model]
    const std::span<const float> no_bias;
    for (int le = 0; le < piece_.experts.count && I > 0; ++le) {
        const int e = piece_.experts.first + le;
        rows.clear();
        weights.clear();
        for (int t = 0; t < T; ++t)
            for (int i = 0; i < k; ++i)
                if (expert_ids_[size_t(t) * k + i] == e) {
                    rows.push_back(t);
                    weights.push_back(expert_weights_[size_t(t) * k + i]);
                }
        if (rows.empty()) continue;
        const int n = int(rows.size());
        xe.resize(size_t(n) * H);
        for (int r = 0; r < n; ++r) std::copy_n(xn.begin() + size_t(rows[r]) * H, H, xe.begin() + size_t(r) * H);
        gate_up.resize(size_t(n) * 2 * I);
        u.resize(size_t(n) * I);
        y.resize(size_t(n) * H);
        // gate_up = xe · W1_eᵀ + b1_e, rows interleaved gate/up          [n, 2 I]
        expert_linear(gate_up, xe, w.mlp1[size_t(le)],
                      std::span<const float>(lv.mlp1_bias).subspan(size_t(le) * 2 * I, size_t(2) * I), n, H, 2 * I);
        // u = clamped swiglu(gate, up)                                 [n, I]
        cpu::swiglu_clamped(u, gate_up, n, I, c.swiglu_alpha, c.swiglu_limit);
        // (W8A8: u rounded to BF16 before its quantisation, as the GPU's mlp1 stores it)
        if (moe_w8a8_ && !w.mlp2[size_t(le)].fp8.empty())
            for (float& v : u) v = bf16_to_float(float_to_bf16(v));
        // y = u · W2_eᵀ + b2_e                                           [n, d_model]
        expert_linear(y, u, w.mlp2[size_t(le)],
               lv.mlp2_bias.empty() ? no_bias : std::span<const float>(lv.mlp2_bias).subspan(size_t(le) * H, H), n, I,
               H);
        // moe[t] += w · y                                               (b2 inside the weighted sum)
        for (int r = 0; r < n; ++r)
            cpu::add_scaled(std::span(moe).subspan(size_t(rows[r]) * H, H),
                            std::span<const float>(y).subspan(size_t(r) * H, H), weights[r]);
    }
    // (EP/TP: the ranks' partial sums, each expert's b2 from one rank; summed over the MoE group)
    if (moe_comm_) moe_comm_->all_reduce_sum(moe);
    // (attention DP: this group keeps its own rows)
    if (dp_comm_) std::copy_n(moe_all_.begin() + ptrdiff_t(dp_first_ * H), size_t(step.n_tokens) * H, moe_.begin());
    dump("moe", layer, moe_);
    // x += moe
    cpu::add(x_, moe_);
    dump("resid_mlp", layer, x_);
}

// Final norm and unembedding (spec §3.7), for the last token (or last n_logits tokens) of each slice
// that wants logits. A rank
// of a parallel layout computes its vocabulary rows [piece_.vocab) only.
void CpuReference::unembed(const Step& step) {
    const Config& c = config_;
    const int n = int(step.logit_rows.size());
    const int V = piece_.vocab.count;
    n_logit_rows_ = n;
    logits_.resize(size_t(n) * V);
    if (n == 0) return;
    std::vector<float> rows(size_t(n) * c.d_model), normed(rows.size());  // [n, d_model] each
    for (int r = 0; r < n; ++r)
        std::copy_n(x_.begin() + size_t(step.logit_rows[r]) * c.d_model, c.d_model,
                    rows.begin() + size_t(r) * c.d_model);
    // xn = rmsnorm(x) · gain                                            [n, d_model]
    cpu::rmsnorm(normed, rows, final_norm_, n, c.d_model, c.norm_eps, *pool_);
    dump("final_norm", -1, normed);
    // logits = xn · Wunembᵀ (untied, no bias)                           [n, V]
    linear(logits_, normed, unembedding_, {}, n, c.d_model, V);
    dump("logits", -1, logits_);
}

bool CpuReference::supports_prompt_scoring() const {
    return piece_.vocab.first == 0 && piece_.vocab.count == config_.vocab_size;
}

void CpuReference::take_prompt_scores(std::vector<TokenScore>& out) {
    out = std::move(scores_);
    scores_.clear();
}

// Prompt scoring (model/prompt_scores.h): the final norm and unembedding of the scored positions,
// kScoreRows at a time (each a [rows, vocab] fp32 block), then log-softmax on the host.
void CpuReference::score_prompt(const Step& step) {
    scores_.clear();
    const std::vector<ScoredRow> rows = scored_rows(*step.batch, config_.vocab_size);
    if (rows.empty()) return;
    OSPREY_CHECK(supports_prompt_scoring(), "cpu-reference: prompt scoring needs the whole vocabulary on one rank");
    const Config& c = config_;
    const int V = c.vocab_size;
    constexpr size_t kScoreRows = 64;
    std::vector<float> x, normed, logits;
    for (size_t first = 0; first < rows.size(); first += kScoreRows) {
        const size_t n = std::min(kScoreRows, rows.size() - first);
        x.resize(n * c.d_model);
        normed.resize(x.size());
        logits.resize(n * size_t(V));
        for (size_t r = 0; r < n; ++r)
            std::copy_n(x_.begin() + size_t(rows[first + r].row) * c.d_model, c.d_model, x.begin() + r * c.d_model);
        // xn = rmsnorm(x) · gain; logits = xn · Wunembᵀ, as in unembed()   [n, d_model] -> [n, V]
        cpu::rmsnorm(normed, x, final_norm_, int(n), c.d_model, c.norm_eps, *pool_);
        linear(logits, normed, unembedding_, {}, int(n), c.d_model, V);
        score_logit_rows(logits, V, std::span(rows).subspan(first, n), scores_);
    }
}

void CpuReference::gather_logits(std::vector<float>& out) {
    const int V = config_.vocab_size, n = n_logit_rows_;
    if (!vocab_comm_ || vocab_comm_->size() == 1) {
        out = logits_;
        return;
    }
    // Each rank's [n, V_r] block, rank after rank, then interleaved back into rows of V.
    const int ranks = vocab_comm_->size();
    std::vector<size_t> counts(static_cast<size_t>(ranks));
    std::vector<ShardRange> ranges(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
        ranges[size_t(r)] = split_range(V, ranks, r);
        counts[size_t(r)] = size_t(n) * size_t(ranges[size_t(r)].count);
    }
    OSPREY_CHECK(ranges[size_t(vocab_comm_->rank())].first == piece_.vocab.first &&
                     ranges[size_t(vocab_comm_->rank())].count == piece_.vocab.count,
                 "cpu-reference: vocabulary shard does not match the vocab group's split");
    std::vector<float> blocks(size_t(n) * V);  // [ranks][n, V_r]
    vocab_comm_->all_gather_v<float>(logits_, blocks, counts);
    out.resize(size_t(n) * V);
    size_t offset = 0;
    for (int r = 0; r < ranks; ++r) {
        const ShardRange v = ranges[size_t(r)];
        for (int row = 0; row < n; ++row)
            std::copy_n(blocks.begin() + ptrdiff_t(offset + size_t(row) * v.count), v.count,
                        out.begin() + ptrdiff_t(size_t(row) * V + v.first));
        offset += counts[size_t(r)];
    }
}

void CpuReference::logits_to_host(std::vector<float>& out) {
    gather_logits(out);
}

// Greedy rows with nothing that needs the whole row on one rank (no bias, penalties or top
// logprobs): each rank finds its shard's best logit and log-sum-exp, and the ranks exchange those
// three numbers per row instead of the logits. Same token as the sampler (ties: lowest id; NaN
// counts as -inf) and the same log-probability up to the order of the exp sums. False, doing
// nothing, when some row needs the full sampler.
bool CpuReference::distributed_greedy(std::span<const SamplingParams> params, std::span<SampleResult> out) {
    for (const SamplingParams& p : params)
        if (!p.is_greedy() || p.top_logprobs > 0 || !p.logit_bias.empty() || p.repetition_penalty != 1.0f ||
            p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f)
            return false;
    struct Best {
        float max;       // largest logit of the shard (-inf if none is finite)
        int32_t token;   // its id (global), lowest on ties
        double sum_exp;  // Σ exp(logit - max) over the shard
    };
    const int n = n_logit_rows_, V = piece_.vocab.count, ranks = vocab_comm_->size();
    std::vector<Best> mine(static_cast<size_t>(n));
    for (int row = 0; row < n; ++row) {
        const float* x = logits_.data() + size_t(row) * V;
        auto value = [&](int t) { return std::isnan(x[t]) ? -INFINITY : x[t]; };
        int best = 0;
        for (int t = 1; t < V; ++t)
            if (value(t) > value(best)) best = t;
        Best b{value(best), piece_.vocab.first + best, 0.0};
        if (std::isfinite(b.max))
            for (int t = 0; t < V; ++t) b.sum_exp += std::exp(double(value(t)) - double(b.max));
        mine[size_t(row)] = b;
    }
    std::vector<Best> all(size_t(n) * ranks);  // [ranks][n]
    vocab_comm_->all_gather<Best>(mine, all);
    for (int row = 0; row < n; ++row) {
        Best g = all[size_t(row)];
        for (int r = 1; r < ranks; ++r)  // shards in vocabulary order: strictly greater keeps the lowest id
            if (all[size_t(r) * n + row].max > g.max) g = all[size_t(r) * n + row];
        double sum = 0.0;
        for (int r = 0; r < ranks && std::isfinite(g.max); ++r) {
            const Best& b = all[size_t(r) * n + row];
            if (std::isfinite(b.max)) sum += b.sum_exp * std::exp(double(b.max) - double(g.max));
        }
        out[size_t(row)].token = g.token;
        out[size_t(row)].logprob = std::isfinite(g.max) ? float(-std::log(sum)) : 0.0f;
        out[size_t(row)].top.clear();
    }
    return true;
}

void CpuReference::sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                          std::span<SampleResult> out) {
    OSPREY_CHECK(int(params.size()) == n_logit_rows_ && state.size() == params.size() && out.size() == params.size(),
                 "sample: ", params.size(), " parameter sets, ", state.size(), " states and ", out.size(),
                 " results for ", n_logit_rows_, " logit rows");
    if (!vocab_comm_ || vocab_comm_->size() == 1) {
        cpu::sample_rows(logits_, config_.vocab_size, params, state, out, *pool_);
        return;
    }
    // Split vocabulary: greedy rows by a distributed argmax; anything else gathers the rows and runs
    // the one sampler (penalties, top-k/p, logprobs and the seeded draw need the whole row), on the
    // group's first rank (its results are the runner's).
    const bool masked = std::any_of(state.begin(), state.end(), [](const SamplingState& s) { return s.allowed; });
    if (!masked && distributed_greedy(params, out)) return;
    std::vector<float> full;
    gather_logits(full);
    if (vocab_comm_->rank() == 0) cpu::sample_rows(full, config_.vocab_size, params, state, out, *pool_);
}

}  // namespace osprey::model
