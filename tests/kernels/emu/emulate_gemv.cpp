// Runs the GEMV kernel's device code (extracted from src/kernels/cuda/linear.cu into gemv_emulated.h by
// scripts/emulate_gemv_kernel.sh) on the CPU emulation (cuda_emulation.h, plus mma.sync m16n8k16 built
// from PTX's fragment layout here) and compares every output with a double reference: small shapes
// around the tile constants, every T, every epilogue, 8/16/32 rows per CTA, persistent grids smaller
// than the number of row blocks, padded strides, NaN-poisoned outputs and x padding.
//   usage: emulate_gemv [seed]
#include "gemv_emulated.h"

#include <cstdio>
#include <cstdlib>
#include <random>

using namespace osprey;

int fails = 0, total = 0;

void run_case(int n, int k, int t_count, int rows, int grid_cap, bool f32, bool bias, bool acc, int pad_x, int pad_y,
              std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const int ldx = k + pad_x, ldy = n + pad_y;
    std::vector<bf16> w(size_t(n) * k), x(size_t(t_count) * ldx, bf16{0xFFFF}), bb(n);
    std::vector<float> bf(n);
    for (auto& v : w) v = float_to_bf16(u(rng) / std::sqrt(float(k)));
    for (int t = 0; t < t_count; ++t)
        for (int i = 0; i < k; ++i) x[size_t(t) * ldx + i] = float_to_bf16(u(rng));
    for (int j = 0; j < n; ++j) bb[j] = float_to_bf16(u(rng)), bf[j] = bf16_to_float(bb[j]);
    const size_t y_elems = size_t(t_count + 1) * ldy;  // one guard row
    std::vector<float> y32(y_elems, NAN), y0;
    std::vector<bf16> y16(y_elems, bf16{0xFFFF});
    if (acc)
        for (auto& v : y32) v = u(rng);
    y0 = y32;
    const std::vector<bf16> y16_0 = y16;

    cuda::GemvParams p{.y = f32 ? (void*)y32.data() : (void*)y16.data(),
                       .x = x.data(),
                       .w = w.data(),
                       .bias = !bias ? nullptr : f32 ? (const void*)bf.data() : (const void*)bb.data(),
                       .n_tokens = t_count,
                       .n_out = n,
                       .n_in = k,
                       .ldx = ldx,
                       .ldy = ldy,
                       .xs_ld = cuda::gemv_xs_ld(k),
                       .accumulate = acc};
    const int n_blocks = (n + rows - 1) / rows;
    const int grid = std::min(n_blocks, grid_cap);
    cuda::emu_launch(p, rows / 8, f32, grid, cuda::gemv_smem_bytes(rows / 8, t_count, k));

    ++total;
    double worst = 0;
    int bad = 0;
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
                const double v = double(bf16_to_float(x[size_t(t) * ldx + kk])) * bf16_to_float(w[size_t(j) * k + kk]);
                want += v, s += std::abs(v);
            }
            if (bias) want += bf[j];
            if (acc) want += y0[i];
            const double tol = 1e-5 * s + 1e-6 + (f32 ? 1e-6 : 1.0 / 256) * std::abs(want);
            const double err = std::abs(got - want) / tol;
            if (!(err <= 1.0) && bad++ == 0)
                std::printf("  token %d row %d: got %g want %g\n", t, j, double(got), want);
            if (err > worst) worst = err;
        }
    if (bad) {
        ++fails;
        std::printf("FAIL N=%d K=%d T=%d rows=%d grid=%d f32=%d bias=%d acc=%d ldx+%d ldy+%d: %d bad\n", n, k,
                    t_count, rows, grid, f32, bias, acc, pad_x, pad_y, bad);
    }
}

int main(int argc, char** argv) {
    std::mt19937 rng(argc > 1 ? uint32_t(std::atoi(argv[1])) : 1u);
    struct Shape {
        int n, k;
    };
    // N: one row, off the 8-row tile, one block of 32 and one past; K: one piece, a partial chunk,
    // below and above one round (8 warps x 64 / 32 / 16 chunks of 32 for 8 / 16 / 32 rows per CTA).
    const Shape shapes[] = {{1, 64}, {7, 8}, {13, 40}, {33, 72}, {100, 520}, {40, 2112}, {70, 2880}};
    struct Epi {
        bool f32, bias, acc;
    };
    const Epi epis[] = {{false, false, false}, {false, true, false}, {true, false, false},
                        {true, true, false},   {true, false, true},  {true, true, true}};
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
    std::printf("%d of %d cases failed\n", fails, total);
    return fails ? 1 : 0;
}
