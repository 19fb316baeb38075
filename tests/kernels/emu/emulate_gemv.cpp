// Runs the GEMV kernels' device code (extracted from src/kernels/cuda/linear.cu into gemv_emulated.h by
// scripts/emulate_gemv_kernel.sh) on the CPU emulation (cuda_emulation.h, plus mma.sync m16n8k16 built
// from PTX's fragment layout there) and compares every output with a double reference: small shapes
// around the tile constants, every T, every epilogue, 8/16/32 rows per CTA, persistent grids smaller
// than the number of row blocks, padded strides, NaN-poisoned outputs and x padding; for BF16 weights
// and for FP8 E4M3 weights with block multipliers (partial 128-input blocks, multiplier rows of 128
// and of finer grids, every code but NaN), with the norm prologue (the rows staged, reordered for FP8,
// and handed on in h), the MoE residual add, and the one-warp-per-row gemv_wide.
//   usage: emulate_gemv [seed]
#include "gemv_emulated.h"

#include <cstdio>
#include <cstdlib>
#include <random>

using namespace osprey;

int fails = 0, total = 0;

// E4M3 -> BF16 in registers (e4m3x4_to_bf16x2) against core/fp8.h's decode, for every non-NaN code in
// each byte position: the values and the pair order (codes 0, 2 | 1, 3).
void check_decode() {
    ++total;
    int bad = 0;
    for (int c = 0; c < 256; ++c) {
        if ((c & 0x7F) == 0x7F) continue;  // NaN codes: not supported (the converter saturates)
        for (int pos = 0; pos < 4; ++pos) {
            const uint32_t filler = 0x3Au * 0x01010101u;  // 1.25 in the other bytes
            const uint32_t w = (filler & ~(0xFFu << (8 * pos))) | (uint32_t(c) << (8 * pos));
            uint32_t p02 = 0, p13 = 0;
            cuda::e4m3x4_to_bf16x2(w, p02, p13);
            const uint32_t pairs[4] = {p02 & 0xFFFF, p13 & 0xFFFF, p02 >> 16, p13 >> 16};  // codes 0, 1, 2, 3
            for (int i = 0; i < 4; ++i) {
                const float want = fp8::e4m3_to_float(uint8_t(w >> (8 * i)));
                const float got = bf16_to_float(bf16{uint16_t(pairs[i])});
                if (std::memcmp(&got, &want, 4) != 0 && bad++ < 4)
                    std::printf("  decode: code 0x%02x at byte %d: got %g want %g\n", unsigned(w >> (8 * i)) & 0xFF,
                                i, double(got), double(want));
            }
        }
    }
    if (bad) {
        ++fails;
        std::printf("FAIL e4m3 decode: %d values wrong\n", bad);
    }
}

struct Fp8 {
    bool on = false;
    int block_rows = 128;  // rows per multiplier row (linear.h Fp8Weight)
};

// Norm prologue inputs (kNorm): residual, optional MoE slots, gain; the rows it writes to h.
struct Norm {
    bool on = false, moe = false;
};

void run_case(int n, int k, int t_count, int rows, int grid_cap, bool f32, bool bias, bool acc, int pad_x, int pad_y,
              std::mt19937& rng, Fp8 f8 = {}, Norm nm = {}, bool acc_moe = false) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const int ldx = nm.on ? k : k + pad_x, ldy = acc_moe ? n : n + pad_y;
    const int nkb = (k + 127) / 128;
    std::vector<bf16> w(size_t(n) * k), x(size_t(t_count) * ldx, bf16{0xFFFF}), bb(n);
    std::vector<uint8_t> codes(size_t(n) * k);
    std::vector<float> scale(size_t((n + f8.block_rows - 1) / f8.block_rows) * nkb), bf(n);
    if (f8.on) {
        for (auto& c : codes) {
            do c = uint8_t(rng()); while ((c & 0x7F) == 0x7F);
        }
        // Multipliers over several binades, so that a block's partial sum meeting the wrong one shows.
        for (auto& s : scale) s = std::ldexp(1.f + 0.5f * (u(rng) + 1.f), int(rng() % 8) - 12) / std::sqrt(float(k));
    } else {
        for (auto& v : w) v = float_to_bf16(u(rng) / std::sqrt(float(k)));
    }
    for (int t = 0; t < t_count; ++t)
        for (int i = 0; i < k; ++i) x[size_t(t) * ldx + i] = float_to_bf16(u(rng));
    for (int j = 0; j < n; ++j) bb[j] = float_to_bf16(u(rng)), bf[j] = bf16_to_float(bb[j]);
    std::vector<float> res, moe_y, moe_w, gain;
    std::vector<bf16> h;
    if (nm.on) {
        res.resize(size_t(t_count) * k), gain.resize(k), h.assign(size_t(t_count) * k, bf16{0xFFFF});
        for (auto& v : res) v = 2.f * u(rng);
        for (auto& v : gain) v = 1.f + 0.5f * u(rng);
        if (nm.moe) {
            moe_y.resize(size_t(t_count) * 4 * k), moe_w.resize(size_t(t_count) * 4);
            for (auto& v : moe_y) v = u(rng);
            for (auto& v : moe_w) v = 0.25f * (u(rng) + 1.f);
        }
    }
    std::vector<float> acc_y, acc_w;
    if (acc_moe) {
        acc_y.resize(size_t(t_count) * 4 * n), acc_w.resize(size_t(t_count) * 4);
        for (auto& v : acc_y) v = u(rng);
        for (auto& v : acc_w) v = 0.25f * (u(rng) + 1.f);
    }
    const size_t y_elems = size_t(t_count + 1) * ldy;  // one guard row
    std::vector<float> y32(y_elems, NAN), y0;
    std::vector<bf16> y16(y_elems, bf16{0xFFFF});
    if (acc)
        for (auto& v : y32) v = u(rng);
    y0 = y32;
    const std::vector<bf16> y16_0 = y16;

    cuda::GemvParams p{.y = f32 ? (void*)y32.data() : (void*)y16.data(),
                       .x = nm.on ? nullptr : x.data(),
                       .w = f8.on ? nullptr : w.data(),
                       .bias = !bias ? nullptr : f32 ? (const void*)bf.data() : (const void*)bb.data(),
                       .n_tokens = t_count,
                       .n_out = n,
                       .n_in = k,
                       .ldx = ldx,
                       .ldy = ldy,
                       .xs_ld = cuda::gemv_xs_ld(k, f8.on),
                       .accumulate = acc,
                       .norm = {.res = nm.on ? res.data() : nullptr,
                                .moe_y = nm.moe ? moe_y.data() : nullptr,
                                .moe_w = nm.moe ? moe_w.data() : nullptr,
                                .gain = nm.on ? gain.data() : nullptr,
                                .h = nm.on ? h.data() : nullptr,
                                .eps = 1e-5f},
                       .acc_moe_y = acc_moe ? acc_y.data() : nullptr,
                       .acc_moe_w = acc_moe ? acc_w.data() : nullptr,
                       .w8 = {.codes = f8.on ? codes.data() : nullptr, .scale = scale.data(), .block_rows = f8.block_rows},
                       .ahead2 = total % 2 == 0};  // two steps of loads before the PDL wait in every other case
    const int n_blocks = (n + rows - 1) / rows;
    const int grid = std::min(n_blocks, grid_cap);
    cuda::emu_launch(p, rows / 8, f32, nm.on, f8.on, grid, cuda::gemv_smem_bytes(rows / 8, t_count, k, f8.on));

    ++total;
    int bad = 0;
    if (nm.on) {  // h = the normed rows, in input order (the FP8 kernel reorders its own copy only)
        std::vector<bf16> want(static_cast<size_t>(k));
        for (int t = 0; t < t_count; ++t) {
            cuda::emu_rmsnorm_row(res.data() + size_t(t) * k, nm.moe ? moe_y.data() + size_t(t) * 4 * k : nullptr,
                            nm.moe ? moe_w.data() + 4 * t : nullptr, gain.data(), k, 1e-5f, want.data());
            for (int i = 0; i < k; ++i) {
                if (h[size_t(t) * k + i].bits != want[i].bits && bad++ == 0)
                    std::printf("  h token %d input %d: got %g want %g\n", t, i, double(bf16_to_float(h[size_t(t) * k + i])),
                                double(bf16_to_float(want[i])));
                x[size_t(t) * ldx + i] = want[i];  // the product is checked on these rows
            }
        }
    }
    double worst = 0;
    for (int t = 0; t <= t_count; ++t)
        for (int j = 0; j < ldy; ++j) {
            const size_t i = size_t(t) * ldy + j;
            const float got = f32 ? y32[i] : bf16_to_float(y16[i]);
            if (t == t_count || j >= n) {  // must be untouched
                const bool same = f32 ? std::memcmp(&y32[i], &y0[i], 4) == 0 : y16[i].bits == y16_0[i].bits;
                if (!same && bad++ == 0) std::printf("  wrote outside y[T, N] at %d, %d\n", t, j);
                continue;
            }
            double want = 0, s = 0;
            for (int kk = 0; kk < k; ++kk) {
                const double wv = f8.on ? double(fp8::e4m3_to_float(codes[size_t(j) * k + kk])) *
                                              scale[size_t(j / f8.block_rows) * nkb + kk / 128]
                                        : double(bf16_to_float(w[size_t(j) * k + kk]));
                const double v = double(bf16_to_float(x[size_t(t) * ldx + kk])) * wv;
                want += v, s += std::abs(v);
            }
            if (bias) want += bf[j];
            if (acc) {
                double base = y0[i];
                if (acc_moe)
                    for (int kk = 0; kk < 4; ++kk)
                        base += double(acc_w[4 * t + kk]) * acc_y[(size_t(t) * 4 + kk) * n + j];
                want += base;
            }
            const double tol = 1e-5 * s + 1e-6 + (f32 ? 1e-6 : 1.0 / 256) * std::abs(want);
            const double err = std::abs(got - want) / tol;
            if (!(err <= 1.0) && bad++ == 0)
                std::printf("  token %d row %d: got %g want %g\n", t, j, double(got), want);
            if (err > worst) worst = err;
        }
    if (bad) {
        ++fails;
        std::printf("FAIL %s N=%d K=%d T=%d rows=%d grid=%d f32=%d bias=%d acc=%d ldx+%d ldy+%d block_rows=%d "
                    "norm=%d moe=%d acc_moe=%d: %d bad\n",
                    f8.on ? "fp8" : "bf16", n, k, t_count, rows, grid, f32, bias, acc, pad_x, pad_y, f8.block_rows,
                    nm.on, nm.moe, acc_moe, bad);
    }
}

// gemv_wide_kernel: one warp per row, BF16 or FP8 weights, T = 1..8.
void run_wide(int n, int k, int t_count, bool f32, bool bias, bool acc, bool fp8, int block_rows, int pad_x,
              std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const int ldx = k + pad_x, ldy = n + 3, nkb = (k + 127) / 128;
    std::vector<bf16> w(size_t(n) * k), x(size_t(t_count) * ldx, bf16{0xFFFF}), bb(n);
    std::vector<uint8_t> codes(size_t(n) * k);
    std::vector<float> scale(size_t((n + block_rows - 1) / block_rows) * nkb), bf(n);
    for (auto& c : codes) {
        do c = uint8_t(rng()); while ((c & 0x7F) == 0x7F);
    }
    for (auto& s : scale) s = std::ldexp(1.f + 0.5f * (u(rng) + 1.f), int(rng() % 8) - 12) / std::sqrt(float(k));
    for (auto& v : w) v = float_to_bf16(u(rng) / std::sqrt(float(k)));
    for (int t = 0; t < t_count; ++t)
        for (int i = 0; i < k; ++i) x[size_t(t) * ldx + i] = float_to_bf16(u(rng));
    for (int j = 0; j < n; ++j) bb[j] = float_to_bf16(u(rng)), bf[j] = bf16_to_float(bb[j]);
    const size_t y_elems = size_t(t_count + 1) * ldy;
    std::vector<float> y32(y_elems, NAN);
    std::vector<bf16> y16(y_elems, bf16{0xFFFF});
    if (acc)
        for (auto& v : y32) v = u(rng);
    const std::vector<float> y0 = y32;
    const std::vector<bf16> y16_0 = y16;
    const cuda::LinearArgs a{.y = f32 ? (void*)y32.data() : (void*)y16.data(),
                             .x = x.data(),
                             .w = fp8 ? nullptr : w.data(),
                             .w8 = {.codes = fp8 ? codes.data() : nullptr, .scale = scale.data(), .block_rows = block_rows},
                             .bias = !bias ? nullptr : f32 ? (const void*)bf.data() : (const void*)bb.data(),
                             .n_tokens = t_count,
                             .n_out = n,
                             .n_in = k,
                             .accumulate = acc};
    cuda::emu_launch_wide(a, ldx, ldy, f32, fp8);
    ++total;
    int bad = 0;
    for (int t = 0; t <= t_count; ++t)
        for (int j = 0; j < ldy; ++j) {
            const size_t i = size_t(t) * ldy + j;
            const float got = f32 ? y32[i] : bf16_to_float(y16[i]);
            if (t == t_count || j >= n) {
                const bool same = f32 ? std::memcmp(&y32[i], &y0[i], 4) == 0 : y16[i].bits == y16_0[i].bits;
                if (!same && bad++ == 0) std::printf("  wrote outside y[T, N] at %d, %d\n", t, j);
                continue;
            }
            double want = 0, s = 0;
            for (int kk = 0; kk < k; ++kk) {
                const double wv = fp8 ? double(fp8::e4m3_to_float(codes[size_t(j) * k + kk])) *
                                            scale[size_t(j / block_rows) * nkb + kk / 128]
                                      : double(bf16_to_float(w[size_t(j) * k + kk]));
                const double v = double(bf16_to_float(x[size_t(t) * ldx + kk])) * wv;
                want += v, s += std::abs(v);
            }
            if (bias) want += bf[j];
            if (acc) want += y0[i];
            const double tol = 1e-5 * s + 1e-6 + (f32 ? 1e-6 : 1.0 / 256) * std::abs(want);
            if (!(std::abs(got - want) <= tol) && bad++ == 0)
                std::printf("  wide token %d row %d: got %g want %g\n", t, j, double(got), want);
        }
    if (bad) {
        ++fails;
        std::printf("FAIL wide %s N=%d K=%d T=%d f32=%d bias=%d acc=%d block_rows=%d: %d bad\n", fp8 ? "fp8" : "bf16",
                    n, k, t_count, f32, bias, acc, block_rows, bad);
    }
}

// The out-projection and the router in one grid (gemv_router_tail_kernel) against the two kernels run
// one after the other: y, h and the logits bit-identical, the counter back at zero. grid_cap bounds
// each part's CTAs (persistent loops in both parts).
void run_tail(int d, int k, int t_count, int rows, int n_experts, int grid_cap, bool acc_moe, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<bf16> w(size_t(d) * k), x(size_t(t_count) * k), wr(size_t(n_experts) * d);
    std::vector<float> b(d), br(n_experts), gain(d), y0(size_t(t_count) * d), acc_y, acc_w;
    for (auto& v : w) v = float_to_bf16(u(rng) / std::sqrt(float(k)));
    for (auto& v : wr) v = float_to_bf16(u(rng) / std::sqrt(float(d)));
    for (auto& v : x) v = float_to_bf16(u(rng));
    for (auto& v : b) v = u(rng);
    for (auto& v : br) v = u(rng);
    for (auto& v : gain) v = 1.f + 0.5f * u(rng);
    for (auto& v : y0) v = 2.f * u(rng);
    if (acc_moe) {
        acc_y.resize(size_t(t_count) * 4 * d), acc_w.resize(size_t(t_count) * 4);
        for (auto& v : acc_y) v = u(rng);
        for (auto& v : acc_w) v = 0.25f * (u(rng) + 1.f);
    }
    struct Out {
        std::vector<float> y, logits;
        std::vector<bf16> h;
    };
    auto params = [&](Out& o) {
        o.y = y0, o.logits.assign(size_t(t_count) * n_experts, NAN), o.h.assign(size_t(t_count) * d, bf16{0xFFFF});
        const cuda::GemvParams proj{.y = o.y.data(), .x = x.data(), .w = w.data(), .bias = b.data(),
                                    .n_tokens = t_count, .n_out = d, .n_in = k, .ldx = k, .ldy = d,
                                    .xs_ld = cuda::gemv_xs_ld(k), .accumulate = true, .norm = {},
                                    .acc_moe_y = acc_moe ? acc_y.data() : nullptr,
                                    .acc_moe_w = acc_moe ? acc_w.data() : nullptr, .w8 = {}, .ahead2 = true};
        const cuda::GemvParams router{.y = o.logits.data(), .x = nullptr, .w = wr.data(), .bias = br.data(),
                                      .n_tokens = t_count, .n_out = n_experts, .n_in = d, .ldx = d, .ldy = n_experts,
                                      .xs_ld = cuda::gemv_xs_ld(d), .accumulate = false,
                                      .norm = {.res = o.y.data(), .moe_y = nullptr, .moe_w = nullptr,
                                               .gain = gain.data(), .h = o.h.data(), .eps = 1e-5f},
                                      .acc_moe_y = nullptr, .acc_moe_w = nullptr, .w8 = {}, .ahead2 = false};
        return std::pair(proj, router);
    };
    const int n_main = std::min((d + rows - 1) / rows, grid_cap), n_tail = std::min((n_experts + 7) / 8, grid_cap);
    Out sep, fused;
    {
        auto [proj, router] = params(sep);
        cuda::emu_launch(proj, rows / 8, true, false, false, n_main, cuda::gemv_smem_bytes(rows / 8, t_count, k));
        cuda::emu_launch(router, 1, true, true, false, n_tail, cuda::gemv_smem_bytes(1, t_count, d));
    }
    unsigned counter = 0;
    {
        auto [proj, router] = params(fused);
        const cuda::GemvTailParams tp{proj, router, n_main, n_tail, &counter};
        cuda::emu_launch_tail(tp, rows / 8,
                              std::max(cuda::gemv_smem_bytes(rows / 8, t_count, k), cuda::gemv_smem_bytes(1, t_count, d)));
    }
    ++total;
    int bad = 0;
    auto same = [&](const char* what, const void* a, const void* c, size_t bytes) {
        if (std::memcmp(a, c, bytes) != 0 && bad++ == 0) std::printf("  tail: %s differs from the two launches\n", what);
    };
    same("y", sep.y.data(), fused.y.data(), sep.y.size() * 4);
    same("logits", sep.logits.data(), fused.logits.data(), sep.logits.size() * 4);
    same("h", sep.h.data(), fused.h.data(), sep.h.size() * 2);
    for (float v : fused.logits)
        if (!std::isfinite(v) && bad++ == 0) std::printf("  tail: a logit was not written\n");
    if (counter != 0 && bad++ == 0) std::printf("  tail: the counter was left at %u\n", counter);
    if (bad) {
        ++fails;
        std::printf("FAIL router tail d=%d K=%d T=%d rows=%d experts=%d grid_cap=%d acc_moe=%d\n", d, k, t_count, rows,
                    n_experts, grid_cap, acc_moe);
    }
}

int main(int argc, char** argv) {
    std::mt19937 rng(argc > 1 ? uint32_t(std::atoi(argv[1])) : 1u);
    check_decode();
    struct Shape {
        int n, k;
    };
    struct Epi {
        bool f32, bias, acc;
    };
    const Epi epis[] = {{false, false, false}, {false, true, false}, {true, false, false},
                        {true, true, false},   {true, false, true},  {true, true, true}};
    // BF16. N: one row, off the 8-row tile, one block of 32 and one past; K: one piece, a partial chunk,
    // below and above one round (8 warps x 64 / 32 / 16 chunks of 32 for 8 / 16 / 32 rows per CTA).
    const Shape shapes[] = {{1, 64}, {7, 8}, {13, 40}, {33, 72}, {100, 520}, {40, 2112}, {70, 2880}};
    int c = 0;
    for (const Shape& s : shapes)
        for (const int t : {1, 2, 5, 8})
            for (const int rows : {8, 16, 32}) {
                const Epi& e = epis[c % 6];
                const int grid_cap = c % 3 == 0 ? 1 : c % 3 == 1 ? 2 : 1000;  // persistent loops and one wave
                const int pad = c % 2;
                run_case(s.n, s.k, t, rows, grid_cap, e.f32, e.bias, e.acc, 24 * pad, 5 * pad, rng);
                ++c;
            }
    // Every epilogue at every T on one shape with a 2-CTA grid.
    for (int t = 1; t <= 8; ++t)
        for (const Epi& e : epis) run_case(45, 104, t, 16, 2, e.f32, e.bias, e.acc, 8, 3, rng);

    // FP8. K (multiples of 16): one piece, one partial block, one block, a block and a piece, 2880's
    // 22.5 blocks, and above one round (8 warps x 4 / 2 / 1 blocks for 8 / 16 / 32 rows per CTA: 4096,
    // 2048, 1024 inputs); N as above; multiplier rows of 128 and of the finer grids stacked parts get.
    const Shape fp8_shapes[] = {{1, 16}, {7, 48}, {13, 128}, {33, 144}, {100, 1040}, {40, 2880}, {19, 4112}};
    const int block_rows[] = {128, 64, 8, 1, 24};
    // (Two token counts per shape and rows per CTA, one of them 8, to keep the run near a minute.)
    c = 0;
    for (const Shape& s : fp8_shapes)
        for (const int rows : {8, 16, 32})
            for (const int t : {c % 2 ? 3 : 1, 8}) {
                const Epi& e = epis[c % 6];
                const int grid_cap = c % 3 == 0 ? 1 : c % 3 == 1 ? 2 : 1000;
                const int pad = c % 2;
                run_case(s.n, s.k, t, rows, grid_cap, e.f32, e.bias, e.acc, 24 * pad, 5 * pad, rng,
                         {.on = true, .block_rows = block_rows[c % 5]});
                ++c;
            }
    // Every T with a 2-CTA grid, the epilogues in turn.
    for (int t = 1; t <= 8; ++t) {
        const Epi& e = epis[t % 6];
        run_case(45, 208, t, 16, 2, e.f32, e.bias, e.acc, 8, 3, rng, {.on = true, .block_rows = t % 2 ? 128 : 16});
    }

    // The norm prologue (x computed in every CTA, h written by CTA 0; FP8 reorders its staged copy) and
    // the MoE residual add, both formats, over grids of 1, 2 and all CTAs.
    for (const bool fp8 : {false, true})
        for (const int t : {1, 2, 5, 8}) {
            const Fp8 f8{.on = fp8, .block_rows = t % 2 ? 128 : 64};
            run_case(37, 272, t, 8 << (t % 3), t % 3 == 0 ? 1 : 1000, t % 2 == 0, true, false, 0, 0, rng, f8,
                     {.on = true, .moe = t != 1});
            run_case(29, 144, t, 16, t % 2 ? 2 : 1000, true, t % 2 == 1, true, 8, 0, rng, f8, {}, /*acc_moe=*/true);
        }

    // The router tail: the projection's row blocks of 8 / 16 / 32 rows, T = 1..8, 32 and 13 experts
    // (a partial last 8-row block), one wave and persistent loops in both parts, with and without the
    // MoE residual add; the 20b shape (2880 x 4096, 32 experts) once.
    for (int t = 1; t <= 8; ++t)
        run_tail(t % 2 ? 72 : 136, t % 3 ? 264 : 520, t, 8 << (t % 3), t % 4 == 3 ? 13 : 32, t % 3 == 2 ? 2 : 1000,
                 t % 2 == 0, rng);
    run_tail(2880, 4096, 1, 16, 32, 1000, true, rng);

    // gemv_wide: T = 1..8 (template cases 1, 2, 4, 8 and the guards between), rows of several rounds
    // of 12 loads per lane (BF16: 3072 inputs; FP8: 6144), BF16 and FP8.
    for (int t = 1; t <= 8; ++t) {
        const Epi& e = epis[t % 6];
        run_wide(11, t % 2 ? 6160 : 2880, t, e.f32, e.bias, e.acc, true, t % 3 == 0 ? 128 : 8, 8 * (t % 2), rng);
        run_wide(9, t % 2 ? 3080 : 64, t, e.f32, e.bias, e.acc, false, 128, 8 * (t % 2), rng);
    }
    std::printf("%d of %d cases failed\n", fails, total);
    return fails ? 1 : 0;
}
