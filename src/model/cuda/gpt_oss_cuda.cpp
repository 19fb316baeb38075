#include "model/cuda/gpt_oss_cuda.h"

#include <algorithm>
#include <cstring>

#include "core/bf16.h"
#include "core/check.h"
#include "core/log.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cuda/argmax.h"
#include "kernels/cuda/embed.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "model/batch_check.h"
#include "model/cuda/moe_step.h"

namespace osprey::model {

namespace {

constexpr size_t kMetaAlign = 16;

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Host-side packing of the step's small arrays into one pinned buffer (uploaded with one copy);
// offsets are recorded so that device pointers can be derived after the upload.
class MetaPacker {
public:
    template <typename T>
    size_t add(std::span<const T> v) {
        const size_t off = size_;
        parts_.push_back({off, v.data(), v.size_bytes()});
        size_ = align_up(size_ + v.size_bytes(), kMetaAlign);
        return off;
    }
    template <typename T>
    size_t add(const std::vector<T>& v) {
        return add(std::span<const T>(v));
    }
    size_t size() const { return std::max<size_t>(size_, kMetaAlign); }
    void write(uint8_t* dst) const {
        for (const Part& p : parts_)
            if (p.bytes) std::memcpy(dst + p.off, p.src, p.bytes);
    }

private:
    struct Part {
        size_t off;
        const void* src;
        size_t bytes;
    };
    std::vector<Part> parts_;
    size_t size_ = 0;
};

bool is_plain_greedy(const SamplingParams& p) {
    return p.is_greedy() && !p.logprobs && p.top_logprobs == 0 && p.repetition_penalty == 1.0f &&
           p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f && p.logit_bias.empty();
}

}  // namespace

// Device buffers of one forward, carved once from the workspace for options.max_tokens tokens.
struct CudaRunner::Activations {
    float* x = nullptr;          // [T, H] f32 residual stream
    bf16* h = nullptr;           // [T, H] normalised activations
    bf16* qkv = nullptr;         // [T, Q + 2K]
    bf16* attn = nullptr;        // [T, Q]
    float* router = nullptr;     // [T, E] router logits
    float* moe = nullptr;        // [T, H] weighted expert sum (added into x by the next norm)
    bf16* final_h = nullptr;     // [R, H]
    float* logits = nullptr;     // [R, V]
    int32_t* greedy = nullptr;   // [R]
    float* argmax_val = nullptr; // [R, kArgmaxChunks]
    int32_t* argmax_idx = nullptr;
    float* partial_acc = nullptr;  // [P, n_kv, group, head_dim]
    float2* partial_ml = nullptr;  // [P, n_kv, group]
    int32_t* merge_counters = nullptr;  // [max_slices, n_kv] arrival counters of the fused merge (zeroed once)
    int max_partials = 0;
    MoeStep moe_step;
    cuda::Sampler sampler;  // non-greedy sampling on the GPU (owns its small parameter/result buffers)
};

// Everything one forward needs besides the weights: device pointers into the uploaded metadata.
struct CudaRunner::Step {
    int n_tokens = 0;
    int n_logit_rows = 0;
    bool graph_key_ok = false;  // decode-only step that a CUDA graph can replay
    bool store_in_rope = false; // decode-only step: the RoPE kernel appends K/V (rope.h), no kv_store launch
    const int32_t* tokens = nullptr;      // [T]
    const int32_t* positions = nullptr;   // [T]
    const int32_t* logit_rows = nullptr;  // [R]
    const int32_t* page_table = nullptr;  // [sum of pages]
    cuda::AttnDevicePlan plan_full, plan_window;
    const cuda::KvStoreRow* store_full = nullptr;
    int n_store_full = 0;
    const cuda::KvStoreRow* store_window = nullptr;
    int n_store_window = 0;
};

CudaRunner::CudaRunner(const Weights& weights, CudaRunnerOptions options)
    : config_(weights.config),
      options_(options),
      weights_(DeviceWeights::load(weights, options.progress)),
      rope_(config_, config_.max_position) {
    const Config& c = config_;
    c.validate();
    OSPREY_CHECK(options_.max_tokens > 0 && options_.max_logit_rows > 0 && options_.max_slices > 0,
                 "cuda runner: max_tokens ", options_.max_tokens, ", max_logit_rows ", options_.max_logit_rows,
                 ", max_slices ", options_.max_slices, " must be positive");
    OSPREY_CHECK(c.head_dim == cuda::kAttnHeadDim && c.group() == cuda::kAttnGroup, "cuda runner: head_dim ",
                 c.head_dim, " and GQA group ", c.group(), " (compiled: ", cuda::kAttnHeadDim, ", ", cuda::kAttnGroup,
                 ")");
    log::info("cuda: loaded ", weights_.stats.bytes / 1e9, " GB of weights in ", weights_.stats.seconds, " s (",
              weights_.stats.gb_per_s(), " GB/s)");
    rope_cos_.resize(rope_.cos().size());
    rope_sin_.resize(rope_.sin().size());
    rope_cos_.upload(rope_.cos());
    rope_sin_.upload(rope_.sin());
    blas_ = std::make_unique<cuda::Blas>();
    cuda::attention_configure();  // before any graph capture

    const size_t T = size_t(options_.max_tokens), R = size_t(options_.max_logit_rows);
    const int target = 2 * cuda::sm_count();
    const size_t P = size_t(options_.max_slices) + size_t(target);
    const size_t H = c.d_model, QKV = size_t(c.q_dim() + 2 * c.kv_dim());
    const size_t group_rows = size_t(c.n_kv_heads) * cuda::kAttnGroup;
    using W = cuda::Workspace;
    size_t bytes = W::bytes_for<float>(T * H) + W::bytes_for<bf16>(T * H) + W::bytes_for<bf16>(T * QKV) +
                   W::bytes_for<bf16>(T * c.q_dim()) + W::bytes_for<float>(T * c.n_experts) +
                   W::bytes_for<float>(T * H) + W::bytes_for<bf16>(R * H) + W::bytes_for<float>(R * c.vocab_size) +
                   W::bytes_for<int32_t>(R) + W::bytes_for<float>(R * cuda::kArgmaxChunks) +
                   W::bytes_for<int32_t>(R * cuda::kArgmaxChunks) + W::bytes_for<float>(P * group_rows * c.head_dim) +
                   W::bytes_for<float2>(P * group_rows) + W::bytes_for<int32_t>(size_t(options_.max_slices) * c.n_kv_heads) +
                   MoeStep::workspace_bytes(c, options_.max_tokens);
    workspace_ = cuda::Workspace(bytes);
    act_ = std::make_unique<Activations>();
    Activations& a = *act_;
    a.x = workspace_.take<float>(T * H, "x");
    a.h = workspace_.take<bf16>(T * H, "h");
    a.qkv = workspace_.take<bf16>(T * QKV, "qkv");
    a.attn = workspace_.take<bf16>(T * c.q_dim(), "attn");
    a.router = workspace_.take<float>(T * c.n_experts, "router");
    a.moe = workspace_.take<float>(T * H, "moe");
    a.final_h = workspace_.take<bf16>(R * H, "final_h");
    a.logits = workspace_.take<float>(R * c.vocab_size, "logits");
    a.greedy = workspace_.take<int32_t>(R, "greedy");
    a.argmax_val = workspace_.take<float>(R * cuda::kArgmaxChunks, "argmax");
    a.argmax_idx = workspace_.take<int32_t>(R * cuda::kArgmaxChunks, "argmax");
    a.partial_acc = workspace_.take<float>(P * group_rows * c.head_dim, "attention partials");
    a.partial_ml = workspace_.take<float2>(P * group_rows, "attention partials");
    const size_t n_counters = size_t(options_.max_slices) * c.n_kv_heads;
    a.merge_counters = workspace_.take<int32_t>(n_counters, "attention merge counters");
    CUDA_CHECK(cudaMemset(a.merge_counters, 0, n_counters * sizeof(int32_t)));
    a.max_partials = int(P);
    a.moe_step = MoeStep::carve(c, options_.max_tokens, workspace_);
    log::info("cuda: workspace ", workspace_.capacity() / 1e9, " GB for ", T, " tokens per step");
}

CudaRunner::~CudaRunner() = default;

std::string CudaRunner::name() const { return "cuda:" + cuda::device_name(); }

size_t CudaRunner::kv_budget_bytes() const {
    size_t held = 0;
    for (size_t i = 0; i < k_cache_.size(); ++i) held += k_cache_[i].bytes() + v_cache_[i].bytes();
    const size_t free = cuda::mem_info().free + held;
    return free > options_.kv_reserve_bytes ? free - options_.kv_reserve_bytes : 0;
}

void CudaRunner::allocate_kv(const KvLayout& layout) {
    layout.check("cuda");
    const Config& c = config_;
    OSPREY_CHECK(layout.spec.dtype() == kv_dtype() && layout.spec.n_layers() == c.n_layers, "cuda: KV spec for ",
                 layout.spec.n_layers(), " layers of ", kv_dtype_name(layout.spec.dtype()), ", this backend keeps ",
                 c.n_layers, " layers of ", kv_dtype_name(kv_dtype()));
    const size_t budget = kv_budget_bytes();
    OSPREY_CHECK(layout.bytes() <= budget, "cuda: KV layout needs ", layout.bytes(), " bytes, budget is ", budget);
    graphs_.clear();  // they hold the old cache pointers
    k_cache_.clear();
    v_cache_.clear();
    layout_ = layout;
    k_cache_.resize(c.n_layers);
    v_cache_.resize(c.n_layers);
    for (int i = 0; i < c.n_layers; ++i) {
        const size_t rows = size_t(layout.rows(layout.spec.kind_of(i)));
        k_cache_[i].resize(rows * c.kv_dim());
        v_cache_[i].resize(rows * c.kv_dim());
        k_cache_[i].fill_bytes(0);
        v_cache_[i].fill_bytes(0);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
}

// Runs cover whole blocks, so a block's bytes are contiguous whatever the order of heads and rows
// inside it ([n_kv_heads, rows, head_dim] here).
void CudaRunner::copy_kv(const KvCopyPlan& plan) {
    OSPREY_CHECK(!k_cache_.empty(), "copy_kv: allocate_kv first");
    check_kv_copy_plan(plan, layout_);
    const size_t row_bytes = layout_.spec.tensor_row_bytes();
    for (const KvRowRun& r : plan.runs)
        for (int layer : layout_.spec.group(r.group).layers)
            for (bf16* base : {k_cache_[layer].get(), v_cache_[layer].get()})
                CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(base) + size_t(r.dst) * row_bytes,
                                           reinterpret_cast<const char*>(base) + size_t(r.src) * row_bytes,
                                           size_t(r.n) * row_bytes, cudaMemcpyDeviceToDevice, stream_.get()));
}

void CudaRunner::check_batch(const ForwardBatch& batch) const {
    OSPREY_CHECK(!batch.slices.empty() && batch.n_tokens() > 0, "forward: empty batch");
    OSPREY_CHECK(batch.n_tokens() <= options_.max_tokens, "forward: ", batch.n_tokens(),
                 " tokens in one step, the CUDA runner was sized for ", options_.max_tokens);
    OSPREY_CHECK(int(batch.slices.size()) <= options_.max_slices, "forward: ", batch.slices.size(),
                 " sequences in one step, the CUDA runner was sized for ", options_.max_slices);
    OSPREY_CHECK(batch.n_logit_rows() <= options_.max_logit_rows, "forward: ", batch.n_logit_rows(),
                 " logit rows in one step, the CUDA runner was sized for ", options_.max_logit_rows);
    OSPREY_CHECK(!k_cache_.empty(), "forward: allocate_kv first");
    check_forward_batch(batch, config_, layout_);
}

void CudaRunner::prepare(const ForwardBatch& batch, Step& step) {
    const Config& c = config_;
    step.n_tokens = batch.n_tokens();
    std::vector<int32_t> positions, logit_rows, page_table;
    std::vector<cuda::AttnSlice> full_slices, window_slices;
    std::vector<cuda::KvStoreSlice> full_store, window_store;
    bool decode_only = true;
    for (const SequenceSlice& sl : batch.slices) {
        for (int i = 0; i < sl.n_tokens; ++i) positions.push_back(sl.start_pos + i);
        for (int i = 0; i < sl.logit_rows(); ++i) logit_rows.push_back(sl.first_logit_token() + i);
        decode_only = decode_only && sl.n_tokens == 1 && sl.want_logits && sl.n_full_kv_cached == 0;
        const int page_offset = int(page_table.size());
        page_table.insert(page_table.end(), sl.pages.begin(), sl.pages.end());
        full_slices.push_back({sl.first_token, sl.n_tokens, sl.start_pos, sl.window_slot, page_offset, 0});
        window_slices.push_back({sl.first_token, sl.n_tokens, sl.start_pos, sl.window_slot, 0, sl.window_first});
        full_store.push_back({sl.first_token, sl.n_tokens, sl.start_pos, sl.n_full_kv_cached, sl.window_slot, sl.pages});
        window_store.push_back({sl.first_token, sl.n_tokens, sl.start_pos, 0, sl.window_slot, {}});
    }
    step.n_logit_rows = int(logit_rows.size());
    step.graph_key_ok = decode_only && options_.graphs && !dump_ && !profile_;
    const int target = 2 * cuda::sm_count();
    const cuda::AttnPlan full = cuda::plan_attention(full_slices, 0, c.n_kv_heads, target, step.graph_key_ok);
    const cuda::AttnPlan window =
        cuda::plan_attention(window_slices, c.sliding_window, c.n_kv_heads, target, step.graph_key_ok);
    OSPREY_CHECK(full.n_partials <= act_->max_partials && window.n_partials <= act_->max_partials,
                 "forward: attention needs ", std::max(full.n_partials, window.n_partials),
                 " split partials, the workspace holds ", act_->max_partials);
    const std::vector<cuda::KvStoreRow> store_full =
        cuda::plan_kv_store(full_store, false, layout_.spec.paged().rows_per_block);
    const std::vector<cuda::KvStoreRow> store_window =
        cuda::plan_kv_store(window_store, true, layout_.spec.ring().rows_per_block);
    // Decode-only: one store row per token, in token order, for both groups (what rope.h's store needs).
    auto one_per_token = [&](const std::vector<cuda::KvStoreRow>& rows) {
        if (int(rows.size()) != step.n_tokens) return false;
        for (int t = 0; t < step.n_tokens; ++t)
            if (rows[size_t(t)].token != t) return false;
        return true;
    };
    step.store_in_rope = decode_only && one_per_token(store_full) && one_per_token(store_window);

    // Fixed-size arrays first and the page table last, so that a decode step of a given batch size
    // always finds its arrays at the same device addresses (what a captured graph reads).
    MetaPacker pack;
    const size_t o_tokens = pack.add(batch.tokens);
    const size_t o_pos = pack.add(positions);
    const size_t o_logit = pack.add(logit_rows);
    const size_t o_fd = pack.add(full.decode), o_fp = pack.add(full.prefill), o_fm = pack.add(full.merges);
    const size_t o_wd = pack.add(window.decode), o_wp = pack.add(window.prefill), o_wm = pack.add(window.merges);
    const size_t o_sf = pack.add(store_full), o_sw = pack.add(store_window);
    const size_t o_pages = pack.add(page_table);
    const size_t bytes = pack.size();
    if (meta_host_.size() < bytes) {
        stream_.sync();  // the old pinned buffer may still be read by an in-flight copy
        meta_host_.resize(align_up(bytes * 2, 1 << 16));
    }
    if (meta_device_.size() < bytes) {
        stream_.sync();
        graphs_.clear();  // they read the old arrays
        meta_device_.resize(align_up(bytes * 2, 1 << 16));
    }
    stream_.sync();  // the previous step's upload from the pinned buffer is done
    pack.write(meta_host_.get());
    CUDA_CHECK(cudaMemcpyAsync(meta_device_.get(), meta_host_.get(), bytes, cudaMemcpyHostToDevice, stream_));

    const uint8_t* base = meta_device_.get();
    auto at = [&](size_t off) { return base + off; };
    step.tokens = reinterpret_cast<const int32_t*>(at(o_tokens));
    step.positions = reinterpret_cast<const int32_t*>(at(o_pos));
    step.logit_rows = reinterpret_cast<const int32_t*>(at(o_logit));
    step.page_table = reinterpret_cast<const int32_t*>(at(o_pages));
    step.plan_full = {reinterpret_cast<const cuda::AttnItem*>(at(o_fd)), int(full.decode.size()),
                      reinterpret_cast<const cuda::AttnItem*>(at(o_fp)), int(full.prefill.size()),
                      reinterpret_cast<const cuda::AttnMerge*>(at(o_fm)), int(full.merges.size())};
    step.plan_window = {reinterpret_cast<const cuda::AttnItem*>(at(o_wd)), int(window.decode.size()),
                        reinterpret_cast<const cuda::AttnItem*>(at(o_wp)), int(window.prefill.size()),
                        reinterpret_cast<const cuda::AttnMerge*>(at(o_wm)), int(window.merges.size())};
    step.store_full = reinterpret_cast<const cuda::KvStoreRow*>(at(o_sf));
    step.n_store_full = int(store_full.size());
    step.store_window = reinterpret_cast<const cuda::KvStoreRow*>(at(o_sw));
    step.n_store_window = int(store_window.size());
}

void CudaRunner::forward(const ForwardBatch& batch) {
    check_batch(batch);
    Step step;
    prepare(batch, step);
    if (step.graph_key_ok) {
        const auto key = std::make_tuple(step.n_tokens, step.plan_full.n_decode, step.plan_window.n_decode);
        auto it = graphs_.find(key);
        if (it == graphs_.end()) {
            cuda::Graph g;
            g.capture(stream_, [&] { run_step(step); });
            it = graphs_.emplace(key, std::move(g)).first;
        }
        it->second.replay(stream_);
    } else {
        run_step(step);
    }
    if (profile_) {
        stream_.sync();
        for (size_t i = 1; i < prof_marks_.size(); ++i) {
            const double us = 1e3 * prof_events_[i]->ms_since(*prof_events_[i - 1]);
            auto it = std::find_if(prof_rows_.begin(), prof_rows_.end(),
                                   [&](const ProfileRow& r) { return r.step == prof_marks_[i]; });
            if (it == prof_rows_.end()) it = prof_rows_.insert(prof_rows_.end(), ProfileRow{prof_marks_[i], 0.0, 0});
            it->us += us;
            it->calls += 1;
        }
    }
    n_logit_rows_ = step.n_logit_rows;
    n_tokens_ = step.n_tokens;
}

void CudaRunner::set_capture_layers(std::span<const int> layers) {
    for (int l : layers)
        OSPREY_CHECK(l >= 0 && l < config_.n_layers - 1, "cuda runner: capture layer ", l, " outside [0, ",
                     config_.n_layers - 1, ") (the last block's output is not kept)");
    stream_.sync();
    graphs_.clear();  // captured graphs lack (or have) the copies
    capture_layers_.assign(layers.begin(), layers.end());
    if (!layers.empty())
        captured_ = cuda::DeviceBuffer<float>(size_t(options_.max_tokens) * layers.size() * size_t(config_.d_model));
}

void CudaRunner::captured_to_host(std::vector<float>& out) {
    out.resize(size_t(n_tokens_) * capture_layers_.size() * size_t(config_.d_model));
    if (out.empty()) return;
    CUDA_CHECK(cudaMemcpyAsync(out.data(), captured_.get(), out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    stream_.sync();
}

void CudaRunner::set_profile(bool on) {
    profile_ = on;
    prof_rows_.clear();
}

void CudaRunner::mark(const char* step) {
    if (!profile_) return;
    if (prof_events_.size() <= prof_marks_.size()) prof_events_.push_back(std::make_unique<cuda::Event>());
    prof_events_[prof_marks_.size()]->record(stream_);
    prof_marks_.push_back(step);
}

void CudaRunner::run_step(const Step& step) {
    const Config& c = config_;
    Activations& a = *act_;
    prof_marks_.clear();
    mark("start");
    // x = embedding rows of the tokens                                  [T, d_model] f32
    cuda::embed({.x = a.x, .table = weights_.embedding.get(), .tokens = step.tokens, .n_tokens = step.n_tokens,
                 .d_model = c.d_model},
                stream_);
    mark("embedding");
    dump("embedding", -1, a.x, step.n_tokens, c.d_model, false);
    for (int layer = 0; layer < c.n_layers; ++layer) {
        attention_block(layer, step);
        moe_block(layer, step);
    }
    unembed(step);
}

// One attention block (spec §3.3): x += Wout · attend(rope(Wqkv · rmsnorm(x))) + b.
void CudaRunner::attention_block(int layer, const Step& step) {
    const Config& c = config_;
    const DeviceLayer& w = weights_.layers[layer];
    Activations& a = *act_;
    const int T = step.n_tokens;
    const int qkv_width = c.q_dim() + 2 * c.kv_dim();

    // h = rmsnorm(x + moe of the previous block) · gain                 [T, d_model] bf16
    // (the previous block's MoE residual add is fused here; dumps keep the CPU reference's order)
    cuda::rmsnorm({.y = a.h, .x = a.x, .gain = w.attn_norm.get(), .delta = layer > 0 ? a.moe : nullptr,
                   .n_tokens = T, .d = c.d_model, .eps = c.norm_eps},
                  stream_);
    mark("attn_norm");
    if (layer > 0) dump("resid_mlp", layer - 1, a.x, T, c.d_model, false);
    // EAGLE-3: x now holds the residual stream after block layer - 1
    for (size_t j = 0; j < capture_layers_.size(); ++j)
        if (capture_layers_[j] == layer - 1) {
            const size_t width = size_t(c.d_model) * sizeof(float);
            CUDA_CHECK(cudaMemcpy2DAsync(captured_.get() + j * size_t(c.d_model), width * capture_layers_.size(), a.x,
                                         width, width, size_t(T), cudaMemcpyDeviceToDevice, stream_));
        }
    dump("attn_norm", layer, a.h, T, c.d_model, true);
    // qkv = h · Wqkvᵀ + b (q, k, v weights concatenated: one GEMM)      [T, q_dim + 2 kv_dim]
    blas_->linear({.y = a.qkv, .x = a.h, .w = w.qkv_w.get(), .bias = w.qkv_b.get(), .n_tokens = T,
                   .n_out = qkv_width, .n_in = c.d_model},
                  stream_);
    mark("qkv");
    // YaRN RoPE on every q and k head (half-split pairs, concentration in cos/sin); in decode-only
    // steps it also appends this step's k, v to the cache (before attention: equivalent for one token)
    const bool sliding = layout_.spec.is_ring(layer);
    const int rows = layout_.spec.group(layout_.spec.kind_of(layer)).rows_per_block;
    cuda::RopeArgs ra{.qkv = a.qkv, .positions = step.positions, .cos = rope_cos_.get(), .sin = rope_sin_.get(),
                      .n_tokens = T, .ld = qkv_width, .n_q_heads = c.n_heads, .n_kv_heads = c.n_kv_heads,
                      .head_dim = c.head_dim};
    if (step.store_in_rope) {
        ra.store = sliding ? step.store_window : step.store_full;
        ra.k_cache = k_cache_[layer].get();
        ra.v_cache = v_cache_[layer].get();
        ra.rows = rows;
    }
    cuda::rope(ra, stream_);
    mark("rope");
    if (dump_) {
        dump("q", layer, a.qkv, T, qkv_width, true);  // split into q, k, v by dump()
    }

    // attn = softmax-with-sink(q·kᵀ / sqrt(head_dim)) · v: earlier positions from the cache (pages
    // on full layers, the window ring on sliding ones), this step's from qkv.
    cuda::attention({.out = a.attn,
                     .ld_out = c.q_dim(),
                     .qkv = a.qkv,
                     .ld_qkv = qkv_width,
                     .k_cache = k_cache_[layer].get(),
                     .v_cache = v_cache_[layer].get(),
                     .rows = rows,
                     .ring = sliding,
                     .window = sliding ? c.sliding_window : 0,
                     .page_table = step.page_table,
                     .sinks = w.sinks.get(),
                     .n_q_heads = c.n_heads,
                     .n_kv_heads = c.n_kv_heads,
                     .head_dim = c.head_dim,
                     .partial_acc = a.partial_acc,
                     .partial_ml = a.partial_ml,
                     .merge_counters = a.merge_counters},
                    sliding ? step.plan_window : step.plan_full, stream_);
    mark(sliding ? "attention (window)" : "attention (full)");
    dump("attn", layer, a.attn, T, c.q_dim(), true);
    // append this step's k, v to the cache (unless RoPE did)
    if (!step.store_in_rope) cuda::kv_store({.qkv = a.qkv,
                    .ld_qkv = qkv_width,
                    .n_q_heads = c.n_heads,
                    .n_kv_heads = c.n_kv_heads,
                    .head_dim = c.head_dim,
                    .k_cache = k_cache_[layer].get(),
                    .v_cache = v_cache_[layer].get(),
                    .rows = rows,
                    .dst = sliding ? step.store_window : step.store_full,
                    .n = sliding ? step.n_store_window : step.n_store_full},
                   stream_);
    mark("kv_store");

    // x += attn · Woutᵀ + b (projection, bias and residual add in one GEMM) [T, d_model] f32
    blas_->linear({.y = a.x, .x = a.attn, .w = w.out_w.get(), .bias = w.out_b.get(), .n_tokens = T,
                   .n_out = c.d_model, .n_in = c.q_dim(), .y_f32 = true, .accumulate = true},
                  stream_);
    mark("out_proj");
    dump("resid_attn", layer, a.x, T, c.d_model, false);
}

// One mixture-of-experts block (spec §3.6): moe = Σ_top4 w_e · expert_e(rmsnorm(x)); the residual
// add x += moe happens in the next block's norm (or the final norm).
void CudaRunner::moe_block(int layer, const Step& step) {
    const Config& c = config_;
    const DeviceLayer& w = weights_.layers[layer];
    Activations& a = *act_;
    const int T = step.n_tokens;

    // h = rmsnorm(x) · gain                                             [T, d_model] bf16
    cuda::rmsnorm({.y = a.h, .x = a.x, .gain = w.mlp_norm.get(), .n_tokens = T, .d = c.d_model, .eps = c.norm_eps},
                  stream_);
    mark("mlp_norm");
    dump("mlp_norm", layer, a.h, T, c.d_model, true);
    // router logits = h · Wgateᵀ + b                                   [T, n_experts] f32
    blas_->linear({.y = a.router, .x = a.h, .w = w.router_w.get(), .bias = w.router_b.get(), .n_tokens = T,
                   .n_out = c.n_experts, .n_in = c.d_model, .y_f32 = true},
                  stream_);
    mark("router");
    dump("router_logits", layer, a.router, T, c.n_experts, false);
    // top-4 on the raw logits, softmax over those four; experts (MXFP4) with clamped SwiGLU; the
    // weighted sum of the four expert outputs (b2 inside the sum)       [T, d_model] f32
    a.moe_step.run(c, w, a.h, a.router, a.moe, T, stream_);
    mark("moe");
    dump("moe", layer, a.moe, T, c.d_model, false);
}

// Final norm and unembedding (spec §3.7), for the last token of each slice that wants logits.
void CudaRunner::unembed(const Step& step) {
    const Config& c = config_;
    Activations& a = *act_;
    const int R = step.n_logit_rows;
    if (dump_) {
        // Apply the last block's MoE residual to every row (outside dumps only the gathered rows get it).
        cuda::rmsnorm({.y = a.h, .x = a.x, .gain = weights_.final_norm.get(), .delta = a.moe,
                       .n_tokens = step.n_tokens, .d = c.d_model, .eps = c.norm_eps},
                      stream_);
        dump("resid_mlp", c.n_layers - 1, a.x, step.n_tokens, c.d_model, false);
    }
    if (R == 0) return;
    // h = rmsnorm(x + moe) · gain on the logit rows only                 [R, d_model] bf16
    cuda::rmsnorm({.y = a.final_h, .x = a.x, .gain = weights_.final_norm.get(), .delta = dump_ ? nullptr : a.moe,
                   .rows = step.logit_rows, .n_tokens = R, .d = c.d_model, .eps = c.norm_eps},
                  stream_);
    mark("final_norm");
    dump("final_norm", -1, a.final_h, R, c.d_model, true);
    // logits = h · Wunembᵀ (untied, no bias)                             [R, vocab] f32
    blas_->linear({.y = a.logits, .x = a.final_h, .w = weights_.unembedding.get(), .n_tokens = R,
                   .n_out = c.vocab_size, .n_in = c.d_model, .y_f32 = true},
                  stream_);
    mark("unembedding");
    dump("logits", -1, a.logits, R, c.vocab_size, false);
}

void CudaRunner::dump(std::string_view name, int layer, const void* device, int rows, int width, bool is_bf16) const {
    if (!dump_) return;
    const size_t n = size_t(rows) * width;
    std::vector<float> f(n);
    if (is_bf16) {
        std::vector<bf16> b(n);
        CUDA_CHECK(cudaMemcpyAsync(b.data(), device, n * sizeof(bf16), cudaMemcpyDeviceToHost, stream_));
        stream_.sync();
        for (size_t i = 0; i < n; ++i) f[i] = bf16_to_float(b[i]);
    } else {
        CUDA_CHECK(cudaMemcpyAsync(f.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
        stream_.sync();
    }
    if (name == "q") {  // the fused qkv row: report q, k and v separately, as the CPU reference does
        const Config& c = config_;
        const int widths[3] = {c.q_dim(), c.kv_dim(), c.kv_dim()};
        const char* names[3] = {"q", "k", "v"};
        int col = 0;
        for (int part = 0; part < 3; ++part) {
            std::vector<float> sub(size_t(rows) * widths[part]);
            for (int r = 0; r < rows; ++r)
                std::copy_n(f.begin() + size_t(r) * width + col, widths[part], sub.begin() + size_t(r) * widths[part]);
            dump_(names[part], layer, sub);
            col += widths[part];
        }
        return;
    }
    dump_(name, layer, f);
}

void CudaRunner::logits_to_host(std::vector<float>& out) {
    out.resize(size_t(n_logit_rows_) * config_.vocab_size);
    if (out.empty()) return;
    CUDA_CHECK(cudaMemcpyAsync(out.data(), act_->logits, out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    stream_.sync();
}

void CudaRunner::greedy(std::vector<int32_t>& out) {
    out.resize(n_logit_rows_);
    if (out.empty()) return;
    cuda::argmax({.out = act_->greedy, .logits = act_->logits, .n_rows = n_logit_rows_, .n_cols = config_.vocab_size,
                  .scratch_val = act_->argmax_val, .scratch_idx = act_->argmax_idx},
                 stream_);
    CUDA_CHECK(cudaMemcpyAsync(out.data(), act_->greedy, out.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    stream_.sync();
    for (size_t r = 0; r < out.size(); ++r)
        OSPREY_CHECK(out[r] >= 0, "greedy: logit row ", r, " holds only NaN (the forward produced no finite logit)");
}

void CudaRunner::sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                        std::span<SampleResult> out) {
    OSPREY_CHECK(int(params.size()) == n_logit_rows_ && state.size() == params.size() && out.size() == params.size(),
                 "sample: ", params.size(), " parameter sets, ", state.size(), " states and ", out.size(),
                 " results for ", n_logit_rows_, " logit rows");
    if (std::all_of(params.begin(), params.end(), is_plain_greedy)) {
        // Greedy on the GPU: the logits never leave the device.
        std::vector<int32_t> ids;
        greedy(ids);
        for (size_t r = 0; r < ids.size(); ++r) {
            out[r] = SampleResult{};
            out[r].token = ids[r];
        }
        return;
    }
    // Penalties, temperature, truncation or log-probabilities: the GPU sampler (kernels/cuda/sampling.h),
    // same tokens as the CPU sampler; only the chosen tokens and log-probabilities are copied back.
    act_->sampler.sample(act_->logits, config_.vocab_size, 0, params, state, out, stream_);
}

}  // namespace osprey::model
