// The decode MoE block (kernels/cuda/moe_decode.h, 2 launches) next to the current MoE step (route,
// group, mlp1, mlp2, combine: "whole step (auto)"), at gpt-oss-20b / 120b shapes for T = 1, 2, 4, 8;
// and the mid-batch path (kernels/cuda/moe_mid.h: mlp1, mlp2) for T = 16, 32, 64, 128 next
// to moe_mlp1 + moe_mlp2 forced to the narrow tiling (what MoeStep ran there before) and to the
// automatic choice, all on the same grouping (route + group run once per input set, outside the
// timing), plus "mid + route + group": the launches MoeStep::run makes on the mid path. The
// "moe_mid (PDL)" line is the default variant (or $OSPREY_MOE_MID_VARIANT); each variant is also
// timed by number (moe_mid.h).
// Bytes are what must be read: the distinct active experts' MXFP4 blocks + scales + BF16 biases of
// both projections (averaged over the input sets); % is of 4.64 TB/s (H200 HBM3e, 4.8 TB/s nominal).
// Each figure is per call, from a CUDA graph of kCalls calls (as the forward replays it), median of
// kReps replays; inputs rotate over kInputs sets and weights over kLayers layers (> L2).
//   usage: bench_moe_decode [20b|120b|all] [decode|mid|both]
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/moe_decode.h"
#include "kernels/cuda/moe_group.h"
#include "kernels/cuda/moe_mid.h"
#include "kernels/cuda/moe_mlp_mxfp4.h"
#include "kernels/cuda/moe_route.h"
#include "tests/kernels/cases/moe_mlp_cases.h"

using namespace osprey;
using cuda::DeviceBuffer;

namespace {

constexpr double kHbmGBps = 4640.0;
constexpr int kLayers = 2, kInputs = 4, kTopK = 4, kCalls = 24, kReps = 15;

struct Layer {
    cases::moe_mlp::Mxfp4Projection mlp1, mlp2;  // device only (no host copies)
    Layer(int n_experts, int d_model, int d_ff, uint64_t seed)
        : mlp1(n_experts, 2 * d_ff, d_model, seed, 116), mlp2(n_experts, d_model, d_ff, seed + 7, 116) {
        // the decode-layout copies made now, not on first use inside a graph capture
        mlp1.view(cuda::Mxfp4WordLayout::decode), mlp2.view(cuda::Mxfp4WordLayout::decode);
    }
};

// Bytes of one expert's weights both projections read: MXFP4 blocks + scales + BF16 biases.
double expert_bytes(int d_model, int d_ff) {
    return 2.0 * d_ff * (d_model / 32) * 17 + 2.0 * 2 * d_ff +  // mlp1 blocks + scales + bias
           double(d_model) * (d_ff / 32) * 17 + 2.0 * d_model;  // mlp2
}

// kLayers layers of random experts (the same seeds for the decode and the mid rows).
std::vector<std::unique_ptr<Layer>> make_layers(int n_experts, int d_model, int d_ff) {
    std::vector<std::unique_ptr<Layer>> layers;
    for (int l = 0; l < kLayers; ++l)
        layers.push_back(std::make_unique<Layer>(n_experts, d_model, d_ff, 1000 + 17 * l));
    return layers;
}

// One input set's hidden states and router logits, and how many distinct experts its tokens pick.
struct InputSet {
    DeviceBuffer<bf16> h;
    DeviceBuffer<float> logits;
    int n_active = 0;
};

// Fills every set of `in` (InputSet or a type derived from it) with random h in [-2, 2) and logits in
// [-4, 4) from rng; returns the distinct active experts (top-4 per token) averaged over the sets.
template <typename Set>
double random_input_sets(std::vector<Set>& in, std::mt19937& rng, int n_tokens, int n_experts, int d_model) {
    double n_active = 0;
    for (InputSet& b : in) {
        std::uniform_real_distribution<float> uni(-4.0f, 4.0f), hx(-2.0f, 2.0f);
        std::vector<bf16> h(size_t(n_tokens) * d_model);
        std::vector<float> logits(size_t(n_tokens) * n_experts);
        for (auto& v : h) v = float_to_bf16(hx(rng));
        for (auto& v : logits) v = uni(rng);
        b.h.resize(h.size()), b.h.upload(h);
        b.logits.resize(logits.size()), b.logits.upload(logits);
        std::set<int> active;  // top-4 per token (distinct random logits: no ties to break)
        for (int t = 0; t < n_tokens; ++t) {
            std::vector<int> order(n_experts);
            for (int e = 0; e < n_experts; ++e) order[e] = e;
            const float* r = logits.data() + size_t(t) * n_experts;
            std::partial_sort(order.begin(), order.begin() + kTopK, order.end(),
                              [&](int x, int y) { return r[x] > r[y] || (r[x] == r[y] && x < y); });
            active.insert(order.begin(), order.begin() + kTopK);
        }
        b.n_active = int(active.size());
        n_active += double(b.n_active) / kInputs;
    }
    return n_active;
}

struct Inputs : InputSet {
    DeviceBuffer<float> out;
};

// MoeStep's buffers for T tokens (top-4 expert ids and weights, routed rows grouped by expert, u and
// y by routed row) and its launches before moe_combine: route + group, then mlp1 + mlp2.
struct Grouped {
    int n_tokens = 0, n_experts = 0, d_model = 0, d_ff = 0;
    DeviceBuffer<int32_t> ids, offsets, sorted, scratch;
    DeviceBuffer<float> w, y;
    DeviceBuffer<bf16> u;

    void resize(int t, int e, int dm, int dff) {
        n_tokens = t, n_experts = e, d_model = dm, d_ff = dff;
        const int rows = t * kTopK;
        w.resize(rows), y.resize(size_t(rows) * dm), u.resize(size_t(rows) * dff);
        ids.resize(rows), offsets.resize(e + 1), sorted.resize(rows);
        scratch.resize(std::max<size_t>(1, cuda::moe_group_scratch_elems(t, kTopK, e)));
    }
    void route_group(const float* logits, cudaStream_t s) {
        cuda::moe_route_topk({.expert_ids = ids.get(),
                              .expert_weights = w.get(),
                              .logits = logits,
                              .n_tokens = n_tokens,
                              .n_experts = n_experts,
                              .top_k = kTopK},
                             s);
        cuda::moe_group_by_expert({.expert_offsets = offsets.get(),
                                   .sorted_rows = sorted.get(),
                                   .scratch = scratch.get(),
                                   .expert_ids = ids.get(),
                                   .n_tokens = n_tokens,
                                   .n_experts = n_experts,
                                   .top_k = kTopK},
                                  s);
    }
    void mlp(const bf16* h, const Layer& l, cuda::MoeKernel kernel, cudaStream_t s) {
        cuda::moe_mlp1({.u = u.get(),
                        .x = h,
                        .w = l.mlp1.view(),
                        .expert_offsets = offsets.get(),
                        .sorted_rows = sorted.get(),
                        .n_tokens = n_tokens,
                        .n_experts = n_experts,
                        .top_k = kTopK,
                        .d_model = d_model,
                        .d_ff = d_ff,
                        .kernel = kernel},
                       s);
        cuda::moe_mlp2({.y = y.get(),
                        .u = u.get(),
                        .w = l.mlp2.view(),
                        .expert_offsets = offsets.get(),
                        .sorted_rows = sorted.get(),
                        .n_tokens = n_tokens,
                        .n_experts = n_experts,
                        .top_k = kTopK,
                        .d_model = d_model,
                        .d_ff = d_ff,
                        .kernel = kernel},
                       s);
    }
};

// Microseconds per fn call: kCalls calls captured in one graph, median over kReps replays.
double time_graph_us(const std::function<void(int, cudaStream_t)>& fn) {
    cuda::Stream stream;
    cuda::Graph graph;
    graph.capture(stream, [&] {
        for (int i = 0; i < kCalls; ++i) fn(i, stream);
    });
    for (int i = 0; i < 3; ++i) graph.replay(stream);
    stream.sync();
    cuda::Event a, b;
    std::vector<double> us;
    for (int r = 0; r < kReps; ++r) {
        a.record(stream);
        graph.replay(stream);
        b.record(stream);
        b.sync();
        us.push_back(1e3 * b.ms_since(a) / kCalls);
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
}

void report(const char* what, double us, double bytes) {
    const double gbps = bytes / (us * 1e3);
    std::printf("%-40s %9.2f us %9.1f GB/s (%5.1f%% of 4.64 TB/s)\n", what, us, gbps, 100.0 * gbps / kHbmGBps);
}

void run_shape(const char* name, int n_experts) {
    const int d_model = 2880, d_ff = 2880;
    std::printf("\n== gpt-oss-%s: %d experts, d_model %d, d_ff %d ==\n", name, n_experts, d_model, d_ff);
    const std::vector<std::unique_ptr<Layer>> layers = make_layers(n_experts, d_model, d_ff);
    DeviceBuffer<uint8_t> ws(cuda::moe_decode_workspace_bytes(n_experts, d_model, d_ff));
    ws.fill_bytes(0);
    std::mt19937 rng(42);

    for (int n_tokens : {1, 2, 4, 8}) {
        std::vector<Inputs> in(kInputs);
        const double n_active = random_input_sets(in, rng, n_tokens, n_experts, d_model);
        for (auto& b : in) b.out.resize(size_t(n_tokens) * d_model);
        const double bytes = n_active * expert_bytes(d_model, d_ff);
        std::printf("-- %d token%s, %.2f distinct experts on average (%.1f MB of weights per call)\n", n_tokens,
                    n_tokens > 1 ? "s" : "", n_active, bytes / 1e6);

        auto decode = [&](int i, cudaStream_t s, bool pdl,
                          cuda::Mxfp4WordLayout words = cuda::Mxfp4WordLayout::published) {
            Inputs& b = in[i % kInputs];
            const Layer& l = *layers[i % kLayers];
            cuda::moe_decode({.out = b.out.get(),
                              .router = b.logits.get(),
                              .h = b.h.get(),
                              .mlp1 = l.mlp1.view(words),
                              .mlp2 = l.mlp2.view(words),
                              .workspace = ws.get(),
                              .n_tokens = n_tokens,
                              .n_experts = n_experts,
                              .top_k = kTopK,
                              .d_model = d_model,
                              .d_ff = d_ff,
                              .words = words,
                              .pdl = pdl},
                             s);
        };
        Grouped g;  // the current path's buffers (MoeStep's workspace)
        g.resize(n_tokens, n_experts, d_model, d_ff);
        auto step = [&](int i, cudaStream_t s) {
            Inputs& b = in[i % kInputs];
            g.route_group(b.logits.get(), s);
            g.mlp(b.h.get(), *layers[i % kLayers], cuda::MoeKernel::automatic, s);
            cuda::moe_combine({.out = b.out.get(),
                               .y = g.y.get(),
                               .expert_weights = g.w.get(),
                               .n_tokens = n_tokens,
                               .d_model = d_model,
                               .top_k = kTopK,
                               .mode = cuda::MoeCombineMode::overwrite},
                              s);
        };
        decode(0, nullptr, true);  // first call outside capture (one-time kernel attributes)
        CUDA_CHECK(cudaDeviceSynchronize());
        char label[96];
        std::snprintf(label, sizeof label, "%s %d tok moe_decode (PDL)", name, n_tokens);
        const double t_pdl = time_graph_us([&](int i, cudaStream_t s) { decode(i, s, true); });
        report(label, t_pdl, bytes);
        std::snprintf(label, sizeof label, "%s %d tok moe_decode (no PDL)", name, n_tokens);
        report(label, time_graph_us([&](int i, cudaStream_t s) { decode(i, s, false); }), bytes);
        std::snprintf(label, sizeof label, "%s %d tok moe_decode decode layout", name, n_tokens);
        const double t_dec = time_graph_us([&](int i, cudaStream_t s) { decode(i, s, true, cuda::Mxfp4WordLayout::decode); });
        report(label, t_dec, bytes);
        std::printf("%-40s %9.2fx\n", "   speed-up of the decode layout", t_pdl / t_dec);
        std::snprintf(label, sizeof label, "%s %d tok whole step (auto)", name, n_tokens);
        const double t_step = time_graph_us(step);
        report(label, t_step, bytes);
        std::printf("%-40s %9.2fx\n", "   speed-up", t_step / t_pdl);
    }
}

// The mid-batch path at T = 16..128 (see the top of the file).
struct MidInputs : InputSet {
    Grouped g;
};

void run_mid_shape(const char* name, int n_experts) {
    const int d_model = 2880, d_ff = 2880;
    std::printf("\n== gpt-oss-%s mid batches: %d experts, d_model %d, d_ff %d ==\n", name, n_experts, d_model, d_ff);
    const std::vector<std::unique_ptr<Layer>> layers = make_layers(n_experts, d_model, d_ff);
    constexpr int kMaxMid = 128;
    DeviceBuffer<uint8_t> ws(cuda::moe_mid_workspace_bytes(kMaxMid, d_model, d_ff));
    std::mt19937 rng(42);

    for (int n_tokens : {16, 32, 64, 128}) {
        const int rows = n_tokens * kTopK;
        std::vector<MidInputs> in(kInputs);
        const double n_active = random_input_sets(in, rng, n_tokens, n_experts, d_model);
        for (auto& b : in) b.g.resize(n_tokens, n_experts, d_model, d_ff);
        const double bytes = n_active * expert_bytes(d_model, d_ff);
        std::printf("-- %d tokens, %.2f distinct experts on average, %.1f routed rows per active expert (%.1f MB of "
                    "weights per call)\n",
                    n_tokens, n_active, rows / n_active, bytes / 1e6);

        auto mid = [&](int i, cudaStream_t s, bool pdl, int variant = -1) {
            MidInputs& b = in[i % kInputs];
            const Layer& l = *layers[i % kLayers];
            cuda::moe_mid({.y = b.g.y.get(),
                           .h = b.h.get(),
                           .mlp1 = l.mlp1.view(),
                           .mlp2 = l.mlp2.view(),
                           .expert_offsets = b.g.offsets.get(),
                           .sorted_rows = b.g.sorted.get(),
                           .workspace = ws.get(),
                           .max_tokens = kMaxMid,
                           .n_tokens = n_tokens,
                           .n_experts = n_experts,
                           .top_k = kTopK,
                           .d_model = d_model,
                           .d_ff = d_ff,
                           .pdl = pdl,
                           .variant = variant},
                          s);
        };
        auto grouped = [&](int i, cudaStream_t s, cuda::MoeKernel kernel) {
            MidInputs& b = in[i % kInputs];
            b.g.mlp(b.h.get(), *layers[i % kLayers], kernel, s);
        };
        for (auto& b : in) b.g.route_group(b.logits.get(), nullptr);  // the grouping the timed calls reuse
        mid(0, nullptr, true);  // first call outside capture (one-time kernel attributes)
        CUDA_CHECK(cudaDeviceSynchronize());
        char label[96];
        std::snprintf(label, sizeof label, "%s %d tok moe_mid (PDL)", name, n_tokens);
        const double t_mid = time_graph_us([&](int i, cudaStream_t s) { mid(i, s, true); });
        report(label, t_mid, bytes);
        std::snprintf(label, sizeof label, "%s %d tok moe_mid (no PDL)", name, n_tokens);
        report(label, time_graph_us([&](int i, cudaStream_t s) { mid(i, s, false); }), bytes);
        for (int v = 0; v < cuda::kMoeMidVariants; ++v) {
            std::snprintf(label, sizeof label, "%s %d tok moe_mid variant %d", name, n_tokens, v);
            report(label, time_graph_us([&](int i, cudaStream_t s) { mid(i, s, true, v); }), bytes);
        }
        std::snprintf(label, sizeof label, "%s %d tok mid + route + group", name, n_tokens);
        report(label, time_graph_us([&](int i, cudaStream_t s) {
                   MidInputs& b = in[i % kInputs];
                   b.g.route_group(b.logits.get(), s);
                   mid(i, s, true);
               }),
               bytes);
        std::snprintf(label, sizeof label, "%s %d tok mlp1+mlp2 narrow", name, n_tokens);
        const double t_narrow =
            time_graph_us([&](int i, cudaStream_t s) { grouped(i, s, cuda::MoeKernel::narrow); });
        report(label, t_narrow, bytes);
        std::snprintf(label, sizeof label, "%s %d tok mlp1+mlp2 auto", name, n_tokens);
        report(label, time_graph_us([&](int i, cudaStream_t s) { grouped(i, s, cuda::MoeKernel::automatic); }), bytes);
        std::printf("%-40s %9.2fx\n", "   speed-up over narrow", t_narrow / t_mid);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const std::string which = argc > 1 ? argv[1] : "all";
    const std::string paths = argc > 2 ? argv[2] : "both";
    std::printf("bench_moe_decode on %s (graph replays of %d calls, median of %d)\n", cuda::device_name().c_str(),
                kCalls, kReps);
    const bool decode = paths == "decode" || paths == "both", mid = paths == "mid" || paths == "both";
    if (decode && (which == "20b" || which == "all")) run_shape("20b", 32);
    if (decode && (which == "120b" || which == "all")) run_shape("120b", 128);
    if (mid && (which == "20b" || which == "all")) run_mid_shape("20b", 32);
    if (mid && (which == "120b" || which == "all")) run_mid_shape("120b", 128);
    return 0;
}
