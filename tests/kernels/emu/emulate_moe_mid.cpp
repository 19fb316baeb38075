// Runs the mid-batch MoE kernels' device code (extracted from src/kernels/cuda/moe_mid.cu into
// moe_mid_emulated.h by scripts/emulate_moe_mid.sh) on the CPU emulation and compares u and y with
// the CPU reference (routing, mxfp4_matmul, swiglu), for small shapes with full and partial k-steps
// and k-blocks and short last row tiles, 9..40 tokens, random / tied / skewed routings (one expert
// gets every token; most experts get none), and grids from 2 CTAs (long item ranges: the ring and
// the item slots wrap many times) to one CTA per SM. Dynamic shared memory starts as NaN bytes, and
// the u tiles too, so data read from stages the bulk copies did not fill would show.
//   usage: emulate_moe_mid [seed]
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "kernels/cpu/mxfp4_matmul.h"
#include "kernels/cpu/routing.h"
#include "kernels/cpu/swiglu.h"
#include "moe_mid_emulated.h"

namespace osprey::cuda {

bool moe_mid_l2_prefetch_default() {
    return true;
}
int moe_mid_default_variant() {
    return 0;
}

void emu_grid(void (*kernel)(Params), const Params& p, int grid, size_t smem) {
    std::vector<uint8_t> dyn(smem + 256);
    for (int b = 0; b < grid; ++b) {
        std::fill(dyn.begin(), dyn.end(), 0xFF);
        g_dyn_smem = dyn.data() + (128 - reinterpret_cast<uintptr_t>(dyn.data()) % 128) % 128;
        std::barrier<> block(kThreads);
        std::vector<std::unique_ptr<std::barrier<>>> warps;
        for (int w = 0; w < kWarps; ++w) warps.push_back(std::make_unique<std::barrier<>>(32));
        g_block = &block;
        g_warp.clear();
        for (auto& w : warps) g_warp.push_back(w.get());
        g_slots.assign(kWarps, Slot{});
        g_mma.assign(kWarps, {});
        gridDim.x = unsigned(grid);
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t)
            threads.emplace_back([&, t] {
                threadIdx.x = unsigned(t);
                blockIdx.x = unsigned(b);
                kernel(p);
            });
        for (auto& th : threads) th.join();
    }
}

// moe_mid() with the launches emulated; grid: the CTAs of each projection (one per SM on the GPU).
void emu_moe_mid(const MoeMidArgs& a, int grid, int v) {
    check_args(a);
    const Plan pl = plan(a, v);
    blockDim.x = 256;
    const int64_t units = int64_t(pl.n_kb1) * pl.n_rows * 32;
    for (int64_t id = 0; id < (units + 255) / 256 * 256; ++id) {
        blockIdx.x = unsigned(id / 256), threadIdx.x = unsigned(id % 256);
        gather_kernel(pl.x, reinterpret_cast<const __nv_bfloat16*>(a.h), a.sorted_rows, pl.n_rows, pl.n_kb1, a.d_model);
    }
    emu_grid(pl.v.mlp1, pl.p1, grid, pl.smem1);
    emu_grid(pl.v.mlp2, pl.p2, grid, pl.smem2);
}

size_t emu_workspace_bytes(int max_tokens, int d_model, int d_ff) {
    return layout(max_tokens, d_model, d_ff).total;
}

}  // namespace osprey::cuda

using namespace osprey;

namespace {

int failures = 0, checks = 0;

struct Shape {
    const char* name;
    int n_experts, d_model, d_ff;
};

struct Weights {
    int n_experts, n_out, n_in;
    std::vector<uint8_t> blocks, scales;
    std::vector<bf16> bias;
    std::vector<float> bias_f;
    Weights(int e, int n_out_, int n_in_, std::mt19937& rng) : n_experts(e), n_out(n_out_), n_in(n_in_) {
        blocks.resize(size_t(e) * n_out * n_in / 2);
        scales.resize(size_t(e) * n_out * n_in / 32);
        for (auto& b : blocks) b = uint8_t(rng());
        for (auto& s : scales) s = uint8_t(116 + rng() % 7);
        for (size_t i = 0; i < scales.size(); i += 37)
            scales[i] = uint8_t(rng() % 2 ? 34 + rng() % 30 : 140 + rng() % 21);
        bias.resize(size_t(e) * n_out), bias_f.resize(bias.size());
        std::uniform_real_distribution<float> u(-0.5f, 0.5f);
        for (size_t i = 0; i < bias.size(); ++i) bias[i] = float_to_bf16(u(rng)), bias_f[i] = bf16_to_float(bias[i]);
    }
    std::vector<float> matmul(int e, const std::vector<float>& x, int n) const {
        std::vector<float> y(size_t(n) * n_out);
        const size_t bb = size_t(n_out) * n_in / 2, sb = size_t(n_out) * n_in / 32;
        cpu::mxfp4_matmul(y, x, std::span(blocks).subspan(e * bb, bb), std::span(scales).subspan(e * sb, sb),
                          std::span(bias_f).subspan(size_t(e) * n_out, n_out), n, n_in, n_out);
        return y;
    }
    // |W_e| · x + |b_e| (x >= 0): the magnitude a dot product's rounding error scales with.
    std::vector<float> abs_matmul(int e, const std::vector<float>& x) const {
        const size_t bb = size_t(n_out) * n_in / 2, sb = size_t(n_out) * n_in / 32;
        std::vector<uint8_t> b(blocks.begin() + e * bb, blocks.begin() + (e + 1) * bb);
        for (uint8_t& v : b) v &= 0x77;
        std::vector<float> bias_abs(bias_f.begin() + size_t(e) * n_out, bias_f.begin() + size_t(e + 1) * n_out);
        for (float& v : bias_abs) v = std::fabs(v);
        std::vector<float> y(n_out);
        cpu::mxfp4_matmul(y, x, b, std::span(scales).subspan(e * sb, sb), bias_abs, 1, n_in, n_out);
        return y;
    }
};

// |got - want| <= rel * max|want| + extra[i]: extra is the summation-order term of each element (the
// kernels and the reference add the same exact products in different orders; with the extreme scale
// bytes of some groups, terms of 2^25 and more cancel, so that the order alone moves a result by
// units: 2^-14 of Σ|w·x| per dot product, as tests/kernels/moe_block_check.h bounds it).
void compare(const char* what, const std::string& tag, const std::vector<float>& got, const std::vector<float>& want,
             const std::vector<float>& extra, int cols, double rel) {
    ++checks;
    double mx = 0;
    for (float w : want) mx = std::max(mx, double(std::fabs(w)));
    double worst = -1;
    size_t wi = 0, bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double bound = rel * mx + extra[i] + 1e-30;
        const double e = std::isfinite(got[i]) ? std::fabs(double(got[i]) - want[i]) / bound : INFINITY;
        if (!(e <= 1)) ++bad;
        if (!(e <= worst)) worst = e, wi = i;
    }
    if (bad) {
        ++failures;
        std::printf(
            "FAIL %s %s: %zu of %zu bad; worst row %zu col %zu got %g want %g (%.3g x bound, max|want| %g, order "
            "term %g)\n",
            tag.c_str(), what, bad, got.size(), wi / cols, wi % cols, got[wi], want[wi], worst, mx, extra[wi]);
    }
}

// routing: 0 random, 1 ties, 2 every token on experts 1, 2, E-1, E-3 (skewed: 4 experts get all
// tokens, the others none), 3 expert 0 first for every token, the other three random.
void run(const Shape& s, const Weights& w1, const Weights& w2, int n_tokens, int routing, int grid, int variant,
         std::mt19937& rng) {
    const int E = s.n_experts;
    std::uniform_real_distribution<float> ux(-2.0f, 2.0f), ul(-4.0f, 4.0f);
    std::vector<bf16> h(size_t(n_tokens) * s.d_model);
    std::vector<float> hf(h.size()), logits(size_t(n_tokens) * E);
    for (size_t i = 0; i < h.size(); ++i) h[i] = float_to_bf16(ux(rng)), hf[i] = bf16_to_float(h[i]);
    for (auto& l : logits) l = ul(rng);
    for (int t = 0; t < n_tokens; ++t) {
        float* r = logits.data() + size_t(t) * E;
        if (routing == 1)
            for (int e = 0; e < E; ++e) r[e] = std::round(r[e] / 3.0f);
        if (routing == 2)
            for (int e : {1, 2, E - 1, E - 3}) r[e] += 50.0f;
        if (routing == 3) r[0] += 50.0f;
    }
    const int rows = n_tokens * 4;
    std::vector<int32_t> ids(rows);
    std::vector<float> wt(rows);
    cpu::route_topk_softmax(ids, wt, logits, n_tokens, E, 4);
    // moe_group_by_expert: offsets and rows by expert, then by routed row.
    std::vector<int32_t> offsets(E + 1, 0), sorted;
    for (int e = 0; e < E; ++e) {
        offsets[e] = int(sorted.size());
        for (int r = 0; r < rows; ++r)
            if (ids[r] == e) sorted.push_back(r);
    }
    offsets[E] = rows;
    // Reference (u per sorted row, y per routed row).
    std::vector<float> u_ref(size_t(rows) * s.d_ff), y_ref(size_t(rows) * s.d_model);
    std::vector<float> u_extra(u_ref.size()), y_extra(y_ref.size());
    constexpr double kOrder = 1.0 / 16384;  // 2^-14 of Σ|w·x|
    for (int p = 0; p < rows; ++p) {
        const int r = sorted[p];
        const std::vector<float> x(hf.begin() + size_t(r / 4) * s.d_model, hf.begin() + size_t(r / 4 + 1) * s.d_model);
        std::vector<float> xa(x);
        for (float& v : xa) v = std::fabs(v);
        const std::vector<float> a = w1.matmul(ids[r], x, 1), a_abs = w1.abs_matmul(ids[r], xa);
        std::vector<float> u(s.d_ff), v(s.d_ff);
        cpu::swiglu_clamped(u, a, 1, s.d_ff, 1.702f, 7.0f);
        for (int j = 0; j < s.d_ff; ++j) {
            // SwiGLU's slope in gate and up together is at most 16 inside the clamp.
            const double extra = 16 * kOrder * std::max(a_abs[2 * j], a_abs[2 * j + 1]);
            u_extra[size_t(p) * s.d_ff + j] = float(extra);
            u_ref[size_t(p) * s.d_ff + j] = u[j], u[j] = round_to_bf16(u[j]);
            v[j] = float(extra + (1.0 / 128) * std::fabs(u[j]));  // and a BF16 rounding flip of u
        }
        const std::vector<float> y = w2.matmul(ids[r], u, 1), y_abs = w2.abs_matmul(ids[r], v);
        std::copy(y.begin(), y.end(), y_ref.begin() + size_t(r) * s.d_model);
        std::copy(y_abs.begin(), y_abs.end(), y_extra.begin() + size_t(r) * s.d_model);
    }
    const size_t ws_bytes = cuda::emu_workspace_bytes(n_tokens, s.d_model, s.d_ff);
    std::vector<uint8_t> ws_mem(ws_bytes + 256, 0xFF);  // u and x tiles poisoned (NaN)
    uint8_t* ws = ws_mem.data() + (256 - reinterpret_cast<uintptr_t>(ws_mem.data()) % 256) % 256;
    std::vector<float> y(size_t(rows) * s.d_model, NAN);
    const cuda::MoeMidArgs a{.y = y.data(),
                             .h = h.data(),
                             .mlp1 = {w1.blocks.data(), w1.scales.data(), w1.bias.data()},
                             .mlp2 = {w2.blocks.data(), w2.scales.data(), w2.bias.data()},
                             .expert_offsets = offsets.data(),
                             .sorted_rows = sorted.data(),
                             .workspace = ws,
                             .max_tokens = n_tokens,
                             .n_tokens = n_tokens,
                             .n_experts = E,
                             .top_k = 4,
                             .d_model = s.d_model,
                             .d_ff = s.d_ff};
    cuda::emu_moe_mid(a, grid, variant);
    char tag[160];
    std::snprintf(tag, sizeof tag, "[%s T=%d routing=%d grid=%d variant=%d]", s.name, n_tokens, routing, grid, variant);
    std::vector<float> u(size_t(rows) * s.d_ff);
    const bf16* ud = reinterpret_cast<const bf16*>(ws);
    for (int p = 0; p < rows; ++p)
        for (int j = 0; j < s.d_ff; ++j)
            u[size_t(p) * s.d_ff + j] = bf16_to_float(ud[cuda::moe_mid_act_index(p, j, rows)]);
    compare("u", tag, u, u_ref, u_extra, s.d_ff, 1.0 / 64);
    compare("y", tag, y, y_ref, y_extra, s.d_model, 1.0 / 64);
    std::printf("%s done\n", tag);
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    const unsigned seed = argc > 1 ? unsigned(std::atoi(argv[1])) : 1u;
    const bool variants_only = argc > 2 && std::string(argv[2]) == "variants";
    std::mt19937 rng(seed);
    // tiny: one k-block with one k-step; odd: mlp1 3 groups (a partial k-step, lanes c = 3 idle),
    // 320 rows (a 64-row last tile), mlp2 5 groups (the second k-step has one group) and 96 rows
    // (warps 6 and 7 idle); mid: 2 full k-blocks / 9 groups (a one-group last k-block), 576 and 512
    // rows, 16 experts.
    const Shape shapes[] = {{"tiny", 8, 128, 128}, {"odd", 6, 96, 160}, {"mid", 16, 512, 288}};
    for (const Shape& s : shapes) {
        const Weights w1(s.n_experts, 2 * s.d_ff, s.d_model, rng), w2(s.n_experts, s.d_model, s.d_ff, rng);
        if (!variants_only)
            for (int grid : {2, 7, 132})
                for (int t : {9, 16, 31, 40})
                    for (int routing : {0, 1, 2, 3}) {
                        if (s.name[0] == 'm' && (grid == 7 || t == 16)) continue;  // keep the mid shape short
                        if (grid == 7 && routing == 1) continue;
                        run(s, w1, w2, t, routing, grid, 0, rng);
                    }
        // The other variants (16- and 32-row token blocks: skewed experts split over 2-3 items;
        // two k-blocks per stage: partial second blocks), fewer cases.
        for (int variant = 1; variant < cuda::kMoeMidVariants; ++variant)
            for (int grid : {3, 132})
                for (int t : {9, 40})
                    for (int routing : {0, 2}) {
                        if (s.name[0] == 't' && grid == 132) continue;
                        run(s, w1, w2, t, routing, grid, variant, rng);
                    }
    }
    std::printf("%d of %d checks failed (seed %u)\n", failures, checks, seed);
    return failures ? 1 : 0;
}
