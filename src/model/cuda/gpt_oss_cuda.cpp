#include "model/cuda/gpt_oss_cuda.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/bf16.h"
#include "core/check.h"
#include "core/log.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cuda/argmax.h"
#include "kernels/cuda/embed.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/token_mask.h"
#include "model/batch_check.h"
#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/moe_mlp_w4a8.h"
#include "model/cuda/moe_step.h"
#include "model/prompt_scores.h"

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

int round_up(int n, int m) { return (n + m - 1) / m * m; }

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
    // The last MoE block's output, added into x by the next norm: its per-slot parts (moe_out, the
    // single-GPU path: the norm sums them), or, when moe_out.y is null, the dense sum in `moe` (a
    // rank of a parallel layout, after the all-reduce). `moe` also holds the dense sum for dumps.
    float* moe = nullptr;        // [T, H]
    MoeOutputs moe_out;
    float* proj = nullptr;       // [T, H] attention TP: the out-projection's partial sum, then reduced
    bf16* h_all = nullptr;       // [T_dp, H] attention DP: every group's normalised tokens (T_dp = T · dp)
    float* moe_all = nullptr;    // [T_dp, H] attention DP: the MoE output of every group's tokens
    // The residual add of the last MoE block into an rmsnorm's arguments.
    void add_moe(cuda::RmsNormArgs& r) const {
        if (moe_out.y) {
            r.moe_y = moe_out.y, r.moe_w = moe_out.w;
        } else {
            r.delta = moe;
        }
    }
    bf16* final_h = nullptr;     // [R, H]
    float* logits = nullptr;     // [R, V]
    int32_t* greedy = nullptr;   // [R]
    float* greedy_val = nullptr; // [R] the winning logits (sharded vocabulary: the argmax candidates)
    float* argmax_val = nullptr; // [R, kArgmaxChunks]
    int32_t* argmax_idx = nullptr;
    float* partial_acc = nullptr;  // [P, n_kv, group, head_dim]
    float2* partial_ml = nullptr;  // [P, n_kv, group]
    int32_t* merge_counters = nullptr;  // [max_slices, n_kv] arrival counters of the fused merge (zeroed once)
    unsigned* router_tail_counter = nullptr;  // cuda::gemv_router_tail's arrival counter (zeroed once)
    int max_partials = 0;
    cuda::KvFp8 step8;  // FP8 KV: this step's quantised K/V rows [T, n_kv, head_dim] and multipliers [T, n_kv]
    MoeStep moe_step;
    cuda::Sampler sampler;  // non-greedy sampling on the GPU (owns its small parameter/result buffers)
};

// Everything one forward needs besides the weights: device pointers into the uploaded metadata.
struct CudaRunner::Step {
    int n_tokens = 0;
    int n_logit_rows = 0;
    bool graph_key_ok = false;  // a step of decodes and verifies, which a CUDA graph can replay
    bool decode_only = false;   // every slice one token (its graph is captured at first sight)
    GraphKey graph_key{};
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
      dims_(make_dims(config_, options_)),
      weights_(options.shard ? DeviceWeights::load(weights, options.progress, options.shard->piece, dims_.d_ff)
                             : DeviceWeights::load(weights, options.progress, options.experts_to_fp8)),
      rope_(config_, config_.max_position) {
    OSPREY_CHECK(!(options.shard && options.experts_to_fp8), "cuda runner: experts_to_fp8 loads a whole model only");
    const Config& c = config_;
    if (sharded()) {
        // The same-device communicator synchronises on the host inside collectives, which a graph
        // capture cannot hold; NCCL could be captured, but is not yet (docs/architecture.md).
        options_.graphs = false;
        for (comm::Communicator* cm : {options_.shard->attn, options_.shard->moe, options_.shard->vocab}) {
            OSPREY_CHECK(cm && cm->on_device(), "cuda shard: its attn, moe and vocab communicators must be device ones");
            cm->set_stream(stream_.get());
        }
        OSPREY_CHECK(options_.shard->host_vocab && !options_.shard->host_vocab->on_device() &&
                         options_.shard->host_vocab->size() == options_.shard->vocab->size(),
                     "cuda shard: host_vocab must be a host communicator over the vocab group's ranks");
        if (dims_.dp) {
            OSPREY_CHECK(options_.shard->dp->on_device() && options_.shard->host_dp &&
                             !options_.shard->host_dp->on_device() &&
                             options_.shard->host_dp->size() == options_.shard->dp->size(),
                         "cuda shard: data parallelism needs a device dp and a host host_dp communicator");
            options_.shard->dp->set_stream(stream_.get());
        }
    }
    c.validate();
    OSPREY_CHECK(options_.max_tokens > 0 && options_.max_logit_rows > 0 && options_.max_slices > 0,
                 "cuda runner: max_tokens ", options_.max_tokens, ", max_logit_rows ", options_.max_logit_rows,
                 ", max_slices ", options_.max_slices, " must be positive");
    OSPREY_CHECK(c.head_dim == cuda::kAttnHeadDim && c.group() == cuda::kAttnGroup, "cuda runner: head_dim ",
                 c.head_dim, " and GQA group ", c.group(), " (compiled: ", cuda::kAttnHeadDim, ", ", cuda::kAttnGroup,
                 ")");
    log::info("cuda: loaded ", weights_.stats.bytes / 1e9, " GB of weights in ", weights_.stats.seconds, " s (",
              weights_.stats.gb_per_s(), " GB/s)");
    if (const char* env = std::getenv("OSPREY_MOE_DECODE_COPY"); options_.moe_decode_copy || (env && env == std::string("1")))
        weights_.add_decode_copies(options_.kv_reserve_bytes);
    rope_cos_.resize(rope_.cos().size());
    rope_sin_.resize(rope_.sin().size());
    rope_cos_.upload(rope_.cos());
    rope_sin_.upload(rope_.sin());
    blas_ = std::make_unique<cuda::Blas>();
    // FP8 linears of more than 32 tokens dequantise through a scratch that a graph capture cannot allocate.
    if (weights_.unembedding.is_fp8() || (!weights_.layers.empty() && weights_.layers[0].qkv_w.is_fp8()))
        blas_->reserve_fp8_scratch();
    OSPREY_CHECK(options_.kv_dtype == KvDtype::bf16 || options_.kv_dtype == KvDtype::fp8_e4m3,
                 "cuda: the KV cache is bf16 or fp8, not ", kv_dtype_name(options_.kv_dtype));
    OSPREY_CHECK(!fp8_kv() || c.head_dim == cuda::kAttnHeadDim, "cuda: the FP8 KV cache is compiled for head_dim ",
                 cuda::kAttnHeadDim);
    cuda::attention_configure();  // before any graph capture

    const size_t T = size_t(options_.max_tokens), R = size_t(options_.max_logit_rows);
    // Attention DP: the MoE sees the tokens of every group (each at most max_tokens).
    const size_t T_moe = dims_.dp ? T * size_t(options_.shard->dp->size()) : T;
    const int target = 2 * cuda::sm_count();
    const size_t P = size_t(options_.max_slices) + size_t(target);
    const size_t H = c.d_model, QKV = size_t(c.q_dim() + 2 * c.kv_dim());
    const size_t group_rows = size_t(c.n_kv_heads) * cuda::kAttnGroup;
    using W = cuda::Workspace;
    Config moe_config = c;  // a rank's padded expert columns may exceed d_ff
    // The experts' format (every layer the same): matrix experts (FP8, BF16) run moe_matrix for every
    // batch; W4A8 is an MXFP4 path.
    const WeightFormat experts = weights_.layers.empty() ? WeightFormat::mxfp4 : weights_.layers[0].experts;
    for (const DeviceLayer& l : weights_.layers)
        OSPREY_CHECK(l.experts == experts, "cuda runner: the layers' experts mix ", weight_format_name(experts), " and ",
                     weight_format_name(l.experts));
    OSPREY_CHECK(!options_.moe_w4a8 || experts == WeightFormat::mxfp4, "cuda runner: W4A8 (--moe-gemm w4a8) runs the "
                 "published MXFP4 experts; these are ", weight_format_name(experts), " (FP8 experts always run W8A8)");
    const bool w4a8 = (options_.moe_w4a8 || cuda::moe_w4a8_env()) && experts == WeightFormat::mxfp4;
    moe_config.d_ff = std::max(c.d_ff, dims_.d_ff);
    size_t bytes = W::bytes_for<float>(T * H) + W::bytes_for<bf16>(T * H) + W::bytes_for<bf16>(T * QKV) +
                   W::bytes_for<bf16>(T * c.q_dim()) + W::bytes_for<float>(T_moe * c.n_experts) +
                   W::bytes_for<float>(T * H) + W::bytes_for<bf16>(R * H) + W::bytes_for<float>(R * c.vocab_size) +
                   W::bytes_for<int32_t>(R) + W::bytes_for<float>(R) + W::bytes_for<float>(R * cuda::kArgmaxChunks) +
                   W::bytes_for<int32_t>(R * cuda::kArgmaxChunks) + W::bytes_for<float>(P * group_rows * c.head_dim) +
                   W::bytes_for<float2>(P * group_rows) + W::bytes_for<int32_t>(size_t(options_.max_slices) * c.n_kv_heads) +
                   W::bytes_for<unsigned>(1) +  // the router tail's counter
                   MoeStep::workspace_bytes(moe_config, int(T_moe), w4a8, experts) +
                   (dims_.attn_reduce ? W::bytes_for<float>(T * H) : 0) +
                   (fp8_kv() ? 2 * (W::bytes_for<uint8_t>(T * c.kv_dim()) + W::bytes_for<float>(T * c.n_kv_heads)) : 0) +
                   (dims_.dp ? W::bytes_for<bf16>(T_moe * H) + W::bytes_for<float>(T_moe * H) : 0);
    workspace_ = cuda::Workspace(bytes);
    act_ = std::make_unique<Activations>();
    Activations& a = *act_;
    a.x = workspace_.take<float>(T * H, "x");
    a.h = workspace_.take<bf16>(T * H, "h");
    a.qkv = workspace_.take<bf16>(T * QKV, "qkv");
    a.attn = workspace_.take<bf16>(T * c.q_dim(), "attn");
    a.router = workspace_.take<float>(T_moe * c.n_experts, "router");
    a.moe = workspace_.take<float>(T * H, "moe");
    a.final_h = workspace_.take<bf16>(R * H, "final_h");
    a.logits = workspace_.take<float>(R * c.vocab_size, "logits");
    a.greedy = workspace_.take<int32_t>(R, "greedy");
    a.greedy_val = workspace_.take<float>(R, "greedy values");
    a.argmax_val = workspace_.take<float>(R * cuda::kArgmaxChunks, "argmax");
    a.argmax_idx = workspace_.take<int32_t>(R * cuda::kArgmaxChunks, "argmax");
    a.partial_acc = workspace_.take<float>(P * group_rows * c.head_dim, "attention partials");
    a.partial_ml = workspace_.take<float2>(P * group_rows, "attention partials");
    const size_t n_counters = size_t(options_.max_slices) * c.n_kv_heads;
    a.merge_counters = workspace_.take<int32_t>(n_counters, "attention merge counters");
    CUDA_CHECK(cudaMemset(a.merge_counters, 0, n_counters * sizeof(int32_t)));
    a.router_tail_counter = workspace_.take<unsigned>(1, "router tail counter");
    CUDA_CHECK(cudaMemset(a.router_tail_counter, 0, sizeof(unsigned)));
    a.max_partials = int(P);
    a.moe_step = MoeStep::carve(moe_config, int(T_moe), workspace_, w4a8, experts);
    if (dims_.attn_reduce) a.proj = workspace_.take<float>(T * H, "out-projection partial sums");
    if (fp8_kv()) {
        a.step8.k = workspace_.take<uint8_t>(T * c.kv_dim(), "FP8 K rows of the step");
        a.step8.v = workspace_.take<uint8_t>(T * c.kv_dim(), "FP8 V rows of the step");
        a.step8.k_scale = workspace_.take<float>(T * c.n_kv_heads, "FP8 K multipliers of the step");
        a.step8.v_scale = workspace_.take<float>(T * c.n_kv_heads, "FP8 V multipliers of the step");
    }
    if (dims_.dp) {
        a.h_all = workspace_.take<bf16>(T_moe * H, "every DP group's tokens");
        a.moe_all = workspace_.take<float>(T_moe * H, "every DP group's MoE output");
    }
    log::info("cuda: workspace ", workspace_.capacity() / 1e9, " GB for ", T, " tokens per step");
}

CudaRunner::~CudaRunner() = default;

CudaRunner::Dims CudaRunner::make_dims(const Config& c, const CudaRunnerOptions& o) {
    const ModelShard p = o.shard ? o.shard->piece : ModelShard::whole(c);
    OSPREY_CHECK(p.kv_heads.count > 0 && p.kv_heads.end() <= c.n_kv_heads && p.heads.count == p.kv_heads.count * c.group() &&
                     p.heads.first == p.kv_heads.first * c.group() && p.experts.end() <= c.n_experts &&
                     p.ff.end() <= c.d_ff && p.ff.count % 32 == 0 && p.vocab.count > 0 && p.vocab.end() <= c.vocab_size,
                 "cuda shard: bad model piece (kv heads ", p.kv_heads.first, "+", p.kv_heads.count, ", experts ",
                 p.experts.first, "+", p.experts.count, ", ff ", p.ff.first, "+", p.ff.count, ")");
    Dims d;
    d.n_heads = p.heads.count;
    d.n_kv_heads = p.kv_heads.count;
    d.q_dim = d.n_heads * c.head_dim;
    d.kv_dim = d.n_kv_heads * c.head_dim;
    d.first_expert = p.experts.first;
    d.n_experts = p.experts.count;
    // The expert kernels take whole 64-column tiles of the intermediate dimension (moe_mlp_mxfp4.h);
    // a rank's share of 32-column MXFP4 groups is padded with zero weights, which add exact zeros.
    d.d_ff = p.ff.count == c.d_ff ? c.d_ff : round_up(p.ff.count, 64);
    d.vocab = p.vocab.count;
    d.attn_reduce = o.shard && o.shard->attn && o.shard->attn->size() > 1;
    d.moe_reduce = o.shard && o.shard->moe && o.shard->moe->size() > 1;
    d.dp = o.shard && o.shard->dp && o.shard->dp->size() > 1;
    return d;
}

KvSpec CudaRunner::kv_spec(int page_size) const {
    return KvSpec(config_, kv_dtype(), page_size, config_.n_kv_heads / dims_.n_kv_heads);
}

std::string CudaRunner::name() const { return "cuda:" + cuda::device_name(); }

size_t CudaRunner::kv_budget_bytes() const {
    size_t held = 0;
    for (size_t i = 0; i < k_cache_.size(); ++i) held += k_cache_[i].bytes() + v_cache_[i].bytes();
    for (size_t i = 0; i < k8_cache_.size(); ++i)
        held += k8_cache_[i].bytes() + v8_cache_[i].bytes() + k8_scale_[i].bytes() + v8_scale_[i].bytes();
    // Ranks sharing the GPU (same-device tests) share its free memory; each holds its own cache.
    const size_t ranks = options_.shard ? size_t(std::max(1, options_.shard->ranks_on_device)) : 1;
    const size_t free = (cuda::mem_info().free + held * ranks) / ranks;
    return free > options_.kv_reserve_bytes ? free - options_.kv_reserve_bytes : 0;
}

void CudaRunner::allocate_kv(const KvLayout& layout) {
    layout.check("cuda");
    const Config& c = config_;
    OSPREY_CHECK(layout.spec.dtype() == kv_dtype() && layout.spec.n_layers() == c.n_layers &&
                     layout.spec.kv_dim() == dims_.kv_dim,
                 "cuda: KV spec for ", layout.spec.n_layers(), " layers of ", kv_dtype_name(layout.spec.dtype()),
                 " rows of ", layout.spec.kv_dim(), ", this backend keeps ", c.n_layers, " layers of ",
                 kv_dtype_name(kv_dtype()), " rows of ", dims_.kv_dim, " (kv_spec())");
    // (Ranks sharing one GPU allocate at the same time, each seeing the others' caches as used: the
    // parallel runner checked the layout against one rank's share before they started.)
    const size_t budget = kv_budget_bytes();
    OSPREY_CHECK(layout.bytes() <= budget || (sharded() && options_.shard->ranks_on_device > 1), "cuda: KV layout needs ",
                 layout.bytes(), " bytes, budget is ", budget);
    graphs_.clear();  // they hold the old cache pointers
    k_cache_.clear();
    v_cache_.clear();
    k8_cache_.clear();
    v8_cache_.clear();
    k8_scale_.clear();
    v8_scale_.clear();
    layout_ = layout;
    if (fp8_kv()) {  // codes and multipliers in arrays of their own: kv_spec's bytes, codes 16-byte aligned
        k8_cache_.resize(c.n_layers);
        v8_cache_.resize(c.n_layers);
        k8_scale_.resize(c.n_layers);
        v8_scale_.resize(c.n_layers);
        for (int i = 0; i < c.n_layers; ++i) {
            const size_t rows = size_t(layout.rows(layout.spec.kind_of(i)));
            k8_cache_[i].resize(rows * dims_.kv_dim);
            v8_cache_[i].resize(rows * dims_.kv_dim);
            k8_scale_[i].resize(rows * dims_.n_kv_heads);
            v8_scale_[i].resize(rows * dims_.n_kv_heads);
            k8_cache_[i].fill_bytes(0);
            v8_cache_[i].fill_bytes(0);
            k8_scale_[i].fill_bytes(0);
            v8_scale_[i].fill_bytes(0);
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        return;
    }
    k_cache_.resize(c.n_layers);
    v_cache_.resize(c.n_layers);
    for (int i = 0; i < c.n_layers; ++i) {
        const size_t rows = size_t(layout.rows(layout.spec.kind_of(i)));
        k_cache_[i].resize(rows * dims_.kv_dim);
        v_cache_[i].resize(rows * dims_.kv_dim);
        k_cache_[i].fill_bytes(0);
        v_cache_[i].fill_bytes(0);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
}

cuda::KvFp8 CudaRunner::cache8(int layer) {
    return {.k = k8_cache_[layer].get(), .v = v8_cache_[layer].get(), .k_scale = k8_scale_[layer].get(),
            .v_scale = v8_scale_[layer].get()};
}

// Runs cover whole blocks, so a block's bytes are contiguous whatever the order of heads and rows
// inside it ([n_kv_heads, rows, head_dim] here; FP8: codes and multipliers each in that order).

void CudaRunner::copy_kv(const KvCopyPlan& plan) {
    OSPREY_CHECK(!k_cache_.empty() || !k8_cache_.empty(), "copy_kv: allocate_kv first");
    check_kv_copy_plan(plan, layout_);
    if (fp8_kv()) {  // codes (kv_dim bytes per row) and multipliers (n_kv_heads floats per row)
        auto copy = [&](void* base, size_t row_bytes, const KvRowRun& r) {
            CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(base) + size_t(r.dst) * row_bytes,
                                       static_cast<const char*>(base) + size_t(r.src) * row_bytes,
                                       size_t(r.n) * row_bytes, cudaMemcpyDeviceToDevice, stream_.get()));
        };
        for (const KvRowRun& r : plan.runs)
            for (int layer : layout_.spec.group(r.group).layers) {
                copy(k8_cache_[layer].get(), size_t(dims_.kv_dim), r);
                copy(v8_cache_[layer].get(), size_t(dims_.kv_dim), r);
                copy(k8_scale_[layer].get(), size_t(dims_.n_kv_heads) * sizeof(float), r);
                copy(v8_scale_[layer].get(), size_t(dims_.n_kv_heads) * sizeof(float), r);
            }
        return;
    }
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
    OSPREY_CHECK(!k_cache_.empty() || !k8_cache_.empty(), "forward: allocate_kv first");
    check_forward_batch(batch, config_, layout_);
}

void CudaRunner::prepare(const ForwardBatch& batch, Step& step) {
    const Config& c = config_;
    step.n_tokens = batch.n_tokens();
    std::vector<int32_t> positions, logit_rows, page_table;
    std::vector<cuda::AttnSlice> full_slices, window_slices;
    std::vector<cuda::KvStoreSlice> full_store, window_store;
    bool decode_only = true;
    // Graphs replay steps whose slices are decodes or speculative verifies: short, every token with a
    // logit row, nothing cached to skip (so the store rows are one per token and the shape is a few
    // counts). Prefill chunks, replays and prompt scoring run eagerly.
    bool graphable = true;
    for (const SequenceSlice& sl : batch.slices) {
        for (int i = 0; i < sl.n_tokens; ++i) positions.push_back(sl.start_pos + i);
        for (int i = 0; i < sl.logit_rows(); ++i) logit_rows.push_back(sl.first_logit_token() + i);
        decode_only = decode_only && sl.n_tokens == 1 && sl.want_logits && sl.n_full_kv_cached == 0;
        graphable = graphable && sl.want_logits && sl.n_logits == sl.n_tokens && sl.n_full_kv_cached == 0 &&
                    sl.n_tokens <= kMaxGraphSliceTokens && sl.score_targets.empty();
        const int page_offset = int(page_table.size());
        page_table.insert(page_table.end(), sl.pages.begin(), sl.pages.end());
        full_slices.push_back({sl.first_token, sl.n_tokens, sl.start_pos, sl.window_slot, page_offset, 0});
        window_slices.push_back({sl.first_token, sl.n_tokens, sl.start_pos, sl.window_slot, 0, sl.window_first});
        full_store.push_back({sl.first_token, sl.n_tokens, sl.start_pos, sl.n_full_kv_cached, sl.window_slot, sl.pages});
        window_store.push_back({sl.first_token, sl.n_tokens, sl.start_pos, 0, sl.window_slot, {}});
    }
    step.n_logit_rows = int(logit_rows.size());
    step.graph_key_ok = (decode_only || graphable) && options_.graphs && !dump_ && !profile_;
    step.decode_only = decode_only;
    const int target = 2 * cuda::sm_count();
    const cuda::AttnPlan full = cuda::plan_attention(full_slices, 0, dims_.n_kv_heads, target, step.graph_key_ok);
    const cuda::AttnPlan window =
        cuda::plan_attention(window_slices, c.sliding_window, dims_.n_kv_heads, target, step.graph_key_ok);
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
    step.graph_key = {step.n_tokens,
                      step.n_logit_rows,
                      int(full.decode.size()),
                      int(full.prefill.size()),
                      int(full.merges.size()),
                      int(window.decode.size()),
                      int(window.prefill.size()),
                      int(window.merges.size()),
                      int(store_full.size()),
                      int(store_window.size()),
                      int(step.store_in_rope)};

    // Fixed-size arrays first and the page table last, so that a decode or verify step of a given
    // shape (GraphKey) always finds its arrays at the same device addresses (what a captured graph reads).
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
                      reinterpret_cast<const cuda::AttnMerge*>(at(o_fm)), int(full.merges.size()),
                      full.prefill_kernel, full.wgmma_variant};
    step.plan_window = {reinterpret_cast<const cuda::AttnItem*>(at(o_wd)), int(window.decode.size()),
                        reinterpret_cast<const cuda::AttnItem*>(at(o_wp)), int(window.prefill.size()),
                        reinterpret_cast<const cuda::AttnMerge*>(at(o_wm)), int(window.merges.size()),
                        window.prefill_kernel, window.wgmma_variant};
    step.store_full = reinterpret_cast<const cuda::KvStoreRow*>(at(o_sf));
    step.n_store_full = int(store_full.size());
    step.store_window = reinterpret_cast<const cuda::KvStoreRow*>(at(o_sw));
    step.n_store_window = int(store_window.size());
}

void CudaRunner::forward(const ForwardBatch& batch) {
    if (dims_.dp) {
        if (!batch.slices.empty()) check_batch(batch);  // an idle group runs an empty step
        // Tokens per DP group, for the MoE's gather: every rank of a group sends the same count.
        const int32_t mine = batch.n_tokens();
        comm::Communicator& hd = *options_.shard->host_dp;
        std::vector<int32_t> counts(static_cast<size_t>(hd.size()));
        hd.all_gather<int32_t>(std::span(&mine, 1), counts);
        dp_tokens_.assign(counts.begin(), counts.end());
        dp_first_ = 0;
        for (int g = 0; g < hd.rank(); ++g) dp_first_ += dp_tokens_[size_t(g)];
        if (batch.slices.empty()) {
            for (int layer = 0; layer < config_.n_layers; ++layer) moe_experts_dp(layer, 0);
            n_logit_rows_ = 0;
            return;
        }
    } else {
        check_batch(batch);
    }
    Step step;
    prepare(batch, step);
    auto it = graphs_.end();
    if (step.graph_key_ok) {
        it = graphs_.find(step.graph_key);
        if (graph_sightings_.size() > size_t(4 * kMaxGraphs)) graph_sightings_.clear();  // one-off shapes
        ++n_graph_steps_;
        int64_t& last_seen = graph_sightings_[step.graph_key];
        const bool recurring = last_seen > 0 && n_graph_steps_ - last_seen <= kGraphRecurSteps;
        last_seen = n_graph_steps_;
        const bool seen_enough = step.decode_only || recurring;
        if (it == graphs_.end() && seen_enough && int(graphs_.size()) < kMaxGraphs) {
            cuda::Graph g;
            g.capture(stream_, [&] { run_step(step); });
            it = graphs_.emplace(step.graph_key, std::move(g)).first;
        }
    }
    last_graph_key_.reset();
    if (it != graphs_.end()) {
        it->second.replay(stream_);
        last_graph_key_ = it->first;
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
    score_prompt(batch);
    n_tokens_ = step.n_tokens;
}

double CudaRunner::replay_last_graph_us(int n) {
    const auto it = last_graph_key_ ? graphs_.find(*last_graph_key_) : graphs_.end();
    OSPREY_CHECK(it != graphs_.end() && n > 0, "replay_last_graph_us: the last forward ran without a CUDA graph");
    cuda::Event start, stop;
    start.record(stream_);
    for (int i = 0; i < n; ++i) it->second.replay(stream_);
    stop.record(stream_);
    stop.sync();
    return 1e3 * stop.ms_since(start) / n;
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

void CudaRunner::take_prompt_scores(std::vector<TokenScore>& out) {
    out = std::move(scores_);
    scores_.clear();
}

// Prompt scoring (model/prompt_scores.h), after the step's launches: the final norm and unembedding
// of the scored rows, kScoreRows at a time, into buffers of their own (the sampled rows' final_h and
// logits are left for sample()), then log-softmax on the host. A scored row is never a logit row
// (scored_rows checks), so fusing the last MoE residual into x here (the norm's per-slot MoE parts,
// as unembed() does for the logit rows) adds it once; with dumps on, unembed() has already added it
// to every row.
void CudaRunner::score_prompt(const ForwardBatch& batch) {
    scores_.clear();
    const std::vector<ScoredRow> rows = scored_rows(batch, config_.vocab_size);
    if (rows.empty()) return;
    const Config& c = config_;
    Activations& a = *act_;
    if (score_rows_.size() == 0) {
        stream_.sync();
        score_rows_.resize(kScoreRows);
        score_h_.resize(size_t(kScoreRows) * c.d_model);
        score_logits_.resize(size_t(kScoreRows) * c.vocab_size);
    }
    std::vector<int32_t> ids;
    std::vector<float> logits;
    for (size_t first = 0; first < rows.size(); first += kScoreRows) {
        const size_t n = std::min(size_t(kScoreRows), rows.size() - first);
        ids.resize(n);
        for (size_t r = 0; r < n; ++r) ids[r] = rows[first + r].row;
        score_rows_.upload(ids, stream_);
        // h = rmsnorm(x + moe) · gain on the scored rows                    [n, d_model] bf16
        cuda::RmsNormArgs norm{.y = score_h_.get(), .x = a.x, .gain = weights_.final_norm.get(),
                               .rows = score_rows_.get(), .n_tokens = int(n), .d = c.d_model, .eps = c.norm_eps};
        if (!dump_) a.add_moe(norm);
        cuda::rmsnorm(norm, stream_);
        // logits = h · Wunembᵀ                                              [n, vocab] f32
        blas_->linear({.y = score_logits_.get(), .x = score_h_.get(), .w = weights_.unembedding.bf16_weight(),
                       .w8 = weights_.unembedding.fp8_weight(), .n_tokens = int(n), .n_out = c.vocab_size,
                       .n_in = c.d_model, .y_f32 = true},
                      stream_);
        logits.resize(n * size_t(c.vocab_size));
        CUDA_CHECK(cudaMemcpyAsync(logits.data(), score_logits_.get(), logits.size() * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
        stream_.sync();
        score_logit_rows(logits, c.vocab_size, std::span(rows).subspan(first, n), scores_);
    }
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

bool CudaRunner::fuse_norms(int T) const {
    static const bool enabled = [] {
        const char* v = std::getenv("OSPREY_FUSED_NORMS");
        return !(v && std::string_view(v) == "0");
    }();
    return enabled && !dump_ && capture_layers_.empty() && !sharded() && !dims_.dp && !dims_.attn_reduce &&
           T <= cuda::kGemvNormMaxTokens &&
           cuda::gemv_norm_supported(T, config_.d_model, weights_.layers[0].qkv_w.is_fp8()) &&
           (!weights_.layers[0].out_w.is_fp8() || cuda::fp8_gemv_shape_ok(dims_.q_dim));
}

bool CudaRunner::router_tail(int T) const {
    static const bool enabled = [] {
        const char* v = std::getenv("OSPREY_ROUTER_TAIL");
        return v && std::string_view(v) == "1";
    }();
    return enabled && fuse_norms(T);
}

bool CudaRunner::fuse_rope(const Step& step) const {
    static const bool enabled = [] {
        const char* v = std::getenv("OSPREY_ATTN_ROPE");
        return !(v && std::string_view(v) == "0");
    }();
    return enabled && step.store_in_rope && !fp8_kv() && !dump_;
}

// One attention block (spec §3.3): x += Wout · attend(rope(Wqkv · rmsnorm(x))) + b.
void CudaRunner::attention_block(int layer, const Step& step) {
    const Config& c = config_;
    const DeviceLayer& w = weights_.layers[layer];
    Activations& a = *act_;
    const int T = step.n_tokens;
    const Dims& d = dims_;  // this rank's heads (all of them unless sharded)
    const int qkv_width = d.q_dim + 2 * d.kv_dim;

    // h = rmsnorm(x + moe of the previous block) · gain                 [T, d_model] bf16
    // (the previous block's MoE residual add is fused here; dumps keep the CPU reference's order).
    // Decode-sized steps fold the norm into the qkv GEMV's prologue and leave the MoE residual add
    // to the out-projection's epilogue (linear.h: GemvNorm, acc_moe_y): one kernel less per block.
    const bool fuse_norm = fuse_norms(T);
    const bool moe_pending = layer > 0 && fuse_norm;
    OSPREY_CHECK(!moe_pending || a.moe_out.y, "forward: fused norms need the MoE block's per-slot outputs");
    if (!fuse_norm) {
        cuda::RmsNormArgs norm{.y = a.h, .x = a.x, .gain = w.attn_norm.get(), .n_tokens = T, .d = c.d_model,
                               .eps = c.norm_eps};
        if (layer > 0) a.add_moe(norm);
        cuda::rmsnorm(norm, stream_);
        mark("attn_norm");
    }
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
    // (BF16, or FP8 codes with block multipliers: linear.h picks the kernels by format and T)
    cuda::LinearArgs qkv{.y = a.qkv, .x = a.h, .w = w.qkv_w.bf16_weight(), .w8 = w.qkv_w.fp8_weight(),
                         .bias = w.qkv_b.get(), .n_tokens = T, .n_out = qkv_width, .n_in = c.d_model};
    if (fuse_norm) {
        qkv.x = nullptr;
        qkv.norm = {.res = a.x, .gain = w.attn_norm.get(), .h = nullptr, .eps = c.norm_eps};
        if (moe_pending) qkv.norm.moe_y = a.moe_out.y, qkv.norm.moe_w = a.moe_out.w;
    }
    blas_->linear(qkv, stream_);
    mark("qkv");
    // YaRN RoPE on every q and k head (half-split pairs, concentration in cos/sin); in decode-only
    // steps it also appends this step's k, v to the cache (before attention: equivalent for one token).
    // fuse_rope: both happen inside the decode attention kernel instead (attention.h, rope_cos).
    const bool sliding = layout_.spec.is_ring(layer);
    const int rows = layout_.spec.group(layout_.spec.kind_of(layer)).rows_per_block;
    const bool rope_in_attention = fuse_rope(step);
    cuda::RopeArgs ra{.qkv = a.qkv, .positions = step.positions, .cos = rope_cos_.get(), .sin = rope_sin_.get(),
                      .n_tokens = T, .ld = qkv_width, .n_q_heads = d.n_heads, .n_kv_heads = d.n_kv_heads,
                      .head_dim = c.head_dim};
    if (fp8_kv()) ra.step8 = a.step8;  // FP8 KV: the step's K/V rows quantised (what attention reads)
    if (step.store_in_rope) {
        ra.store = sliding ? step.store_window : step.store_full;
        if (fp8_kv()) {
            ra.cache8 = cache8(layer);
        } else {
            ra.k_cache = k_cache_[layer].get();
            ra.v_cache = v_cache_[layer].get();
        }
        ra.rows = rows;
    }
    if (!rope_in_attention) {
        cuda::rope(ra, stream_);
        mark("rope");
    }
    if (dump_) {
        dump("q", layer, a.qkv, T, qkv_width, true);  // split into q, k, v by dump()
    }

    // attn = softmax-with-sink(q·kᵀ / sqrt(head_dim)) · v: earlier positions from the cache (pages
    // on full layers, the window ring on sliding ones), this step's from qkv.
    cuda::attention({.out = a.attn,
                     .ld_out = d.q_dim,
                     .qkv = a.qkv,
                     .ld_qkv = qkv_width,
                     .k_cache = fp8_kv() ? nullptr : k_cache_[layer].get(),
                     .v_cache = fp8_kv() ? nullptr : v_cache_[layer].get(),
                     .rows = rows,
                     .ring = sliding,
                     .window = sliding ? c.sliding_window : 0,
                     .page_table = step.page_table,
                     .sinks = w.sinks.get(),
                     .n_q_heads = d.n_heads,
                     .n_kv_heads = d.n_kv_heads,
                     .head_dim = c.head_dim,
                     .partial_acc = a.partial_acc,
                     .partial_ml = a.partial_ml,
                     .merge_counters = a.merge_counters,
                     .cache8 = fp8_kv() ? cache8(layer) : cuda::KvFp8{},
                     .step8 = fp8_kv() ? a.step8 : cuda::KvFp8{},
                     .rope_cos = rope_in_attention ? rope_cos_.get() : nullptr,
                     .rope_sin = rope_in_attention ? rope_sin_.get() : nullptr,
                     .k_store = rope_in_attention ? k_cache_[layer].get() : nullptr,
                     .v_store = rope_in_attention ? v_cache_[layer].get() : nullptr},
                    sliding ? step.plan_window : step.plan_full, stream_);
    mark(sliding ? "attention (window)" : "attention (full)");
    dump("attn", layer, a.attn, T, d.q_dim, true);
    // append this step's k, v to the cache (unless RoPE did)
    if (!step.store_in_rope) cuda::kv_store({.qkv = a.qkv,
                    .ld_qkv = qkv_width,
                    .n_q_heads = d.n_heads,
                    .n_kv_heads = d.n_kv_heads,
                    .head_dim = c.head_dim,
                    .k_cache = fp8_kv() ? nullptr : k_cache_[layer].get(),
                    .v_cache = fp8_kv() ? nullptr : v_cache_[layer].get(),
                    .rows = rows,
                    .dst = sliding ? step.store_window : step.store_full,
                    .n = sliding ? step.n_store_window : step.n_store_full,
                    .step8 = fp8_kv() ? a.step8 : cuda::KvFp8{},
                    .cache8 = fp8_kv() ? cache8(layer) : cuda::KvFp8{}},
                   stream_);
    mark("kv_store");

    if (d.attn_reduce) {
        // (TP: this rank's heads give a partial sum, the bias on one rank; summed over the TP group,
        // then added into x by the MoE block's norm)                    [T, d_model] f32
        blas_->linear({.y = a.proj, .x = a.attn, .w = w.out_w.bf16_weight(), .w8 = w.out_w.fp8_weight(),
                       .bias = w.out_b.get(), .n_tokens = T, .n_out = c.d_model, .n_in = d.q_dim, .y_f32 = true},
                      stream_);
        options_.shard->attn->all_reduce_sum(std::span(a.proj, size_t(T) * c.d_model));
        mark("out_proj");
        return;
    }
    // x += attn · Woutᵀ + b (projection, bias and residual add in one GEMM) [T, d_model] f32
    // (fused norms: x += the previous block's MoE slots first, in the norm's order)
    const cuda::LinearArgs out{.y = a.x, .x = a.attn, .w = w.out_w.bf16_weight(), .w8 = w.out_w.fp8_weight(),
                               .bias = w.out_b.get(), .n_tokens = T, .n_out = c.d_model, .n_in = d.q_dim,
                               .y_f32 = true, .accumulate = true,
                               .acc_moe_y = moe_pending ? a.moe_out.y : nullptr,
                               .acc_moe_w = moe_pending ? a.moe_out.w : nullptr};
    if (router_tail(T)) {
        deferred_out_proj_ = out;  // launched with the router (moe_block)
        return;
    }
    blas_->linear(out, stream_);
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
    // (attention TP: x += the reduced out-projection first; decode-sized steps: in the router GEMV's
    // prologue, which also writes h for the experts)
    const bool fuse_norm = fuse_norms(T);
    if (!fuse_norm) {
        cuda::rmsnorm({.y = a.h, .x = a.x, .gain = w.mlp_norm.get(), .delta = dims_.attn_reduce ? a.proj : nullptr,
                       .n_tokens = T, .d = c.d_model, .eps = c.norm_eps},
                      stream_);
        mark("mlp_norm");
    }
    if (dims_.attn_reduce) dump("resid_attn", layer, a.x, T, c.d_model, false);
    dump("mlp_norm", layer, a.h, T, c.d_model, true);
    if (dims_.dp) {  // (attention DP: the router and experts on every group's tokens)
        a.moe_out = {};
        moe_experts_dp(layer, T);
        mark("moe");
        dump("moe", layer, a.moe, T, c.d_model, false);
        return;
    }
    // router logits = h · Wgateᵀ + b                                   [T, n_experts] f32
    cuda::LinearArgs router{.y = a.router, .x = a.h, .w = w.router_w.get(), .bias = w.router_b.get(),
                            .n_tokens = T, .n_out = c.n_experts, .n_in = c.d_model, .y_f32 = true};
    if (fuse_norm) {
        router.x = nullptr;
        router.norm = {.res = a.x, .gain = w.mlp_norm.get(), .h = a.h, .eps = c.norm_eps};
    }
    if (deferred_out_proj_) {
        const cuda::LinearArgs out = *deferred_out_proj_;
        deferred_out_proj_.reset();
        if (cuda::gemv_router_tail_supported(out, router)) {
            cuda::gemv_router_tail(out, router, a.router_tail_counter, stream_);
        } else {
            blas_->linear(out, stream_);
            blas_->linear(router, stream_);
        }
    } else {
        blas_->linear(router, stream_);
    }
    mark("router");
    dump("router_logits", layer, a.router, T, c.n_experts, false);
    // top-4 on the raw logits, softmax over those four; experts (MXFP4) with clamped SwiGLU; the
    // weighted sum of the four expert outputs (b2 inside the sum)       [T, d_model] f32
    // (EP/TP: this rank's experts and columns, each expert's b2 on one rank; summed over all ranks)
    if (sharded()) {
        a.moe_out = {};
        a.moe_step.run(c, {dims_.first_expert, dims_.n_experts, dims_.d_ff}, w, a.h, a.router, a.moe, T, stream_);
        if (dims_.moe_reduce) options_.shard->moe->all_reduce_sum(std::span(a.moe, size_t(T) * c.d_model));
    } else {
        a.moe_out = a.moe_step.run(c, w, a.h, a.router, T, stream_);
        if (dump_) {  // the dense sum, as the CPU reference dumps it
            cuda::moe_combine({.out = a.moe, .y = a.moe_out.y, .expert_weights = a.moe_out.w, .n_tokens = T,
                               .d_model = c.d_model, .top_k = c.top_k, .mode = cuda::MoeCombineMode::overwrite},
                              stream_);
        }
    }
    mark("moe");
    dump("moe", layer, a.moe, T, c.d_model, false);
}

// Attention DP (spec §3.6 over every group's tokens): the groups' normalised tokens are gathered in
// group order, every rank routes all of them and applies its experts' columns, the partial outputs are
// all-reduced over every rank, and this group keeps its rows.
void CudaRunner::moe_experts_dp(int layer, int n_local) {
    const Config& c = config_;
    const DeviceLayer& w = weights_.layers[layer];
    Activations& a = *act_;
    const size_t H = size_t(c.d_model);
    std::vector<size_t> counts(dp_tokens_.size());
    size_t total = 0;
    for (size_t g = 0; g < counts.size(); ++g) total += dp_tokens_[g], counts[g] = dp_tokens_[g] * H;
    OSPREY_CHECK(total <= size_t(options_.max_tokens) * dp_tokens_.size(), "forward: ", total,
                 " tokens over the DP groups, the CUDA runner was sized for ", options_.max_tokens, " per group");
    // h_all = every group's h, in group order                          [T_all, d_model] bf16
    options_.shard->dp->all_gather_v<bf16>(std::span<const bf16>(a.h, size_t(n_local) * H),
                                           std::span<bf16>(a.h_all, total * H), counts);
    if (total == 0) return;
    // router logits = h_all · Wgateᵀ + b                               [T_all, n_experts] f32
    blas_->linear({.y = a.router, .x = a.h_all, .w = w.router_w.get(), .bias = w.router_b.get(),
                   .n_tokens = int(total), .n_out = c.n_experts, .n_in = c.d_model, .y_f32 = true},
                  stream_);
    // this rank's experts and columns on every group's tokens, summed over every rank
    a.moe_step.run(c, {dims_.first_expert, dims_.n_experts, dims_.d_ff}, w, a.h_all, a.router, a.moe_all, int(total),
                   stream_);
    options_.shard->moe->all_reduce_sum(std::span(a.moe_all, total * H));
    // this group keeps its rows
    if (n_local > 0)
        CUDA_CHECK(cudaMemcpyAsync(a.moe, a.moe_all + dp_first_ * H, size_t(n_local) * H * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream_));
}

// Final norm and unembedding (spec §3.7), for the last token of each slice that wants logits.
void CudaRunner::unembed(const Step& step) {
    const Config& c = config_;
    Activations& a = *act_;
    const int R = step.n_logit_rows;
    if (dump_) {
        // Apply the last block's MoE residual to every row (outside dumps only the gathered rows get it).
        cuda::RmsNormArgs norm{.y = a.h, .x = a.x, .gain = weights_.final_norm.get(), .n_tokens = step.n_tokens,
                               .d = c.d_model, .eps = c.norm_eps};
        a.add_moe(norm);
        cuda::rmsnorm(norm, stream_);
        dump("resid_mlp", c.n_layers - 1, a.x, step.n_tokens, c.d_model, false);
    }
    if (R == 0) return;
    // h = rmsnorm(x + moe) · gain on the logit rows only                 [R, d_model] bf16
    cuda::RmsNormArgs final_norm{.y = a.final_h, .x = a.x, .gain = weights_.final_norm.get(), .rows = step.logit_rows,
                                 .n_tokens = R, .d = c.d_model, .eps = c.norm_eps};
    if (!dump_) a.add_moe(final_norm);  // (dumps added it to every row above)
    cuda::rmsnorm(final_norm, stream_);
    mark("final_norm");
    dump("final_norm", -1, a.final_h, R, c.d_model, true);
    // logits = h · Wunembᵀ (untied, no bias)                             [R, vocab] f32
    // (a rank of a parallel layout: its vocabulary rows only, [R, dims_.vocab])
    blas_->linear({.y = a.logits, .x = a.final_h, .w = weights_.unembedding.bf16_weight(),
                   .w8 = weights_.unembedding.fp8_weight(), .n_tokens = R, .n_out = dims_.vocab, .n_in = c.d_model,
                   .y_f32 = true},
                  stream_);
    mark("unembedding");
    dump("logits", -1, a.logits, R, dims_.vocab, false);
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
        (void)c;
        const int widths[3] = {dims_.q_dim, dims_.kv_dim, dims_.kv_dim};
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
    if (sharded()) {
        gather_logits(out);
        return;
    }
    out.resize(size_t(n_logit_rows_) * config_.vocab_size);
    if (out.empty()) return;
    CUDA_CHECK(cudaMemcpyAsync(out.data(), act_->logits, out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    stream_.sync();
}

void CudaRunner::greedy(std::vector<int32_t>& out) {
    if (sharded()) {
        distributed_greedy(out);
        return;
    }
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

// Constrained rows: their masks (computed on the CPU during the forward) are uploaded and applied to
// the logits on the device, so both the greedy path and the sampler see only allowed tokens.
void CudaRunner::apply_masks(std::span<const SamplingState> state) {
    const size_t words = size_t(config_.vocab_size + 31) / 32;
    mask_rows_host_.clear();
    for (size_t r = 0; r < state.size(); ++r)
        if (state[r].allowed) mask_rows_host_.push_back(int32_t(r));
    if (mask_rows_host_.empty()) return;
    mask_host_.resize(mask_rows_host_.size() * words);
    for (size_t i = 0; i < mask_rows_host_.size(); ++i)
        std::copy_n(state[size_t(mask_rows_host_[i])].allowed, words, mask_host_.begin() + ptrdiff_t(i * words));
    if (mask_device_.size() < mask_host_.size()) mask_device_.resize(mask_host_.size());
    if (mask_rows_device_.size() < mask_rows_host_.size()) mask_rows_device_.resize(mask_rows_host_.size());
    mask_device_.upload(std::span<const uint32_t>(mask_host_), stream_.get());
    mask_rows_device_.upload(std::span<const int32_t>(mask_rows_host_), stream_.get());
    cuda::apply_token_mask({.logits = act_->logits, .ld = config_.vocab_size, .masks = mask_device_.get(),
                            .rows = mask_rows_device_.get(), .n_masked = int(mask_rows_host_.size()),
                            .vocab_size = config_.vocab_size},
                           stream_.get());
    // No synchronisation: copies from pageable memory are staged before cudaMemcpyAsync returns, and
    // the sampler synchronises the stream before its results are read.
}

void CudaRunner::sample(std::span<const SamplingParams> params, std::span<const SamplingState> state,
                        std::span<SampleResult> out) {
    OSPREY_CHECK(int(params.size()) == n_logit_rows_ && state.size() == params.size() && out.size() == params.size(),
                 "sample: ", params.size(), " parameter sets, ", state.size(), " states and ", out.size(),
                 " results for ", n_logit_rows_, " logit rows");
    apply_masks(state);
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
    if (!sharded()) {
        act_->sampler.sample(act_->logits, config_.vocab_size, 0, params, state, out, stream_);
        return;
    }
    // A split vocabulary: the group's logits are gathered and its first rank runs the one sampler on
    // whole rows (their semantics and the seeded draw need them); its results are the runner's.
    std::vector<float> full;
    gather_logits(full);
    if (options_.shard->host_vocab->rank() != 0 || full.empty()) return;
    if (full_logits_.size() < full.size()) full_logits_.resize(full.size());
    CUDA_CHECK(cudaMemcpyAsync(full_logits_.get(), full.data(), full.size() * sizeof(float), cudaMemcpyHostToDevice,
                               stream_));
    act_->sampler.sample(full_logits_.get(), config_.vocab_size, 0, params, state, out, stream_);
}

// The group's logits, every vocabulary row: each rank's [R, V_r] block, rank after rank (the vocabulary
// split of model_shard), interleaved back into rows of V on the host.
void CudaRunner::gather_logits(std::vector<float>& out) {
    const int V = config_.vocab_size, n = n_logit_rows_;
    comm::Communicator& vc = *options_.shard->host_vocab;
    std::vector<float> mine(size_t(n) * dims_.vocab);
    if (!mine.empty()) {
        CUDA_CHECK(cudaMemcpyAsync(mine.data(), act_->logits, mine.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                   stream_));
        stream_.sync();
    }
    const int ranks = vc.size();
    std::vector<size_t> counts(static_cast<size_t>(ranks));
    std::vector<ShardRange> ranges(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
        ranges[size_t(r)] = split_range(V, ranks, r);
        counts[size_t(r)] = size_t(n) * size_t(ranges[size_t(r)].count);
    }
    OSPREY_CHECK(ranges[size_t(vc.rank())].count == dims_.vocab && counts[size_t(vc.rank())] == mine.size(),
                 "cuda shard: vocabulary shard does not match the vocab group's split");
    std::vector<float> blocks(size_t(n) * V);  // [ranks][n, V_r]
    vc.all_gather_v<float>(mine, blocks, counts);
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

// Greedy over a split vocabulary: each rank's argmax and its logit (on the GPU), exchanged on the
// host, 8 bytes per row and rank; the best wins, the lowest id on ties (shards are in vocabulary
// order), as the whole-row argmax.
void CudaRunner::distributed_greedy(std::vector<int32_t>& out) {
    const int n = n_logit_rows_;
    out.resize(size_t(n));
    if (n == 0) return;
    struct Best {
        float value;    // -inf for a shard of only NaN
        int32_t token;  // global id, or -1
    };
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::vector<float> vals(static_cast<size_t>(n));
    cuda::argmax({.out = act_->greedy, .logits = act_->logits, .n_rows = n, .n_cols = dims_.vocab,
                  .scratch_val = act_->argmax_val, .scratch_idx = act_->argmax_idx, .out_val = act_->greedy_val},
                 stream_);
    CUDA_CHECK(cudaMemcpyAsync(ids.data(), act_->greedy, ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaMemcpyAsync(vals.data(), act_->greedy_val, vals.size() * sizeof(float), cudaMemcpyDeviceToHost,
                               stream_));
    stream_.sync();
    const int first = options_.shard->piece.vocab.first;
    std::vector<Best> mine(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) mine[size_t(r)] = {vals[size_t(r)], ids[size_t(r)] < 0 ? -1 : first + ids[size_t(r)]};
    comm::Communicator& vc = *options_.shard->host_vocab;
    std::vector<Best> all(size_t(n) * vc.size());  // [ranks][n]
    vc.all_gather<Best>(mine, all);
    for (int row = 0; row < n; ++row) {
        Best g{-INFINITY, -1};
        for (int r = 0; r < vc.size(); ++r) {
            const Best& b = all[size_t(r) * n + row];
            if (b.token >= 0 && (g.token < 0 || b.value > g.value)) g = b;
        }
        OSPREY_CHECK(g.token >= 0, "greedy: logit row ", row, " holds only NaN (the forward produced no finite logit)");
        out[size_t(row)] = g.token;
    }
}

}  // namespace osprey::model
