// Runs the wgmma MoE expert GEMMs' device code (src/kernels/cuda/moe_mlp_wgmma.cu, compiled as C++ against
// moe_wgmma_emulation.h) on the CPU and compares u (mlp1) and y (mlp2, fed the emulated u) with the CPU
// reference (mxfp4_matmul, swiglu), on small shapes cut at the kernel's tile constants: experts with 0,
// 1, 127..130, 159..161, 255..257, 262 routed rows (partial, full and several token tiles of 128, 160
// and 256 rows), weight rows that leave partial m-tiles (half a warpgroup's rows, a whole warpgroup
// idle), k-loops shorter than, equal to and longer than the pipeline ring (and than the SS form's load
// lookahead, so its loads cross tile boundaries), and persistent grids of 1 CTA (every tile through one
// ring) up to more CTAs than tiles. Dynamic shared memory starts as 0xFF bytes (BF16 NaN), so reading
// what was never copied shows. Every kernel variant (moe_wgmma::Variants) runs the same cases
// ($EMULATE_VARIANT=N: only N). Not a CTest test (about a minute per variant on 2 cores).
//   usage: emulate_moe_wgmma [seed]
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>

#include "emu_moe_check.h"
#include "kernels/cpu/mxfp4_matmul.h"
#include "kernels/cpu/swiglu.h"
#include "moe_wgmma_emulation.h"
// moe_u_column (extracted from moe_mlp_mxfp4.h by scripts/emulate_moe_wgmma.sh)
#include "moe_u_column.h"
#include "kernels/cuda/moe_mlp_wgmma.cu"

namespace osprey::cuda {

using namespace moe_wgmma;

// One persistent grid, CTA after CTA, a std::thread per CUDA thread (moe_wgmma_emulation.h).
template <class Cfg, Proj kProj>
void emu_grid(const Params& p, int grid) {
    emu_run_grid(grid, kThreads, smem_bytes<Cfg>(p.n_groups), [&] {
        if constexpr (Cfg::kSS) moe_wgmma_ss_kernel<Cfg, kProj>(p);
        else moe_wgmma_kernel<Cfg, kProj>(p);
    });
}

template <class Cfg>
Params params(const uint8_t* blocks, const uint8_t* scales, const bf16* bias, const bf16* x, void* out,
              const int32_t* offsets, const int32_t* sorted, int n_experts, int n_in, int n_out) {
    return {blocks, scales, reinterpret_cast<const __nv_bfloat16*>(bias), reinterpret_cast<const __nv_bfloat16*>(x),
            out, offsets, sorted, n_experts, 4, n_in, n_out, n_in / 32, n_in / kBK, (n_out + Cfg::kBM - 1) / Cfg::kBM,
            1.702f, 7.0f};
}

}  // namespace osprey::cuda

using namespace osprey;

namespace {

using emu::checks;
using emu::compare;
using emu::failures;
using Weights = emu::Mxfp4TestExperts;

struct Shape {
    const char* name;
    int d_model, d_ff;
    std::vector<int> rows_per_expert;  // sums to a multiple of 4 (top-4)
};

template <class Cfg>
void run(int variant, const Shape& s, std::mt19937& rng, const std::vector<int>& grids) {
    const int E = int(s.rows_per_expert.size());
    int n_rows = 0;
    for (int r : s.rows_per_expert) n_rows += r;
    if (n_rows % 4) {
        std::fprintf(stderr, "shape %s: %d routed rows, not a multiple of top-k = 4\n", s.name, n_rows);
        std::abort();
    }
    const int n_tokens = n_rows / 4;
    const Weights w1(E, 2 * s.d_ff, s.d_model, rng), w2(E, s.d_model, s.d_ff, rng);
    std::uniform_real_distribution<float> ux(-2.0f, 2.0f);
    std::vector<bf16> x(size_t(n_tokens) * s.d_model);
    for (auto& v : x) v = float_to_bf16(ux(rng));
    // Routing: expert e gets rows_per_expert[e] of the routed rows, in a random order; grouped as
    // moe_group_by_expert does (by expert, then by routed row).
    std::vector<int> ids;
    for (int e = 0; e < E; ++e) ids.insert(ids.end(), s.rows_per_expert[e], e);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> offsets(E + 1, 0), sorted;
    for (int e = 0; e < E; ++e) {
        offsets[e + 1] = offsets[e] + s.rows_per_expert[e];
        for (int r = 0; r < n_rows; ++r)
            if (ids[r] == e) sorted.push_back(r);
    }
    std::vector<int> position(n_rows);
    for (int i = 0; i < n_rows; ++i) position[sorted[i]] = i;

    // Reference u (from x) per routed row, in routed-row order.
    std::vector<float> u_ref(size_t(n_rows) * s.d_ff);
    for (int r = 0; r < n_rows; ++r) {
        std::vector<float> xr(s.d_model);
        for (int c = 0; c < s.d_model; ++c) xr[c] = bf16_to_float(x[size_t(r / 4) * s.d_model + c]);
        const std::vector<float> a = w1.matmul(ids[r], xr, 1);
        std::vector<float> u(s.d_ff);
        cpu::swiglu_clamped(u, a, 1, s.d_ff, 1.702f, 7.0f);
        std::copy(u.begin(), u.end(), u_ref.begin() + size_t(r) * s.d_ff);
    }

    for (int grid : grids) {
        char tag[160];
        std::snprintf(tag, sizeof tag, "[v%d %s d_model=%d d_ff=%d rows=%d grid=%d]", variant, s.name, s.d_model, s.d_ff, n_rows, grid);
        std::vector<bf16> u_dev(size_t(n_rows) * s.d_ff, bf16{0xFFFF});   // poisoned
        std::vector<float> y_dev(size_t(n_rows) * s.d_model, NAN);
        cuda::emu_grid<Cfg, cuda::Proj::mlp1>(cuda::params<Cfg>(w1.blocks.data(), w1.scales.data(), w1.bias.data(), x.data(),
                                                       u_dev.data(), offsets.data(), sorted.data(), E, s.d_model,
                                                       2 * s.d_ff),
                                         grid);
        cuda::emu_grid<Cfg, cuda::Proj::mlp2>(cuda::params<Cfg>(w2.blocks.data(), w2.scales.data(), w2.bias.data(), u_dev.data(),
                                                       y_dev.data(), offsets.data(), sorted.data(), E, s.d_ff, s.d_model),
                                         grid);
        // u: stored at sorted position, columns moe_u_column.
        std::vector<float> u_got(size_t(n_rows) * s.d_ff), u_in(size_t(n_rows) * s.d_ff);
        for (int r = 0; r < n_rows; ++r)
            for (int j = 0; j < s.d_ff; ++j)
                u_got[size_t(r) * s.d_ff + j] =
                    bf16_to_float(u_dev[size_t(position[r]) * s.d_ff + cuda::moe_u_column(j)]);
        compare("mlp1 u", tag, u_got, u_ref, s.d_ff, 1e-3, 1.0 / 256);
        // y against the reference fed the emulated u (isolates mlp2), row r = routed row.
        std::vector<float> y_ref(size_t(n_rows) * s.d_model);
        for (int r = 0; r < n_rows; ++r) {
            const std::vector<float> ur(u_got.begin() + size_t(r) * s.d_ff, u_got.begin() + size_t(r + 1) * s.d_ff);
            const std::vector<float> y = w2.matmul(ids[r], ur, 1);
            std::copy(y.begin(), y.end(), y_ref.begin() + size_t(r) * s.d_model);
        }
        compare("mlp2 y", tag, y_dev, y_ref, s.d_model, 1e-4, 1e-4);
        std::printf("%s done\n", tag);
        std::fflush(stdout);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const unsigned seed = argc > 1 ? unsigned(std::atoi(argv[1])) : 1u;
    // edges: mlp1 128 x 192 (3 k-stages, half an m-tile: consumer warpgroup 1 idle), mlp2 192 x 64 (one
    // k-stage; 3 of 4 m-blocks); experts with 0, 5, 130 (a full tile + 2) and 1 rows.
    // mid: mlp1 640 x 320 (5 k-stages = the ring; 2.5 m-tiles), mlp2 320 x 320; 0 to 262 rows per expert.
    const Shape shapes[] = {{"edges", 192, 64, {0, 5, 130, 1}},
                            {"mid", 320, 320, {129, 0, 1, 262, 128}},
                            {"ring", 448, 128, {127, 0, 0, 1, 4}},   // mlp1 256 x 448: 7 k-stages, mlp2 448 x 128
                            // the routed-row tile edges of the 160- and 256-row variants (and 2 x 128 + 1):
                            // mlp1 384 x 128 (1.5 tiles of 256 weight rows), mlp2 128 x 192
                            {"ntile", 128, 192, {161, 0, 256, 159, 257, 3}}};
    // Every variant (moe_wgmma::Variants), or only $EMULATE_VARIANT; every shape, or only $EMULATE_SHAPE.
    const char* only = std::getenv("EMULATE_VARIANT");
    const char* only_shape = std::getenv("EMULATE_SHAPE");
    [&]<int... kV>(std::integer_sequence<int, kV...>) {
        (
            [&] {
                if (only != nullptr && std::atoi(only) != kV) return;
                std::mt19937 rng_v(seed);  // the same inputs for every variant
                for (const Shape& s : shapes)
                    if (only_shape == nullptr || std::string(only_shape) == s.name)
                        run<cuda::moe_wgmma::Variant<kV>>(kV, s, rng_v, {1, 3, 7});
            }(),
            ...);
    }(std::make_integer_sequence<int, cuda::moe_wgmma::kVariants>{});
    std::printf("%d of %d checks failed (seed %u)\n", failures, checks, seed);
    return failures ? 1 : 0;
}
