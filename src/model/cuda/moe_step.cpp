#include "model/cuda/moe_step.h"

#include "core/check.h"
#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/moe_decode.h"
#include "kernels/cuda/moe_group.h"
#include "kernels/cuda/moe_mid.h"
#include "kernels/cuda/moe_mlp_matrix.h"
#include "kernels/cuda/moe_mlp_mxfp4.h"
#include "kernels/cuda/moe_mlp_w4a8.h"
#include "kernels/cuda/moe_route.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace osprey::model {

namespace {

int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    OSPREY_CHECK(end && *end == '\0' && n >= 0 && n <= 1 << 20, "$", name, " = '", v, "' is not a token count");
    return int(n);
}

// The token range of the mid-batch path: off unless $OSPREY_MOE_MID=1 (its first version measured 3.5x
// slower than the grouped GEMMs on the H200, the restructured one still slower from 64 tokens and never
// faster than the automatic choice: docs/performance.md, "Fifth session"); $OSPREY_MOE_MID_MIN / $OSPREY_MOE_MID_MAX move its bounds (defaults kMoeMidMinTokens..kMoeMidMaxTokens).
struct MidRange {
    bool on;
    int min, max;
};
MidRange mid_range() {
    const char* env = std::getenv("OSPREY_MOE_MID");
    MidRange r{env && std::string(env) == "1", env_int("OSPREY_MOE_MID_MIN", cuda::kMoeMidMinTokens),
               env_int("OSPREY_MOE_MID_MAX", cuda::kMoeMidMaxTokens)};
    if (r.max < r.min) r.on = false;
    return r;
}

// The largest batch the mid path's workspace is sized for.
int mid_capacity(int max_tokens) {
    const MidRange r = mid_range();
    return r.on ? std::min(max_tokens, r.max) : 0;
}

}  // namespace

size_t MoeStep::workspace_bytes(const Config& c, int max_tokens, bool w4a8, WeightFormat experts) {
    using W = cuda::Workspace;
    const size_t rows = size_t(max_tokens) * c.top_k;
    const size_t common = W::bytes_for<int32_t>(rows) + W::bytes_for<float>(rows) +
                          W::bytes_for<int32_t>(c.n_experts + 1) + W::bytes_for<int32_t>(rows) +
                          W::bytes_for<int32_t>(std::max<size_t>(1, cuda::moe_group_scratch_elems(max_tokens, c.top_k, c.n_experts))) +
                          W::bytes_for<bf16>(rows * c.d_ff) + W::bytes_for<float>(rows * c.d_model);
    if (experts == WeightFormat::fp8)
        return common + W::bytes_for<uint8_t>(cuda::moe_matrix_workspace_bytes(cuda::MatrixFormat::fp8, max_tokens,
                                                                               c.top_k, c.d_model, c.d_ff));
    if (experts == WeightFormat::bf16) return common;
    return common + W::bytes_for<uint8_t>(cuda::moe_decode_workspace_bytes(c.n_experts, c.d_model, c.d_ff)) +
           W::bytes_for<uint8_t>(cuda::moe_mid_workspace_bytes(mid_capacity(max_tokens), c.d_model, c.d_ff)) +
           (w4a8 ? W::bytes_for<uint8_t>(cuda::moe_w4a8_workspace_bytes(max_tokens, c.top_k, c.d_model, c.d_ff)) : 0);
}

MoeStep MoeStep::carve(const Config& c, int max_tokens, cuda::Workspace& ws, bool w4a8, WeightFormat experts) {
    const size_t rows = size_t(max_tokens) * c.top_k;
    MoeStep m;
    m.expert_ids = ws.take<int32_t>(rows, "moe expert ids");
    m.expert_weights = ws.take<float>(rows, "moe expert weights");
    m.expert_offsets = ws.take<int32_t>(c.n_experts + 1, "moe expert offsets");
    m.sorted_rows = ws.take<int32_t>(rows, "moe sorted rows");
    m.group_scratch = ws.take<int32_t>(
        std::max<size_t>(1, cuda::moe_group_scratch_elems(max_tokens, c.top_k, c.n_experts)), "moe group scratch");
    m.u = ws.take<bf16>(rows * c.d_ff, "moe u");
    m.y = ws.take<float>(rows * c.d_model, "moe y");
    m.experts = experts;
    if (experts != WeightFormat::mxfp4) {  // matrix experts: moe_matrix for every batch
        m.use_decode_path = false;
        m.mid_max_tokens = 0;
        if (experts == WeightFormat::fp8)
            m.matrix_workspace = ws.take<uint8_t>(
                cuda::moe_matrix_workspace_bytes(cuda::MatrixFormat::fp8, max_tokens, c.top_k, c.d_model, c.d_ff),
                "moe W8A8 activations");
        return m;
    }
    const size_t decode_bytes = cuda::moe_decode_workspace_bytes(c.n_experts, c.d_model, c.d_ff);
    m.decode_workspace = ws.take<uint8_t>(decode_bytes, "moe decode");
    const char* env = std::getenv("OSPREY_MOE_DECODE");
    m.use_decode_path = !(env && std::string(env) == "0");
    m.mid_max_tokens = mid_capacity(max_tokens);
    const size_t mid_bytes = cuda::moe_mid_workspace_bytes(m.mid_max_tokens, c.d_model, c.d_ff);
    m.mid_workspace = ws.take<uint8_t>(mid_bytes, "moe mid");
    const MidRange r = mid_range();
    m.mid_min_tokens = r.on ? std::max(1, r.min) : 1;
    if (!r.on) m.mid_max_tokens = 0;
    if (w4a8) {
        m.w4a8_workspace =
            ws.take<uint8_t>(cuda::moe_w4a8_workspace_bytes(max_tokens, c.top_k, c.d_model, c.d_ff), "moe w4a8");
        m.use_w4a8 = true;
    }
    return m;
}

MoeOutputs MoeStep::run(const Config& c, const DeviceLayer& w, const bf16* h, const float* router, int n_tokens,
                        cudaStream_t stream) const {
    OSPREY_CHECK(w.experts == experts, "moe step: carved for ", weight_format_name(experts), " experts, the layer holds ",
                 weight_format_name(w.experts));
    if (experts != WeightFormat::mxfp4) return launch_experts(c, MoeExperts::whole(c), w, h, router, n_tokens, stream);
    if (use_decode_path && n_tokens <= cuda::kMoeDecodeMaxTokens) {
        // Decode: routing, experts and the weighted sum in two launches streaming the active experts once,
        // from the decode-layout copy of the blocks when there is one (DeviceWeights::add_decode_copies).
        const bool dec = w.mlp1_blocks_decode.size() != 0;
        cuda::moe_decode({.out = nullptr, .router = router, .h = h,
                          .mlp1 = {dec ? w.mlp1_blocks_decode.get() : w.mlp1_blocks.get(), w.mlp1_scales.get(),
                                   w.mlp1_bias.get()},
                          .mlp2 = {dec ? w.mlp2_blocks_decode.get() : w.mlp2_blocks.get(), w.mlp2_scales.get(),
                                   w.mlp2_bias.get()},
                          .workspace = decode_workspace, .n_tokens = n_tokens, .n_experts = c.n_experts,
                          .top_k = c.top_k, .d_model = c.d_model, .d_ff = c.d_ff, .swiglu_alpha = c.swiglu_alpha,
                          .swiglu_limit = c.swiglu_limit,
                          .words = dec ? cuda::Mxfp4WordLayout::decode : cuda::Mxfp4WordLayout::published},
                         stream);
        const cuda::MoeDecodeOutputs o = cuda::moe_decode_outputs(decode_workspace, c.d_model, c.d_ff);
        return {o.y, o.w};
    }
    if (n_tokens >= mid_min_tokens && n_tokens <= mid_max_tokens &&
        cuda::moe_mid_supports(c.n_experts, c.d_model, c.d_ff, c.top_k)) {
        // Mid-sized batches: route and group, then gather + mlp1 + mlp2 streaming each active expert once.
        cuda::moe_route_topk({.expert_ids = expert_ids, .expert_weights = expert_weights, .logits = router,
                              .n_tokens = n_tokens, .n_experts = c.n_experts, .top_k = c.top_k},
                             stream);
        cuda::moe_group_by_expert({.expert_offsets = expert_offsets, .sorted_rows = sorted_rows,
                                   .scratch = group_scratch, .expert_ids = expert_ids, .n_tokens = n_tokens,
                                   .n_experts = c.n_experts, .top_k = c.top_k},
                                  stream);
        cuda::moe_mid({.y = y, .h = h, .mlp1 = {w.mlp1_blocks.get(), w.mlp1_scales.get(), w.mlp1_bias.get()},
                       .mlp2 = {w.mlp2_blocks.get(), w.mlp2_scales.get(), w.mlp2_bias.get()},
                       .expert_offsets = expert_offsets, .sorted_rows = sorted_rows, .workspace = mid_workspace,
                       .max_tokens = mid_max_tokens, .n_tokens = n_tokens, .n_experts = c.n_experts,
                       .top_k = c.top_k, .d_model = c.d_model, .d_ff = c.d_ff, .swiglu_alpha = c.swiglu_alpha,
                       .swiglu_limit = c.swiglu_limit},
                      stream);
        return {y, expert_weights};
    }
    return launch_experts(c, MoeExperts::whole(c), w, h, router, n_tokens, stream);
}

void MoeStep::run(const Config& c, const MoeExperts& e, const DeviceLayer& w, const bf16* h, const float* router,
                  float* moe, int n_tokens, cudaStream_t stream) const {
    if (e.count == 0 || e.d_ff == 0) {  // no columns on this rank (more ranks than MXFP4 groups)
        CUDA_CHECK(cudaMemsetAsync(moe, 0, size_t(n_tokens) * c.d_model * sizeof(float), stream));
        return;
    }
    const MoeOutputs o =
        e.is_whole(c) ? run(c, w, h, router, n_tokens, stream) : launch_experts(c, e, w, h, router, n_tokens, stream);
    // moe = Σ_slot w · y                                                 [T, d_model] f32
    cuda::moe_combine({.out = moe, .y = o.y, .expert_weights = o.w, .n_tokens = n_tokens, .d_model = c.d_model,
                       .top_k = c.top_k, .mode = cuda::MoeCombineMode::overwrite},
                      stream);
}

MoeOutputs MoeStep::launch_experts(const Config& c, const MoeExperts& e, const DeviceLayer& w, const bf16* h,
                                   const float* router, int n_tokens, cudaStream_t stream) const {
    // top-4 over every expert (the router is replicated), softmax over those four   [T, top_k]
    cuda::moe_route_topk({.expert_ids = expert_ids, .expert_weights = expert_weights, .logits = router,
                          .n_tokens = n_tokens, .n_experts = c.n_experts, .top_k = c.top_k},
                         stream);
    // the rows routed to e's experts, grouped by (local) expert (deterministic counting sort)
    cuda::moe_group_by_expert({.expert_offsets = expert_offsets, .sorted_rows = sorted_rows, .scratch = group_scratch,
                               .expert_ids = expert_ids, .n_tokens = n_tokens, .n_experts = e.count,
                               .first_expert = e.first, .top_k = c.top_k},
                              stream);
    // Matrix experts (every batch size): W8A8 (quantise h, mlp1, quantise u, mlp2 on FP8 wgmma) or BF16
    // wgmma. Other ranks' rows are not written by mlp2: zeroed first, as below.
    if (experts != WeightFormat::mxfp4) {
        OSPREY_CHECK(w.experts == experts, "moe step: carved for ", weight_format_name(experts),
                     " experts, the layer holds ", weight_format_name(w.experts));
        if (!e.is_whole(c))
            CUDA_CHECK(cudaMemsetAsync(y, 0, size_t(n_tokens) * c.top_k * c.d_model * sizeof(float), stream));
        const bool fp8 = experts == WeightFormat::fp8;
        cuda::moe_matrix({.y = y, .u = u, .x = h, .format = fp8 ? cuda::MatrixFormat::fp8 : cuda::MatrixFormat::bf16,
                          .mlp1 = {w.mlp1_w.get(), fp8 ? w.mlp1_w_scale.get() : nullptr, w.mlp1_bias.get()},
                          .mlp2 = {w.mlp2_w.get(), fp8 ? w.mlp2_w_scale.get() : nullptr, w.mlp2_bias.get()},
                          .expert_offsets = expert_offsets, .sorted_rows = sorted_rows, .workspace = matrix_workspace,
                          .n_tokens = n_tokens, .n_experts = e.count, .top_k = c.top_k, .d_model = c.d_model,
                          .d_ff = e.d_ff, .swiglu_alpha = c.swiglu_alpha, .swiglu_limit = c.swiglu_limit},
                         stream);
        return {y, expert_weights};
    }
    // W4A8 (prefill-sized batches): quantise h, mlp1, quantise u, mlp2 on FP8 wgmma. Other ranks' rows
    // are not written by mlp2: zeroed first, as below.
    if (use_w4a8 && cuda::moe_w4a8_wanted(n_tokens, c.top_k, e.count) && cuda::moe_w4a8_supports(c.d_model, e.d_ff)) {
        if (!e.is_whole(c))
            CUDA_CHECK(cudaMemsetAsync(y, 0, size_t(n_tokens) * c.top_k * c.d_model * sizeof(float), stream));
        cuda::moe_w4a8({.y = y, .u = u, .x = h, .mlp1 = {w.mlp1_blocks.get(), w.mlp1_scales.get(), w.mlp1_bias.get()},
                        .mlp2 = {w.mlp2_blocks.get(), w.mlp2_scales.get(), w.mlp2_bias.get()},
                        .expert_offsets = expert_offsets, .sorted_rows = sorted_rows, .workspace = w4a8_workspace,
                        .n_tokens = n_tokens, .n_experts = e.count, .top_k = c.top_k, .d_model = c.d_model,
                        .d_ff = e.d_ff, .swiglu_alpha = c.swiglu_alpha, .swiglu_limit = c.swiglu_limit},
                       stream);
        return {y, expert_weights};
    }
    // u = clamped swiglu(h · W1_eᵀ + b1_e)                              [T * top_k, e.d_ff] bf16
    cuda::moe_mlp1({.u = u, .x = h, .w = {w.mlp1_blocks.get(), w.mlp1_scales.get(), w.mlp1_bias.get()},
                    .expert_offsets = expert_offsets, .sorted_rows = sorted_rows, .n_tokens = n_tokens,
                    .n_experts = e.count, .top_k = c.top_k, .d_model = c.d_model, .d_ff = e.d_ff,
                    .swiglu_alpha = c.swiglu_alpha, .swiglu_limit = c.swiglu_limit},
                   stream);
    // other ranks' rows are not written by mlp2: zero, so the weighted sum skips them
    if (!e.is_whole(c))
        CUDA_CHECK(cudaMemsetAsync(y, 0, size_t(n_tokens) * c.top_k * c.d_model * sizeof(float), stream));
    // y = u · W2_eᵀ + b2_e                                               [T * top_k, d_model] f32
    cuda::moe_mlp2({.y = y, .u = u, .w = {w.mlp2_blocks.get(), w.mlp2_scales.get(), w.mlp2_bias.get()},
                    .expert_offsets = expert_offsets, .sorted_rows = sorted_rows, .n_tokens = n_tokens,
                    .n_experts = e.count, .top_k = c.top_k, .d_model = c.d_model, .d_ff = e.d_ff},
                   stream);
    return {y, expert_weights};
}

}  // namespace osprey::model
