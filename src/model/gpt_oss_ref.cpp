#include "model/gpt_oss_ref.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/bf16.h"
#include "core/check.h"
#include "kernels/cpu/add.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/mxfp4_matmul.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cpu/routing.h"
#include "kernels/cpu/swiglu.h"
#include "model/batch_check.h"

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
    std::vector<int32_t> positions;    // [n_tokens]
    std::vector<int32_t> logit_rows;   // [n_logit_rows] tokens whose logits are wanted, in slice order
};

CpuReference::CpuReference(Weights weights, CpuReferenceOptions options)
    : weights_(std::move(weights)), config_(weights_.config), rope_(config_) {
    config_.validate();
    OSPREY_CHECK(int(weights_.layers.size()) == config_.n_layers, "cpu-reference: ", weights_.layers.size(),
                 " layers of weights for a config of ", config_.n_layers);
    if (options.n_threads > 0) own_pool_ = std::make_unique<ThreadPool>(options.n_threads);
    pool_ = own_pool_ ? own_pool_.get() : &ThreadPool::global();
    kv_budget_ = options.kv_budget_bytes > 0 ? options.kv_budget_bytes : kv_budget_from_env();

    bf16_view(weights_.embedding);
    bf16_view(weights_.unembedding);
    final_norm_ = to_floats(weights_.final_norm);
    vectors_.resize(config_.n_layers);
    for (int i = 0; i < config_.n_layers; ++i) {
        const LayerWeights& w = weights_.layers[i];
        for (const TensorView* t : {&w.q_w, &w.k_w, &w.v_w, &w.out_w, &w.router_w}) bf16_view(*t);
        for (const TensorView* t : {&w.mlp1_blocks, &w.mlp1_scales, &w.mlp2_blocks, &w.mlp2_scales}) u8_view(*t);
        LayerVectors& v = vectors_[i];
        v.attn_norm = to_floats(w.attn_norm);
        v.q_b = to_floats(w.q_b);
        v.k_b = to_floats(w.k_b);
        v.v_b = to_floats(w.v_b);
        v.sinks = to_floats(w.sinks);
        v.out_b = to_floats(w.out_b);
        v.mlp_norm = to_floats(w.mlp_norm);
        v.router_b = to_floats(w.router_b);
        v.mlp1_bias = to_floats(w.mlp1_bias);
        v.mlp2_bias = to_floats(w.mlp2_bias);
    }
    kv_.resize(config_.n_layers);
}

void CpuReference::allocate_kv(const KvLayout& layout) {
    layout.check("cpu-reference");
    OSPREY_CHECK(layout.spec.dtype() == kv_dtype() && layout.spec.n_layers() == config_.n_layers,
                 "cpu-reference: KV spec for ", layout.spec.n_layers(), " layers of ",
                 kv_dtype_name(layout.spec.dtype()), ", this backend keeps ", config_.n_layers, " layers of ",
                 kv_dtype_name(kv_dtype()));
    OSPREY_CHECK(layout.bytes() <= kv_budget_, "cpu-reference: KV layout needs ", layout.bytes(), " bytes, budget is ",
                 kv_budget_, " (OSPREY_CPU_KV_BYTES)");
    layout_ = layout;
    const size_t kv_dim = size_t(config_.kv_dim());
    for (int i = 0; i < config_.n_layers; ++i) {
        const size_t rows = size_t(layout.rows(layout.spec.kind_of(i)));
        kv_[i].k.assign(rows * kv_dim, 0.0f);
        kv_[i].v.assign(rows * kv_dim, 0.0f);
    }
}

void CpuReference::copy_kv(const KvCopyPlan& plan) {
    check_kv_copy_plan(plan, layout_);
    const size_t kv_dim = size_t(config_.kv_dim());
    for (const KvRowRun& r : plan.runs)
        for (int layer : layout_.spec.group(r.group).layers)
            for (std::vector<float>* cache : {&kv_[layer].k, &kv_[layer].v})
                std::copy_n(cache->data() + size_t(r.src) * kv_dim, size_t(r.n) * kv_dim,
                            cache->data() + size_t(r.dst) * kv_dim);
}

void CpuReference::check_batch(const ForwardBatch& batch) const { check_forward_batch(batch, config_, layout_); }

void CpuReference::dump(std::string_view name, int layer, std::span<const float> values) const {
    if (dump_) dump_(name, layer, values);
}

void CpuReference::forward(const ForwardBatch& batch) {
    check_batch(batch);
    const Config& c = config_;
    Step step;
    step.batch = &batch;
    step.n_tokens = batch.n_tokens();
    int max_pos = 0;
    for (const SequenceSlice& sl : batch.slices) {
        for (int i = 0; i < sl.n_tokens; ++i) step.positions.push_back(sl.start_pos + i);
        if (sl.want_logits) step.logit_rows.push_back(sl.first_token + sl.n_tokens - 1);
        max_pos = std::max(max_pos, sl.start_pos + sl.n_tokens);
    }
    rope_.reserve(max_pos);
    const size_t T = size_t(step.n_tokens);
    x_.resize(T * c.d_model);
    xn_.resize(T * c.d_model);
    q_.resize(T * c.q_dim());
    k_.resize(T * c.kv_dim());
    v_.resize(T * c.kv_dim());
    attn_.resize(T * c.q_dim());
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

    for (int layer = 0; layer < c.n_layers; ++layer) {
        attention_block(layer, step);
        moe_block(layer, step);
    }
    unembed(step);
}

// One attention block (spec §3.3): x += Wout · attend(rope(Wqkv · rmsnorm(x))) + b.
void CpuReference::attention_block(int layer, const Step& step) {
    const Config& c = config_;
    const LayerWeights& w = weights_.layers[layer];
    const LayerVectors& lv = vectors_[layer];
    const int T = step.n_tokens;

    // xn = rmsnorm(x) · gain                                            [T, d_model]
    cpu::rmsnorm(xn_, x_, lv.attn_norm, T, c.d_model, c.norm_eps, *pool_);
    dump("attn_norm", layer, xn_);
    // q, k, v = xn · Wᵀ + b                                             [T, q_dim], [T, kv_dim] x2
    cpu::matmul_bf16w(q_, xn_, bf16_view(w.q_w), lv.q_b, T, c.d_model, c.q_dim(), *pool_);
    cpu::matmul_bf16w(k_, xn_, bf16_view(w.k_w), lv.k_b, T, c.d_model, c.kv_dim(), *pool_);
    cpu::matmul_bf16w(v_, xn_, bf16_view(w.v_w), lv.v_b, T, c.d_model, c.kv_dim(), *pool_);
    // YaRN RoPE on every q and k head (half-split pairs, concentration in cos/sin)
    cpu::rope(q_, step.positions, c.n_heads, c.head_dim, rope_.cos(), rope_.sin());
    cpu::rope(k_, step.positions, c.n_kv_heads, c.head_dim, rope_.cos(), rope_.sin());
    dump("q", layer, q_);
    dump("k", layer, k_);
    dump("v", layer, v_);

    // attn = softmax-with-sink(q·kᵀ / sqrt(head_dim)) · v per sequence: earlier positions from the
    // cache (pages on full layers, the window ring on sliding ones), this step's from k_, v_.
    const bool sliding = layout_.spec.is_ring(layer);
    const LayerKv& cache = kv_[layer];
    for (const SequenceSlice& sl : step.batch->slices) {
        const size_t t0 = size_t(sl.first_token);
        const std::span<const int32_t> blocks = sliding ? std::span<const int32_t>(&sl.window_slot, 1)
                                                        : std::span<const int32_t>(sl.pages);
        cpu::attention_sinks({.out = std::span(attn_).subspan(t0 * c.q_dim(), size_t(sl.n_tokens) * c.q_dim()),
                              .q = std::span<const float>(q_).subspan(t0 * c.q_dim(), size_t(sl.n_tokens) * c.q_dim()),
                              .positions = std::span(step.positions).subspan(t0, sl.n_tokens),
                              .sinks = lv.sinks,
                              .kv = {.cache_k = cache.k.data(),
                                     .cache_v = cache.v.data(),
                                     .blocks = blocks,
                                     .block_rows = layout_.spec.group(layout_.spec.kind_of(layer)).rows_per_block,
                                     .ring = sliding,
                                     .n_cached = sl.start_pos,
                                     .first_cached = sliding ? sl.window_first : 0,
                                     .fresh_k = k_.data() + t0 * c.kv_dim(),
                                     .fresh_v = v_.data() + t0 * c.kv_dim(),
                                     .fresh_stride = c.kv_dim(),
                                     .n_fresh = sl.n_tokens},
                              .n_heads = c.n_heads,
                              .n_kv_heads = c.n_kv_heads,
                              .head_dim = c.head_dim,
                              .window = sliding ? c.sliding_window : 0,
                              .scale = 1.0f / std::sqrt(float(c.head_dim))},
                             *pool_);
    }
    dump("attn", layer, attn_);
    // append this step's k, v to the cache
    store_kv(layer, step);

    // x += attn · Woutᵀ + b                                             [T, d_model]
    cpu::matmul_bf16w(proj_, attn_, bf16_view(w.out_w), lv.out_b, T, c.q_dim(), c.d_model, *pool_);
    dump("attn_out", layer, proj_);
    cpu::add(x_, proj_);
    dump("resid_attn", layer, x_);
}

// Writes the step's K/V rows: full layers into the sequence's pages (except rows already cached),
// sliding layers into the sequence's ring at row p % sliding_window (only the last window rows survive).
void CpuReference::store_kv(int layer, const Step& step) {
    const Config& c = config_;
    const size_t kv_dim = size_t(c.kv_dim());
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
            std::copy_n(k_.begin() + t * kv_dim, kv_dim, cache.k.begin() + row * kv_dim);
            std::copy_n(v_.begin() + t * kv_dim, kv_dim, cache.v.begin() + row * kv_dim);
        }
    }
}

// One mixture-of-experts block (spec §3.6): x += Σ_top4 w_e · expert_e(rmsnorm(x)).
void CpuReference::moe_block(int layer, const Step& step) {
    const Config& c = config_;
    const LayerWeights& w = weights_.layers[layer];
    const LayerVectors& lv = vectors_[layer];
    const int T = step.n_tokens;
    const int H = c.d_model, I = c.d_ff, k = c.top_k;

    // xn = rmsnorm(x) · gain                                            [T, d_model]
    cpu::rmsnorm(xn_, x_, lv.mlp_norm, T, H, c.norm_eps, *pool_);
    dump("mlp_norm", layer, xn_);
    // router logits = xn · Wgateᵀ + b                                   [T, n_experts]
    cpu::matmul_bf16w(router_, xn_, bf16_view(w.router_w), lv.router_b, T, H, c.n_experts, *pool_);
    dump("router_logits", layer, router_);
    // top-4 experts on the raw logits, softmax over those four          [T, top_k]
    cpu::route_topk_softmax(expert_ids_, expert_weights_, router_, T, c.n_experts, k);

    // moe = Σ_e w_e · (W2_e · swiglu(W1_e · xn + b1_e) + b2_e), expert by expert over its tokens
    std::fill(moe_.begin(), moe_.end(), 0.0f);
    const std::span<const uint8_t> mlp1_blocks = u8_view(w.mlp1_blocks), mlp1_scales = u8_view(w.mlp1_scales);
    const std::span<const uint8_t> mlp2_blocks = u8_view(w.mlp2_blocks), mlp2_scales = u8_view(w.mlp2_scales);
    const size_t w1_bytes = size_t(2) * I * H / 2, w1_scales = size_t(2) * I * H / 32;  // per expert
    const size_t w2_bytes = size_t(H) * I / 2, w2_scales = size_t(H) * I / 32;
    std::vector<int32_t> rows;    // [n] tokens routed to the expert
    std::vector<float> weights;   // [n] their routing weights
    std::vector<float> xe, gate_up, u, y;  // [n, d_model], [n, 2 d_ff], [n, d_ff], [n, d_model]
    for (int e = 0; e < c.n_experts; ++e) {
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
        for (int r = 0; r < n; ++r) std::copy_n(xn_.begin() + size_t(rows[r]) * H, H, xe.begin() + size_t(r) * H);
        gate_up.resize(size_t(n) * 2 * I);
        u.resize(size_t(n) * I);
        y.resize(size_t(n) * H);
        // gate_up = xe · W1_eᵀ + b1_e, rows interleaved gate/up          [n, 2 d_ff]
        cpu::mxfp4_matmul(gate_up, xe, mlp1_blocks.subspan(e * w1_bytes, w1_bytes),
                          mlp1_scales.subspan(e * w1_scales, w1_scales),
                          std::span<const float>(lv.mlp1_bias).subspan(size_t(e) * 2 * I, size_t(2) * I), n, H,
                          2 * I, *pool_);
        // u = clamped swiglu(gate, up)                                 [n, d_ff]
        cpu::swiglu_clamped(u, gate_up, n, I, c.swiglu_alpha, c.swiglu_limit);
        // y = u · W2_eᵀ + b2_e                                           [n, d_model]
        cpu::mxfp4_matmul(y, u, mlp2_blocks.subspan(e * w2_bytes, w2_bytes),
                          mlp2_scales.subspan(e * w2_scales, w2_scales),
                          std::span<const float>(lv.mlp2_bias).subspan(size_t(e) * H, H), n, I, H, *pool_);
        // moe[t] += w · y                                               (b2 inside the weighted sum)
        for (int r = 0; r < n; ++r)
            cpu::add_scaled(std::span(moe_).subspan(size_t(rows[r]) * H, H),
                            std::span<const float>(y).subspan(size_t(r) * H, H), weights[r]);
    }
    dump("moe", layer, moe_);
    // x += moe
    cpu::add(x_, moe_);
    dump("resid_mlp", layer, x_);
}

// Final norm and unembedding (spec §3.7), for the last token of each slice that wants logits.
void CpuReference::unembed(const Step& step) {
    const Config& c = config_;
    const int n = int(step.logit_rows.size());
    n_logit_rows_ = n;
    logits_.resize(size_t(n) * c.vocab_size);
    if (n == 0) return;
    std::vector<float> rows(size_t(n) * c.d_model), normed(rows.size());  // [n, d_model] each
    for (int r = 0; r < n; ++r)
        std::copy_n(x_.begin() + size_t(step.logit_rows[r]) * c.d_model, c.d_model, rows.begin() + size_t(r) * c.d_model);
    // xn = rmsnorm(x) · gain                                            [n, d_model]
    cpu::rmsnorm(normed, rows, final_norm_, n, c.d_model, c.norm_eps, *pool_);
    dump("final_norm", -1, normed);
    // logits = xn · Wunembᵀ (untied, no bias)                           [n, vocab]
    cpu::matmul_bf16w(logits_, normed, bf16_view(weights_.unembedding), {}, n, c.d_model, c.vocab_size, *pool_);
    dump("logits", -1, logits_);
}

void CpuReference::logits_to_host(std::vector<float>& out) { out = logits_; }

void CpuReference::sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                          std::span<SampleResult> out) {
    OSPREY_CHECK(int(params.size()) == n_logit_rows_ && state.size() == params.size() && out.size() == params.size(),
                 "sample: ", params.size(), " parameter sets, ", state.size(), " states and ", out.size(),
                 " results for ", n_logit_rows_, " logit rows");
    cpu::sample_rows(logits_, config_.vocab_size, params, state, out, *pool_);
}

}  // namespace osprey::model
