// Runs the matrix-expert GEMMs' device code (src/kernels/cuda/moe_mlp_matrix.cu, compiled as C++ against
// moe_w4a8_emulation.h; the activation quantisation is moe_mlp_w4a8.cu's kernel in natural order) on the
// CPU and compares with the CPU references, for both formats and every variant the format takes:
//   FP8 (W8A8): the quantised x and u (codes and scales) bit-exact against w4a8::quantize_rows; u of
//     mlp1 against w8a8::matmul + swiglu fed the same quantised x; y of mlp2 against w8a8::matmul fed the
//     emulated u's quantisation (FP32 summation-order tolerances: the emulated tensor core sums exactly);
//   BF16: u against matmul_bf16w + swiglu on the BF16 x; y against matmul_bf16w on the emulated u.
// Shapes cut at the kernel's constants: K of 64 (half an FP8 k-block, one BF16 stage), 192 (1.5 blocks),
// 320 and 960 (7.5 blocks: a k-loop longer than every ring), weight rows leaving partial m-tiles (a
// warpgroup idle, or one of its two m-blocks), experts with 0, 1, 4, 5, 127..130, 262 routed rows,
// persistent grids of 1 CTA up to more CTAs than tiles; FP8 weight multipliers differing block by block;
// wgmma groups completing at their wait_group (grids 1 and 7) or at their commit (grid 3).
// Shared memory starts as 0xFF. $EMULATE_VARIANT=N runs only N, $EMULATE_FORMAT=fp8|bf16 one format,
// $EMULATE_SHAPE=edges|mid|ring one shape. Not a CTest test (minutes on 2 cores).
//   usage: emulate_moe_matrix [seed]
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>

#include "emu_moe_check.h"
#include "core/fp8.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/w4a8_matmul.h"
#include "kernels/cpu/w8a8_matmul.h"
#include "moe_w4a8_emulation.h"
#include "kernels/cuda/moe_mlp_w4a8.cu"
#include "kernels/cuda/moe_mlp_matrix.cu"

namespace osprey::cuda {

template <class Cfg, bool kFp8, matrix_gemm::Proj kProj>
void emu_grid(const matrix_gemm::Params& p, int grid) {
    emu_run_grid(grid, matrix_gemm::kThreads, matrix_gemm::smem_bytes<Cfg>(),
                 [&] { matrix_gemm::moe_matrix_kernel<Cfg, kFp8, kProj>(p); });
}

// moe_w4a8_quantize(..., mma_order = false): the codes in natural order.
void emu_quantize(std::vector<uint8_t>& q, std::vector<float>& s, const std::vector<bf16>& x, int n_rows, int n) {
    emu_quantize_rows([](auto... a) { w4a8::quantize_kernel<false>(a...); }, q, s, x, n_rows, n);
}

}  // namespace osprey::cuda

using namespace osprey;

namespace {

using emu::checks;
using emu::compare;
using emu::failures;

// One projection of every expert: FP8 codes + block multipliers (each 128 x 128 block of a different
// magnitude), or BF16; bias.
struct Weights {
    int n_experts, n_out, n_in;
    bool fp8;
    std::vector<uint8_t> q;   // fp8: [E, n_out, n_in]
    std::vector<float> s;     // fp8: [E, nb(n_out), nb(n_in)]
    std::vector<bf16> w16;    // bf16: [E, n_out, n_in]
    std::vector<bf16> bias;
    std::vector<float> bias_f;
    Weights(int e, int n_out_, int n_in_, bool fp8_, std::mt19937& rng) : n_experts(e), n_out(n_out_), n_in(n_in_), fp8(fp8_) {
        std::normal_distribution<float> nd(0.0f, 1.0f);
        const float gain = 1.0f / std::sqrt(float(n_in));
        const int64_t nbo = fp8::n_blocks(n_out), nbi = fp8::n_blocks(n_in);
        std::vector<float> w(size_t(n_out) * n_in);
        if (fp8) q.resize(size_t(e) * n_out * n_in), s.resize(size_t(e * nbo * nbi));
        else w16.resize(size_t(e) * n_out * n_in);
        for (int x = 0; x < e; ++x) {
            for (int r = 0; r < n_out; ++r)
                for (int c = 0; c < n_in; ++c)
                    w[size_t(r) * n_in + c] = nd(rng) * gain * std::ldexp(1.0f, -int((r / 128 + 2 * (c / 128) + x) % 4));
            if (fp8) {
                for (int64_t b = 0; b < nbo; ++b) {
                    const int r0 = int(b * 128), nr = std::min(128, n_out - r0);
                    fp8::quantize_band(w.data() + size_t(r0) * n_in, nr, n_in,
                                       q.data() + (size_t(x) * n_out + r0) * n_in, s.data() + size_t((x * nbo + b) * nbi));
                }
            } else {
                for (size_t i = 0; i < w.size(); ++i) w16[size_t(x) * n_out * n_in + i] = float_to_bf16(w[i]);
            }
        }
        bias.resize(size_t(e) * n_out), bias_f.resize(bias.size());
        std::uniform_real_distribution<float> u(-0.5f, 0.5f);
        for (size_t i = 0; i < bias.size(); ++i) bias[i] = float_to_bf16(u(rng)), bias_f[i] = bf16_to_float(bias[i]);
    }
    const void* data() const { return fp8 ? static_cast<const void*>(q.data()) : static_cast<const void*>(w16.data()); }
    // Reference: fp8 on quantised rows (xq/xs), bf16 on FP32 rows (x).
    std::vector<float> ref(int e, const std::vector<uint8_t>& xq, const std::vector<float>& xs, const std::vector<float>& x,
                           int n) const {
        std::vector<float> y(size_t(n) * n_out);
        const auto bias_e = std::span<const float>(bias_f).subspan(size_t(e) * n_out, n_out);
        if (fp8) {
            const int64_t nbo = fp8::n_blocks(n_out), nbi = fp8::n_blocks(n_in);
            const cpu::Fp8Matrix m{.data = q.data() + size_t(e) * n_out * n_in, .scale_inv = s.data() + e * nbo * nbi,
                                   .ld = n_in};
            cpu::w8a8::matmul(y, xq, xs, m, bias_e, n, n_in, n_out);
        } else {
            cpu::matmul_bf16w(y, x, std::span<const bf16>(w16).subspan(size_t(e) * n_out * n_in, size_t(n_out) * n_in),
                              bias_e, n, n_in, n_out);
        }
        return y;
    }
};

// The emulated quantisation against the reference, bit for bit; returns the reference codes and scales.
void check_quantized(const std::string& tag, const char* what, const std::vector<uint8_t>& q, const std::vector<float>& s,
                     const std::vector<bf16>& x, int n_rows, int n, std::vector<uint8_t>& q_ref, std::vector<float>& s_ref) {
    ++checks;
    std::vector<float> xf(x.size());
    for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_float(x[i]);
    q_ref.assign(x.size(), 0);
    s_ref.assign(size_t(n_rows) * cpu::w4a8::n_blocks(n), 0.0f);
    cpu::w4a8::quantize_rows(q_ref, s_ref, xf, n_rows, n);
    size_t bad = 0;
    for (size_t i = 0; i < s.size(); ++i) bad += s[i] != s_ref[i];
    for (size_t i = 0; i < q.size(); ++i) bad += q[i] != q_ref[i];
    if (bad) {
        ++failures;
        std::printf("FAIL %s %s quantisation: %zu codes or scales differ\n", tag.c_str(), what, bad);
    }
}

struct Shape {
    const char* name;
    int d_model, d_ff;
    std::vector<int> rows_per_expert;  // sums to a multiple of 4
};

template <class Cfg, bool kFp8>
void run(int variant, const Shape& s, std::mt19937& rng, const std::vector<int>& grids) {
    namespace mg = cuda::matrix_gemm;
    const int E = int(s.rows_per_expert.size());
    int n_rows = 0;
    for (int r : s.rows_per_expert) n_rows += r;
    const int n_tokens = n_rows / 4;
    const Weights w1(E, 2 * s.d_ff, s.d_model, kFp8, rng), w2(E, s.d_model, s.d_ff, kFp8, rng);
    std::uniform_real_distribution<float> ux(-2.0f, 2.0f);
    std::vector<bf16> x(size_t(n_tokens) * s.d_model);
    for (auto& v : x) v = float_to_bf16(ux(rng));
    for (int c = 0; c < std::min(128, s.d_model); ++c) x[c] = float_to_bf16(0.0f);  // an all-zero block (scale 1)
    std::vector<float> xf(x.size());
    for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_float(x[i]);
    std::vector<int> ids;
    for (int e = 0; e < E; ++e) ids.insert(ids.end(), s.rows_per_expert[e], e);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> offsets(E + 1, 0), sorted;
    for (int e = 0; e < E; ++e) {
        offsets[e + 1] = offsets[e] + s.rows_per_expert[e];
        for (int r = 0; r < n_rows; ++r)
            if (ids[r] == e) sorted.push_back(r);
    }
    const int elem = kFp8 ? 1 : 2;
    const int kb1 = cpu::w4a8::n_blocks(s.d_model), kb2 = cpu::w4a8::n_blocks(s.d_ff);
    char tag0[160];
    std::snprintf(tag0, sizeof tag0, "[%s v%d %s d_model=%d d_ff=%d rows=%d]", kFp8 ? "fp8" : "bf16", variant, s.name,
                  s.d_model, s.d_ff, n_rows);

    std::vector<uint8_t> xq_dev, xq_ref;
    std::vector<float> xs_dev, xs_ref;
    if (kFp8) {
        cuda::emu_quantize(xq_dev, xs_dev, x, n_tokens, s.d_model);
        check_quantized(tag0, "x", xq_dev, xs_dev, x, n_tokens, s.d_model, xq_ref, xs_ref);
    }
    // Reference u per sorted row.
    std::vector<float> u_ref(size_t(n_rows) * s.d_ff);
    for (int i = 0; i < n_rows; ++i) {
        const int t = sorted[i] / 4;
        std::vector<uint8_t> xr;
        std::vector<float> sr, xrow(xf.begin() + size_t(t) * s.d_model, xf.begin() + size_t(t + 1) * s.d_model);
        if (kFp8) {
            xr.assign(xq_ref.begin() + size_t(t) * s.d_model, xq_ref.begin() + size_t(t + 1) * s.d_model);
            sr.assign(xs_ref.begin() + size_t(t) * kb1, xs_ref.begin() + size_t(t + 1) * kb1);
        }
        const std::vector<float> a = w1.ref(ids[sorted[i]], xr, sr, xrow, 1);
        std::vector<float> u(s.d_ff);
        cpu::swiglu_clamped(u, a, 1, s.d_ff, 1.702f, 7.0f);
        std::copy(u.begin(), u.end(), u_ref.begin() + size_t(i) * s.d_ff);
    }

    for (int grid : grids) {
        char tag[200];
        std::snprintf(tag, sizeof tag, "%s grid=%d]", std::string(tag0, std::strlen(tag0) - 1).c_str(), grid);
        std::vector<bf16> u_dev(size_t(n_rows) * s.d_ff, bf16{0xFFFF});
        std::vector<float> y_dev(size_t(n_rows) * s.d_model, NAN);
        const uint8_t* b1 = kFp8 ? xq_dev.data() : reinterpret_cast<const uint8_t*>(x.data());
        const mg::Params p1{static_cast<const uint8_t*>(w1.data()), kFp8 ? w1.s.data() : nullptr,
                            reinterpret_cast<const __nv_bfloat16*>(w1.bias.data()), b1, kFp8 ? xs_dev.data() : nullptr,
                            u_dev.data(), offsets.data(), sorted.data(), E, 4, s.d_model, 2 * s.d_ff,
                            s.d_model * elem, (s.d_model * elem + 127) / 128, (2 * s.d_ff + 127) / 128,
                            (2 * s.d_ff + Cfg::kBM - 1) / Cfg::kBM, 1.702f, 7.0f};
        // Grid 3 completes every wgmma group at its commit (the earliest the hardware may), the others at
        // the wait_group that covers it (the latest): a pipeline that reads partial sums before their wait
        // fails the latter, one that reuses registers of a group still in flight the former.
        cuda::g_wgmma_complete_at_commit = grid == 3;
        cuda::emu_grid<Cfg, kFp8, mg::Proj::mlp1>(p1, grid);
        std::vector<float> u_got(u_dev.size());
        for (size_t i = 0; i < u_dev.size(); ++i) u_got[i] = bf16_to_float(u_dev[i]);
        compare("mlp1 u", tag, u_got, u_ref, s.d_ff, 1e-4, 1.0 / 128);

        std::vector<uint8_t> uq_dev, uq_ref;
        std::vector<float> us_dev, us_ref;
        if (kFp8) {
            cuda::emu_quantize(uq_dev, us_dev, u_dev, n_rows, s.d_ff);
            check_quantized(tag, "u", uq_dev, us_dev, u_dev, n_rows, s.d_ff, uq_ref, us_ref);
        }
        const uint8_t* b2 = kFp8 ? uq_dev.data() : reinterpret_cast<const uint8_t*>(u_dev.data());
        const mg::Params p2{static_cast<const uint8_t*>(w2.data()), kFp8 ? w2.s.data() : nullptr,
                            reinterpret_cast<const __nv_bfloat16*>(w2.bias.data()), b2, kFp8 ? us_dev.data() : nullptr,
                            y_dev.data(), offsets.data(), sorted.data(), E, 4, s.d_ff, s.d_model, s.d_ff * elem,
                            (s.d_ff * elem + 127) / 128, (s.d_model + 127) / 128, (s.d_model + Cfg::kBM - 1) / Cfg::kBM,
                            1.702f, 7.0f};
        cuda::emu_grid<Cfg, kFp8, mg::Proj::mlp2>(p2, grid);
        std::vector<float> y_ref(size_t(n_rows) * s.d_model);
        for (int i = 0; i < n_rows; ++i) {
            std::vector<uint8_t> ur;
            std::vector<float> sr, urow(u_got.begin() + size_t(i) * s.d_ff, u_got.begin() + size_t(i + 1) * s.d_ff);
            if (kFp8) {
                ur.assign(uq_ref.begin() + size_t(i) * s.d_ff, uq_ref.begin() + size_t(i + 1) * s.d_ff);
                sr.assign(us_ref.begin() + size_t(i) * kb2, us_ref.begin() + size_t(i + 1) * kb2);
            }
            const std::vector<float> y = w2.ref(ids[sorted[i]], ur, sr, urow, 1);
            std::copy(y.begin(), y.end(), y_ref.begin() + size_t(sorted[i]) * s.d_model);
        }
        cuda::g_wgmma_complete_at_commit = false;
        compare("mlp2 y", tag, y_dev, y_ref, s.d_model, 1e-5, 1e-5);
        std::printf("%s done\n", tag);
        std::fflush(stdout);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const unsigned seed = argc > 1 ? unsigned(std::atoi(argv[1])) : 1u;
    // edges: mlp1 128 x 192 (FP8 1.5 k-blocks, BF16 3 stages; one 128-row m-tile, half a 256-row one: a
    // warpgroup idle), mlp2 192 x 64 (half an FP8 k-block, one BF16 stage; 1.5 m-tiles of 128, 3/4 of 256:
    // one m-block of a warpgroup idle); experts with 0, 5, 130 (a full 128-row tile + 2) and 1 rows.
    // mid: mlp1 640 x 320 (2.5 k-blocks; 5 or 2.5 m-tiles), mlp2 320 x 320; 0 to 262 rows per expert.
    // ring: mlp1 128 x 960 (7.5 k-blocks, 15 BF16 stages: wraps every ring inside one tile), mlp2 960 x 64.
    const Shape shapes[] = {{"edges", 192, 64, {0, 5, 130, 1}},
                            {"mid", 320, 320, {129, 0, 1, 262, 128}},
                            {"ring", 960, 64, {127, 0, 0, 1, 4}}};
    const char* only = std::getenv("EMULATE_VARIANT");
    const char* only_shape = std::getenv("EMULATE_SHAPE");
    const char* only_format = std::getenv("EMULATE_FORMAT");
    auto want_format = [&](const char* f) { return only_format == nullptr || std::string(only_format) == f; };
    [&]<int... kV>(std::integer_sequence<int, kV...>) {
        (
            [&] {
                if (only != nullptr && std::atoi(only) != kV) return;
                using Cfg = cuda::matrix_gemm::Variant<kV>;
                for (const Shape& s : shapes) {
                    if (only_shape != nullptr && std::string(only_shape) != s.name) continue;
                    if constexpr (cuda::matrix_gemm::fp8_fits<Cfg>) {
                        std::mt19937 rng(seed);
                        if (want_format("fp8")) run<Cfg, true>(kV, s, rng, {1, 3, 7});
                    }
                    {
                        std::mt19937 rng(seed);
                        if (want_format("bf16")) run<Cfg, false>(kV, s, rng, {1, 3, 7});
                    }
                }
            }(),
            ...);
    }(std::make_integer_sequence<int, cuda::matrix_gemm::kVariants>{});
    std::printf("%d of %d checks failed (seed %u)\n", failures, checks, seed);
    return failures ? 1 : 0;
}
