// Runs the W4A8 MoE GEMMs' device code (src/kernels/cuda/moe_mlp_w4a8.cu: the quantisation kernel and the
// FP8 wgmma kernel, compiled as C++ against moe_w4a8_emulation.h) on the CPU and compares with the W4A8
// CPU reference (kernels/cpu/w4a8_matmul.h):
//   - the quantised activations (x, then the emulated u): codes (in the MMA order) and scales bit-exact;
//   - u of mlp1 (clamped SwiGLU, bf16) and y of mlp2 (fed the emulated u) within FP32 summation-order
//     tolerances of the reference;
// on small shapes cut at the kernel's constants: 128-k blocks (K of 64 = half a block, 192 = 1.5, 320,
// 960 = 7.5 blocks: a k-loop longer than the 6- and 8-stage rings, partial last blocks everywhere),
// weight rows that leave partial m-tiles (a warpgroup idle), experts with 0, 1, 5, 127..130, 262 routed
// rows, persistent grids of 1 CTA up to more CTAs than tiles; weight scales whose spread inside a 128-k
// block passes 11 (the slow code table), 14 (exactness) and 20 binades. Shared memory starts as 0xFF.
// Every variant runs ($EMULATE_VARIANT=N: only N). Not a CTest test (minutes on 2 cores).
//   usage: emulate_moe_w4a8 [seed]
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
#include "kernels/cpu/w4a8_matmul.h"
#include "moe_w4a8_emulation.h"
#include "kernels/cuda/moe_mlp_w4a8.cu"

namespace osprey::cuda {

using namespace w4a8;

inline int position(int k) {  // moe_w4a8_position (moe_mlp_w4a8.h)
    const int e = k & 31;
    return (k & ~31) | (16 * ((e >> 2) & 1) + 4 * (e >> 3) + (e & 3));
}

template <class Cfg, Proj kProj>
void emu_grid(const Params& p, int grid) {
    emu_run_grid(grid, kThreads, smem_bytes<Cfg>(p.n_groups), [&] { moe_w4a8_kernel<Cfg, kProj>(p); });
}

void emu_quantize(std::vector<uint8_t>& q, std::vector<float>& s, const std::vector<bf16>& x, int n_rows, int n) {
    emu_quantize_rows([](auto... a) { quantize_kernel<true>(a...); }, q, s, x, n_rows, n);
}

}  // namespace osprey::cuda

using namespace osprey;

namespace {

using emu::checks;
using emu::compare;
using emu::failures;

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
        for (size_t i = 0; i < scales.size(); i += 29)  // spreads of 12..22 binades inside a block
            scales[i] = uint8_t(100 + rng() % 5);
        bias.resize(size_t(e) * n_out), bias_f.resize(bias.size());
        std::uniform_real_distribution<float> u(-0.5f, 0.5f);
        for (size_t i = 0; i < bias.size(); ++i) bias[i] = float_to_bf16(u(rng)), bias_f[i] = bf16_to_float(bias[i]);
    }
    // W4A8 reference on already quantised rows (natural order).
    std::vector<float> matmul(int e, const std::vector<uint8_t>& xq, const std::vector<float>& xs, int n) const {
        std::vector<float> y(size_t(n) * n_out);
        const size_t bb = size_t(n_out) * n_in / 2, sb = size_t(n_out) * n_in / 32;
        cpu::w4a8::matmul(y, xq, xs, std::span(blocks).subspan(e * bb, bb), std::span(scales).subspan(e * sb, sb),
                          std::span(bias_f).subspan(size_t(e) * n_out, n_out), n, n_in, n_out);
        return y;
    }
};

// The emulated quantisation against the reference: scales equal, codes equal at their MMA positions.
// Returns the codes in natural order.
std::vector<uint8_t> check_quantized(const std::string& tag, const char* what, const std::vector<uint8_t>& q,
                                     const std::vector<float>& s, const std::vector<bf16>& x, int n_rows, int n,
                                     std::vector<float>& s_ref) {
    ++checks;
    std::vector<float> xf(x.size());
    for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_float(x[i]);
    std::vector<uint8_t> q_ref(x.size());
    s_ref.assign(size_t(n_rows) * cpu::w4a8::n_blocks(n), 0.0f);
    cpu::w4a8::quantize_rows(q_ref, s_ref, xf, n_rows, n);
    size_t bad = 0;
    for (size_t i = 0; i < s.size(); ++i) bad += s[i] != s_ref[i];
    for (int r = 0; r < n_rows; ++r)
        for (int k = 0; k < n; ++k) bad += q[size_t(r) * n + cuda::position(k)] != q_ref[size_t(r) * n + k];
    if (bad) {
        ++failures;
        std::printf("FAIL %s %s quantisation: %zu codes or scales differ\n", tag.c_str(), what, bad);
    }
    return q_ref;
}

struct Shape {
    const char* name;
    int d_model, d_ff;
    std::vector<int> rows_per_expert;  // sums to a multiple of 4
};

template <class Cfg>
void run(int variant, const Shape& s, std::mt19937& rng, const std::vector<int>& grids) {
    const int E = int(s.rows_per_expert.size());
    int n_rows = 0;
    for (int r : s.rows_per_expert) n_rows += r;
    const int n_tokens = n_rows / 4;
    const Weights w1(E, 2 * s.d_ff, s.d_model, rng), w2(E, s.d_model, s.d_ff, rng);
    std::uniform_real_distribution<float> ux(-2.0f, 2.0f);
    std::vector<bf16> x(size_t(n_tokens) * s.d_model);
    for (auto& v : x) v = float_to_bf16(ux(rng));
    for (int c = 0; c < std::min(128, s.d_model); ++c) x[c] = float_to_bf16(0.0f);  // an all-zero block (scale 1)
    std::vector<int> ids;
    for (int e = 0; e < E; ++e) ids.insert(ids.end(), s.rows_per_expert[e], e);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> offsets(E + 1, 0), sorted;
    for (int e = 0; e < E; ++e) {
        offsets[e + 1] = offsets[e] + s.rows_per_expert[e];
        for (int r = 0; r < n_rows; ++r)
            if (ids[r] == e) sorted.push_back(r);
    }
    const int kb1 = cpu::w4a8::n_blocks(s.d_model), kb2 = cpu::w4a8::n_blocks(s.d_ff);
    char tag0[160];
    std::snprintf(tag0, sizeof tag0, "[v%d %s d_model=%d d_ff=%d rows=%d]", variant, s.name, s.d_model, s.d_ff, n_rows);

    std::vector<uint8_t> xq_dev;
    std::vector<float> xs_dev, xs_ref;
    cuda::emu_quantize(xq_dev, xs_dev, x, n_tokens, s.d_model);
    const std::vector<uint8_t> xq_ref = check_quantized(tag0, "x", xq_dev, xs_dev, x, n_tokens, s.d_model, xs_ref);

    // Reference u per sorted row, from the reference's quantised x.
    std::vector<float> u_ref(size_t(n_rows) * s.d_ff);
    for (int i = 0; i < n_rows; ++i) {
        const int t = sorted[i] / 4;
        const std::vector<uint8_t> xr(xq_ref.begin() + size_t(t) * s.d_model, xq_ref.begin() + size_t(t + 1) * s.d_model);
        const std::vector<float> sr(xs_ref.begin() + size_t(t) * kb1, xs_ref.begin() + size_t(t + 1) * kb1);
        const std::vector<float> a = w1.matmul(ids[sorted[i]], xr, sr, 1);
        std::vector<float> u(s.d_ff);
        cpu::swiglu_clamped(u, a, 1, s.d_ff, 1.702f, 7.0f);
        std::copy(u.begin(), u.end(), u_ref.begin() + size_t(i) * s.d_ff);
    }

    for (int grid : grids) {
        char tag[200];
        std::snprintf(tag, sizeof tag, "%s grid=%d]", std::string(tag0, std::strlen(tag0) - 1).c_str(), grid);
        std::vector<bf16> u_dev(size_t(n_rows) * s.d_ff, bf16{0xFFFF});
        std::vector<float> y_dev(size_t(n_rows) * s.d_model, NAN);
        const cuda::Params p1{w1.blocks.data(), w1.scales.data(), reinterpret_cast<const __nv_bfloat16*>(w1.bias.data()),
                              xq_dev.data(), xs_dev.data(), u_dev.data(), offsets.data(), sorted.data(), E, 4,
                              s.d_model, 2 * s.d_ff, s.d_model / 32, kb1, (2 * s.d_ff + Cfg::kBM - 1) / Cfg::kBM,
                              1.702f, 7.0f};
        cuda::emu_grid<Cfg, cuda::Proj::mlp1>(p1, grid);
        std::vector<float> u_got(u_dev.size());
        for (size_t i = 0; i < u_dev.size(); ++i) u_got[i] = bf16_to_float(u_dev[i]);
        compare("mlp1 u", tag, u_got, u_ref, s.d_ff, 1e-4, 1.0 / 128);

        std::vector<uint8_t> uq_dev;
        std::vector<float> us_dev, us_ref;
        cuda::emu_quantize(uq_dev, us_dev, u_dev, n_rows, s.d_ff);
        const std::vector<uint8_t> uq_ref = check_quantized(tag, "u", uq_dev, us_dev, u_dev, n_rows, s.d_ff, us_ref);
        const cuda::Params p2{w2.blocks.data(), w2.scales.data(), reinterpret_cast<const __nv_bfloat16*>(w2.bias.data()),
                              uq_dev.data(), us_dev.data(), y_dev.data(), offsets.data(), sorted.data(), E, 4,
                              s.d_ff, s.d_model, s.d_ff / 32, kb2, (s.d_model + Cfg::kBM - 1) / Cfg::kBM, 1.702f, 7.0f};
        cuda::emu_grid<Cfg, cuda::Proj::mlp2>(p2, grid);
        std::vector<float> y_ref(size_t(n_rows) * s.d_model);
        for (int i = 0; i < n_rows; ++i) {
            const std::vector<uint8_t> ur(uq_ref.begin() + size_t(i) * s.d_ff, uq_ref.begin() + size_t(i + 1) * s.d_ff);
            const std::vector<float> sr(us_ref.begin() + size_t(i) * kb2, us_ref.begin() + size_t(i + 1) * kb2);
            const std::vector<float> y = w2.matmul(ids[sorted[i]], ur, sr, 1);
            std::copy(y.begin(), y.end(), y_ref.begin() + size_t(sorted[i]) * s.d_model);
        }
        compare("mlp2 y", tag, y_dev, y_ref, s.d_model, 1e-5, 1e-5);
        std::printf("%s done\n", tag);
        std::fflush(stdout);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const unsigned seed = argc > 1 ? unsigned(std::atoi(argv[1])) : 1u;
    // edges: mlp1 128 x 192 (1.5 k-blocks, one m-tile of variant 0, half of variant 1), mlp2 192 x 64 (half
    // a k-block; 1.5 m-tiles); experts with 0, 5, 130 (a full 128-row tile + 2) and 1 rows.
    // mid: mlp1 640 x 320 (2.5 k-blocks; 5 or 2.5 m-tiles), mlp2 320 x 320; 0 to 262 rows per expert.
    // ring: mlp1 128 x 960 (7.5 k-blocks: wraps the 6-stage ring inside one tile), mlp2 960 x 64.
    const Shape shapes[] = {{"edges", 192, 64, {0, 5, 130, 1}},
                            {"mid", 320, 320, {129, 0, 1, 262, 128}},
                            {"ring", 960, 64, {127, 0, 0, 1, 4}}};
    const char* only = std::getenv("EMULATE_VARIANT");
    const char* only_shape = std::getenv("EMULATE_SHAPE");  // a shape's name: only that one
    [&]<int... kV>(std::integer_sequence<int, kV...>) {
        (
            [&] {
                if (only != nullptr && std::atoi(only) != kV) return;
                std::mt19937 rng_v(seed);
                for (const Shape& s : shapes)
                    if (only_shape == nullptr || std::string(only_shape) == s.name)
                        run<cuda::w4a8::Variant<kV>>(kV, s, rng_v, {1, 3, 7});
            }(),
            ...);
    }(std::make_integer_sequence<int, cuda::w4a8::kVariants>{});
    std::printf("%d of %d checks failed (seed %u)\n", failures, checks, seed);
    return failures ? 1 : 0;
}
