// Runs the mid-batch MoE kernels' device code (extracted from src/kernels/cuda/moe_mid.cu into
// moe_mid_emulated.h by scripts/emulate_moe_mid.sh) on the CPU emulation and compares u and y with
// the CPU reference (routing, mxfp4_matmul, swiglu): small shapes with full and partial k-steps
// (n_groups 3..65: consumer warps with 0..3 k-steps, a last k-step of 1..3 groups), 9..128 tokens,
// random / tied / skewed routings (4 experts get every token: several token blocks per expert; most
// experts get none), and grids from 2 CTAs (long item ranges: the ring and the partial-sum ring wrap
// many times) to one CTA per SM; and the 20b / 120b shapes (d_model = d_ff = 2880, 32 / 128
// experts, 132 CTAs) on a few of their CTAs: mlp1 on those CTAs, then mlp2 on those CTAs over u
// tiles filled from the reference, checking the elements their items own and that every other
// element is left untouched. Dynamic shared memory starts as NaN bytes, and the u tiles and y too,
// so data read from stages the bulk copies did not fill, or outputs not written, would show.
//   usage: emulate_moe_mid [seed [variants | big | quick]]   (variants: only the other variants'
//          cases; big: only the 20b / 120b cases; quick: a few cases of every kind)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "emu_moe_check.h"
#include "kernels/cpu/mxfp4_matmul.h"
#include "kernels/cpu/routing.h"
#include "kernels/cpu/swiglu.h"
#include "moe_mid_emulated.h"

namespace osprey::cuda {

int moe_mid_default_variant() {
    return 0;
}

// Runs CTAs `ctas` (all when empty) of a grid of `grid` CTAs, one after the other.
void emu_grid(void (*kernel)(Params), const Params& p, int grid, size_t smem, const std::vector<int>& ctas) {
    std::vector<int> run = ctas;
    if (run.empty())
        for (int b = 0; b < grid; ++b) run.push_back(b);
    for (int b : run) emu_run_mma_cta(b, grid, kThreads, smem, [&] { kernel(p); });
}

Plan emu_plan(const MoeMidArgs& a, int v) {
    check_args(a);
    return plan(a, v);
}

size_t emu_workspace_bytes(int max_tokens, int d_ff) {
    return workspace_total(max_tokens, d_ff);
}

}  // namespace osprey::cuda

using namespace osprey;

namespace {

using emu::checks;
using emu::failures;
using Weights = emu::Mxfp4TestExperts;

struct Shape {
    const char* name;
    int n_experts, d_model, d_ff;
};

// |got - want| <= rel * max|want| + extra[i] where own[i]: extra is the summation-order term of each
// element (the kernels and the reference add the same exact products in different orders; with the
// extreme scale bytes of some groups, terms of 2^25 and more cancel, so that the order alone moves a
// result by units: 2^-14 of Σ|w·x| per dot product, as tests/kernels/moe_block_check.h bounds it).
// Where !own[i] the element must still hold its NaN poison (no CTA run owns it).
void compare(const char* what, const std::string& tag, const std::vector<float>& got, const std::vector<float>& want,
             const std::vector<float>& extra, const std::vector<char>& own, int cols, double rel) {
    ++checks;
    double mx = 0;
    for (size_t i = 0; i < want.size(); ++i)
        if (own[i]) mx = std::max(mx, double(std::fabs(want[i])));
    double worst = -1;
    size_t wi = 0, bad = 0, stray = 0, owned = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (!own[i]) {
            if (!std::isnan(got[i])) ++stray;
            continue;
        }
        ++owned;
        const double bound = rel * mx + extra[i] + 1e-30;
        const double e = std::isfinite(got[i]) ? std::fabs(double(got[i]) - want[i]) / bound : INFINITY;
        if (!(e <= 1)) ++bad;
        if (!(e <= worst)) worst = e, wi = i;
    }
    if (bad || stray || owned == 0) {
        ++failures;
        std::printf(
            "FAIL %s %s: %zu of %zu owned elements bad, %zu written outside the CTAs' items; worst row %zu col %zu got "
            "%g want %g (%.3g x bound, max|want| %g, order term %g)\n",
            tag.c_str(), what, bad, owned, stray, wi / cols, wi % cols, got[wi], want[wi], worst, mx, extra[wi]);
    }
}

// The item table of moe_mid.cu, rebuilt on the host: what CTA b of `grid` owns. Returns, for the CTAs
// in `ctas` (all when empty), which (sorted row, u column) and (routed row, y column) they write.
void owned(const std::vector<int32_t>& offsets, const std::vector<int32_t>& sorted, int tok, int rows_per_chunk,
           int d_model, int d_ff, int grid, const std::vector<int>& ctas, std::vector<char>& own_u,
           std::vector<char>& own_y) {
    const int E = int(offsets.size()) - 1, n_rows = int(sorted.size());
    own_u.assign(size_t(n_rows) * d_ff, 0), own_y.assign(size_t(n_rows) * d_model, 0);
    for (int proj = 0; proj < 2; ++proj) {
        const int n_out = proj == 0 ? 2 * d_ff : d_model, n_chunks = n_out / rows_per_chunk;
        struct It {
            int p0, n, chunk;
        };
        std::vector<It> items;
        for (int e = 0; e < E; ++e) {
            const int count = offsets[e + 1] - offsets[e], n_tb = (count + tok - 1) / tok;
            for (int tb = 0; tb < n_tb; ++tb)
                for (int c = 0; c < n_chunks; ++c) {
                    const int r0 = count * tb / n_tb, r1 = count * (tb + 1) / n_tb;
                    items.push_back({offsets[e] + r0, r1 - r0, c});
                }
        }
        const int64_t N = int64_t(items.size());
        std::vector<int> run = ctas;
        if (run.empty())
            for (int b = 0; b < grid; ++b) run.push_back(b);
        for (int b : run)
            for (int64_t i = N * b / grid; i < N * (b + 1) / grid; ++i) {
                const It& it = items[size_t(i)];
                for (int q = it.p0; q < it.p0 + it.n; ++q)
                    for (int r = it.chunk * rows_per_chunk; r < (it.chunk + 1) * rows_per_chunk; ++r) {
                        if (proj == 0) {
                            own_u[size_t(q) * d_ff + r / 2] = 1;
                        } else {
                            own_y[size_t(sorted[q]) * d_model + r] = 1;
                        }
                    }
            }
    }
}

// routing: 0 random, 1 ties, 2 every token on experts 1, 2, E-1, E-3 (skewed: 4 experts get all
// tokens, the others none), 3 expert 0 first for every token, the other three random.
// ctas: the CTAs of the grid to run (all when empty); with a subset, mlp2 runs over u tiles filled
// from the reference (the other CTAs' u is not computed).
void run(const Shape& s, const Weights& w1, const Weights& w2, int n_tokens, int routing, int grid, int variant,
         std::mt19937& rng, const std::vector<int>& ctas = {}) {
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

    const size_t ws_bytes = cuda::emu_workspace_bytes(n_tokens, s.d_ff);
    std::vector<uint8_t> ws_mem(ws_bytes + 256, 0xFF);  // u tiles poisoned (NaN)
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
    const cuda::Plan pl = cuda::emu_plan(a, variant);
    std::vector<char> own_u, own_y;
    owned(offsets, sorted, pl.v.tok, pl.v.rows, s.d_model, s.d_ff, grid, ctas, own_u, own_y);
    if (ctas.empty())  // the host's item table: every output has an owner
        for (const auto* o : {&own_u, &own_y})
            if (std::count(o->begin(), o->end(), 0) != 0) {
                ++failures;
                std::printf("FAIL %s: the host item table leaves outputs without an owner\n", s.name);
            }

    // Reference (u per sorted row, y per routed row), for the rows the CTAs run own.
    std::vector<float> u_ref(size_t(rows) * s.d_ff, NAN), y_ref(size_t(rows) * s.d_model, NAN);
    std::vector<float> u_extra(u_ref.size()), y_extra(y_ref.size());
    constexpr double kOrder = 1.0 / 16384;  // 2^-14 of Σ|w·x|
    for (int p = 0; p < rows; ++p) {
        const int r = sorted[p];
        const bool need_u = std::count(own_u.begin() + size_t(p) * s.d_ff, own_u.begin() + size_t(p + 1) * s.d_ff, 1);
        const bool need_y =
            std::count(own_y.begin() + size_t(r) * s.d_model, own_y.begin() + size_t(r + 1) * s.d_model, 1);
        if (!need_u && !need_y) continue;
        const std::vector<float> x(hf.begin() + size_t(r / 4) * s.d_model, hf.begin() + size_t(r / 4 + 1) * s.d_model);
        std::vector<float> xa(x);
        for (float& v : xa) v = std::fabs(v);
        const std::vector<float> av = w1.matmul(ids[r], x, 1), a_abs = w1.abs_matmul(ids[r], xa);
        std::vector<float> u(s.d_ff), v(s.d_ff);
        cpu::swiglu_clamped(u, av, 1, s.d_ff, 1.702f, 7.0f);
        for (int j = 0; j < s.d_ff; ++j) {
            // SwiGLU's slope in gate and up together is at most 16 inside the clamp.
            const double extra = 16 * kOrder * std::max(a_abs[2 * j], a_abs[2 * j + 1]);
            u_extra[size_t(p) * s.d_ff + j] = float(extra);
            u_ref[size_t(p) * s.d_ff + j] = u[j], u[j] = round_to_bf16(u[j]);
            v[j] = float(extra + (1.0 / 128) * std::fabs(u[j]));  // and a BF16 rounding flip of u
        }
        if (!need_y) continue;
        const std::vector<float> yv = w2.matmul(ids[r], u, 1), y_abs = w2.abs_matmul(ids[r], v);
        std::copy(yv.begin(), yv.end(), y_ref.begin() + size_t(r) * s.d_model);
        std::copy(y_abs.begin(), y_abs.end(), y_extra.begin() + size_t(r) * s.d_model);
    }

    char tag[200];
    std::snprintf(tag, sizeof tag, "[%s T=%d routing=%d grid=%d variant=%d ctas=%zu]", s.name, n_tokens, routing, grid,
                  variant, ctas.empty() ? size_t(grid) : ctas.size());
    cuda::emu_grid(pl.v.mlp1, pl.p1, grid, pl.smem1, ctas);
    std::vector<float> u(size_t(rows) * s.d_ff);
    bf16* ud = reinterpret_cast<bf16*>(ws);
    for (int p = 0; p < rows; ++p)
        for (int j = 0; j < s.d_ff; ++j)
            u[size_t(p) * s.d_ff + j] = bf16_to_float(ud[cuda::moe_mid_act_index(p, j, rows)]);
    compare("u", tag, u, u_ref, u_extra, own_u, s.d_ff, 1.0 / 64);
    if (!ctas.empty())  // mlp2's input for the rows it will read: the reference's u, rounded
        for (int p = 0; p < rows; ++p)
            if (!std::isnan(u_ref[size_t(p) * s.d_ff]))
                for (int j = 0; j < s.d_ff; ++j)
                    ud[cuda::moe_mid_act_index(p, j, rows)] = float_to_bf16(u_ref[size_t(p) * s.d_ff + j]);
    cuda::emu_grid(pl.v.mlp2, pl.p2, grid, pl.smem2, ctas);
    compare("y", tag, y, y_ref, y_extra, own_y, s.d_model, 1.0 / 64);
    std::printf("%s done\n", tag);
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    const unsigned seed = argc > 1 ? unsigned(std::atoi(argv[1])) : 1u;
    const std::string only = argc > 2 ? argv[2] : "";
    std::mt19937 rng(seed);
    // tiny: one k-step (only warp 0 has one); odd: mlp1 3 groups (a partial k-step, lanes c = 3 idle),
    // 320 rows (10 chunks of 32), mlp2 5 groups (the second k-step has one group), 96 rows; mid: 16
    // and 9 groups (4 and 3 k-steps), 16 experts; wide: 33 and 65 groups (9 and 17 k-steps: warps
    // with a second and a third k-step of 1 group, others with fewer k-steps than warp 0).
    const Shape shapes[] = {{"tiny", 8, 128, 128}, {"odd", 6, 96, 160}, {"mid", 16, 512, 288}, {"wide", 6, 1056, 2080}};
    // Variant 0 (the default): every routing at 9..128 tokens on 2 CTAs (long ranges: the rings wrap
    // many times, CTAs start and end inside experts and token blocks), fewer on 7 and 132 CTAs (132:
    // CTAs with one item or none).
    if (only.empty())
        for (const Shape& s : shapes) {
            const Weights w1(s.n_experts, 2 * s.d_ff, s.d_model, rng), w2(s.n_experts, s.d_model, s.d_ff, rng);
            const bool small = s.name[0] == 't' || s.name[0] == 'o';
            for (int grid : {2, 7, 132})
                for (int t : {9, 31, 40, 128})
                    for (int routing : {0, 1, 2, 3}) {
                        if (grid == 2 && !small && routing != 2) continue;
                        if (grid != 2 && (t == 31 || routing == 1 || (routing == 3) != (grid == 132))) continue;
                        if (!small && (grid == 7 || t == 40)) continue;
                        run(s, w1, w2, t, routing, grid, 0, rng);
                    }
        }
    // The other variants (16-row chunks; 16-token blocks: skewed experts split over more blocks).
    if (only.empty() || only == "variants")
        for (const Shape& s : shapes) {
            const Weights w1(s.n_experts, 2 * s.d_ff, s.d_model, rng), w2(s.n_experts, s.d_model, s.d_ff, rng);
            for (int variant = 1; variant < cuda::kMoeMidVariants; ++variant)
                for (int grid : {3, 132})
                    for (int t : {9, 40, 128})
                        for (int routing : {0, 2}) {
                            if ((s.name[0] == 't' && grid == 132) || (s.name[0] == 'w' && (grid == 3 || t != 128)) ||
                                (s.name[0] != 't' && t == 40) || (s.name[0] == 'm' && routing == 0))
                                continue;
                            run(s, w1, w2, t, routing, grid, variant, rng);
                        }
        }
    // A few cases of every kind, for a quick check: partial k-steps, warps with 1-3 k-steps, several
    // token blocks per expert, every variant, CTAs with no item.
    if (only == "quick") {
        const Shape& odd = shapes[1];
        const Shape& wide = shapes[3];
        const Weights o1(odd.n_experts, 2 * odd.d_ff, odd.d_model, rng), o2(odd.n_experts, odd.d_model, odd.d_ff, rng);
        for (int variant = 0; variant < cuda::kMoeMidVariants; ++variant) {
            run(odd, o1, o2, 128, 2, 3, variant, rng);
            run(odd, o1, o2, 31, 0, 132, variant, rng);
        }
        const Weights w1(wide.n_experts, 2 * wide.d_ff, wide.d_model, rng),
            w2(wide.n_experts, wide.d_model, wide.d_ff, rng);
        run(wide, w1, w2, 40, 2, 2, 0, rng);
        run(wide, w1, w2, 128, 0, 132, 2, rng);
    }
    // The gpt-oss shapes on 132 CTAs, a few CTAs each: the first, one in the middle, the last.
    if (only.empty() || only == "big") {
        const Shape big[] = {{"20b", 32, 2880, 2880}, {"120b", 128, 2880, 2880}};
        for (const Shape& s : big) {
            const Weights w1(s.n_experts, 2 * s.d_ff, s.d_model, rng), w2(s.n_experts, s.d_model, s.d_ff, rng);
            const bool b20 = s.n_experts == 32;
            for (int t : b20 ? std::vector<int>{9, 64, 128} : std::vector<int>{16, 128})
                run(s, w1, w2, t, 0, 132, 0, rng, {0, 67, 131});
            run(s, w1, w2, 128, 2, 132, 0, rng, {5, 131});  // skewed: 6 token blocks of 21-22 rows per expert
            if (b20) run(s, w1, w2, 100, 0, 132, 1, rng, {1, 130});
        }
    }
    std::printf("%d of %d checks failed (seed %u)\n", failures, checks, seed);
    return failures ? 1 : 0;
}
