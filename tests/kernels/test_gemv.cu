// The GEMV path's edge cases (test_linear.cu runs the shared linear table): dense linears
// (kernels/cuda/linear.h), both paths, against the CPU reference matmul
// (kernels/cpu/matmul.h). The GEMV path is run for every T in 1..kGemvMaxTokens on the real gpt-oss
// shapes (qkv 5120x2880, out 2880x4096 + f32 residual, routers 32|128x2880 -> f32, unembedding
// 201088x2880 -> f32) and on small/odd ones chosen from the kernel's tiles (8-row tiles, 8/16/32 rows
// per CTA, 32-wide k chunks, 8 warps x 8..64 chunks per round): N below, at and off a multiple of the
// row block, K below one chunk, with a partial chunk, and less than / more than one round; every
// epilogue (bf16 / f32 output, bias or not, residual accumulate), padded row strides, and outputs
// poisoned with NaN first. Rows past N, tokens past T and the x padding are checked untouched.
//
// Tolerance (per element, justified): the result is Σ_k x_k w_k over K terms in FP32, by the GPU
// (tensor-core partial sums, 8 warps summed) and by the reference (16 lanes of K/16 sequential adds),
// each off by at most ~K/16 · 2^-24 · Σ|x_k w_k| <= 1.1e-5 · S at K = 4096 in the worst case (typically
// 100x less); we bound S = Σ|x_k w_k| by max|x_t| · ‖w_n‖₁ (about 2 S for uniform data) and allow
// 1e-5 of that bound, plus 1e-6 relative (bias / residual adds in f32) or 2^-8 relative for a bf16 output
// (one round-to-nearest of the FP32 result: 2^-9, doubled). A dropped 8-element piece of one row moves
// a result by ~sqrt(8) · E|x w| ≈ 0.02 at K = 2880, > 50x the allowance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cpu/matmul.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda_test_util.h"
#include "kernels/kernel_test_util.h"

namespace osprey {
namespace {

constexpr auto kAuto = cuda::LinearPath::automatic;
constexpr auto kBlas = cuda::LinearPath::blas;
constexpr auto kGemv = cuda::LinearPath::gemv;
constexpr int kMaxT = cuda::kGemvMaxTokens;

// Weights, x rows and biases of one [n, k] linear, with the reference x·Wᵀ (no bias) for every x row.
struct Problem {
    int n = 0, k = 0, t_max = 0;
    uint32_t seed = 0;
    std::vector<bf16> w;        // [n, k]
    std::vector<bf16> x;        // [t_max, k]
    std::vector<bf16> bias;     // [n]
    std::vector<float> dot;     // [t_max, n] cpu::matmul_bf16w(x, w) without bias
    std::vector<float> x_max;   // [t_max] max_k |x[t][k]|
    std::vector<float> w_norm;  // [n] Σ_k |w[n][k]|
    cuda::DeviceBuffer<bf16> d_w, d_bias;
    cuda::DeviceBuffer<float> d_bias_f32;  // the same biases widened (f32 outputs take an f32 bias)
};

Problem make_problem(int n, int k, int t_max = kMaxT) {
    const uint32_t seed = test::fresh_seed();
    Problem p;
    p.n = n, p.k = k, p.t_max = t_max, p.seed = seed;
    const float w_scale = 1.0f / std::sqrt(float(k));
    p.w = test::random_bf16(size_t(n) * k, seed + 1, -w_scale, w_scale);
    p.x = test::random_bf16(size_t(t_max) * k, seed);
    p.bias = test::random_bf16(n, seed + 2);
    p.dot.resize(size_t(t_max) * n);
    cpu::matmul_bf16w(p.dot, test::to_float(p.x), p.w, {}, t_max, k, n);
    p.x_max.assign(t_max, 0.f);
    for (int t = 0; t < t_max; ++t)
        for (int i = 0; i < k; ++i) p.x_max[t] = std::max(p.x_max[t], std::abs(bf16_to_float(p.x[size_t(t) * k + i])));
    p.w_norm.assign(n, 0.f);
    for (int j = 0; j < n; ++j) {
        double s = 0;
        for (int i = 0; i < k; ++i) s += std::abs(bf16_to_float(p.w[size_t(j) * k + i]));
        p.w_norm[j] = float(s);
    }
    p.d_w = test::to_device(p.w);
    p.d_bias = test::to_device(p.bias);
    p.d_bias_f32 = test::to_device(test::to_float(p.bias));
    return p;
}

struct Case {
    int t = 1;
    bool f32 = false, bias = true, accumulate = false;
    int pad_x = 0, pad_y = 0;  // ldx = k + pad_x, ldy = n + pad_y (0: dense, passed as ld = 0)
    int rows = 0;              // LinearArgs::gemv_rows
    cuda::LinearPath path = kGemv;
};

std::string describe(const Problem& p, const Case& c) {
    return "N=" + std::to_string(p.n) + " K=" + std::to_string(p.k) + " T=" + std::to_string(c.t) +
           (c.f32 ? " f32" : " bf16") + (c.bias ? " bias" : "") + (c.accumulate ? " accumulate" : "") + " ldx+" +
           std::to_string(c.pad_x) + " ldy+" + std::to_string(c.pad_y) + " rows=" + std::to_string(c.rows) +
           (c.path == kGemv   ? " gemv"
            : c.path == kBlas ? " blas"
                              : " auto");
}

// Runs one case on fresh, poisoned buffers; returns the raw bytes of y ([t + 1, ldy]: one guard row).
// An accumulated y starts from random values drawn from y_seed (returned in *y_before).
std::vector<uint8_t> run(const Problem& p, const Case& c, cuda::Blas& blas, uint32_t y_seed,
                         std::vector<uint8_t>* y_before = nullptr) {
    const int ldx = p.k + c.pad_x, ldy = p.n + c.pad_y;
    const size_t esize = c.f32 ? 4 : 2;
    // x rows with NaN padding (never read by a correct kernel).
    std::vector<bf16> x(size_t(c.t) * ldx, bf16{0xFFFF});
    for (int t = 0; t < c.t; ++t) std::memcpy(&x[size_t(t) * ldx], &p.x[size_t(t) * p.k], size_t(p.k) * sizeof(bf16));
    auto d_x = test::to_device(x);
    // y: NaN everywhere, or (accumulate) random f32 values; one guard row past T.
    const size_t y_elems = size_t(c.t + 1) * ldy;
    std::vector<uint8_t> y0(y_elems * esize, 0xFF);
    if (c.accumulate) {
        const std::vector<float> r = test::random_floats(y_elems, y_seed);
        std::memcpy(y0.data(), r.data(), y0.size());
    }
    auto d_y = test::to_device(y0);
    cuda::LinearArgs a{.y = d_y.get(),
                       .x = d_x.get(),
                       .w = p.d_w.get(),
                       .bias = !c.bias ? nullptr
                               : c.f32 ? (const void*)p.d_bias_f32.get()
                                       : (const void*)p.d_bias.get(),
                       .n_tokens = c.t,
                       .n_out = p.n,
                       .n_in = p.k,
                       .ldx = c.pad_x ? ldx : 0,
                       .ldy = c.pad_y ? ldy : 0,
                       .y_f32 = c.f32,
                       .accumulate = c.accumulate,
                       .path = c.path,
                       .gemv_rows = c.rows};
    blas.linear(a, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    if (y_before) *y_before = y0;
    return d_y.download();
}

// Checks one case: every y[t < T][j < N] against the reference, everything else untouched.
void check(const Problem& p, const Case& c, cuda::Blas& blas) {
    SCOPED_TRACE(describe(p, c));
    ASSERT_LE(c.t, p.t_max);
    const int ldy = p.n + c.pad_y;
    std::vector<uint8_t> y0;
    const std::vector<uint8_t> y = run(p, c, blas, p.seed + 3 + uint32_t(c.t), &y0);
    const size_t esize = c.f32 ? 4 : 2;
    auto value = [&](const std::vector<uint8_t>& v, size_t i) {
        if (c.f32) {
            float f;
            std::memcpy(&f, &v[i * 4], 4);
            return f;
        }
        bf16 b;
        std::memcpy(&b, &v[i * 2], 2);
        return bf16_to_float(b);
    };
    double worst = -1;  // worst |got - want| / tolerance
    size_t worst_t = 0, worst_j = 0;
    double worst_got = 0, worst_want = 0;
    for (int t = 0; t < c.t; ++t)
        for (int j = 0; j < p.n; ++j) {
            const size_t i = size_t(t) * ldy + j;
            double want = p.dot[size_t(t) * p.n + j];
            if (c.bias) want += bf16_to_float(p.bias[j]);
            if (c.accumulate) want += value(y0, i);
            const double tol = 1e-5 * double(p.x_max[t]) * p.w_norm[j] + (c.f32 ? 1e-6 : 1.0 / 256) * std::abs(want);
            const double got = value(y, i);
            const double ratio = std::isnan(got) ? INFINITY : std::abs(got - want) / tol;
            if (ratio > worst) worst = ratio, worst_t = t, worst_j = j, worst_got = got, worst_want = want;
        }
    EXPECT_LE(worst, 1.0) << "worst element: token " << worst_t << ", row " << worst_j << ": got " << worst_got
                          << ", want " << worst_want << " (error " << worst << "x the tolerance)";
    // Row padding, the guard row past T: bit-identical to before.
    size_t changed = 0, first = 0;
    for (int t = 0; t <= c.t; ++t)
        for (int j = t < c.t ? p.n : 0; j < ldy; ++j) {
            const size_t i = size_t(t) * ldy + j;
            if (std::memcmp(&y[i * esize], &y0[i * esize], esize) != 0 && changed++ == 0) first = i;
        }
    EXPECT_EQ(changed, 0u) << "elements outside y[T, N] written, the first at " << first / ldy << ", " << first % ldy;
}

// Every epilogue the API allows: bf16 output (bias or not), f32 output (bias or not, accumulate or not).
struct Epilogue {
    bool f32, bias, accumulate;
};
constexpr Epilogue kEpilogues[] = {{false, false, false}, {false, true, false}, {true, false, false},
                                   {true, true, false},   {true, false, true},  {true, true, true}};

// Small and odd shapes: every T, every epilogue, every rows-per-CTA choice, dense and padded strides.
TEST(cuda_gemv, gemv_small_shapes_every_token_count_and_epilogue) {
    cuda::Blas blas;
    const std::pair<int, int> shapes[] = {
        {1, 64},   // one row: 7 of the 8 rows of the tile are past N
        {7, 8},    // K below one 32-wide chunk (one 8-element piece)
        {13, 40},  // a chunk and a piece; N off the tile
        {32, 64},  // exactly one row block of 32
        {33, 72},  // one row past a block; partial chunk
        {100, 2880}, {250, 4096},
        {1000, 520},  // 8 warps x 8 chunks = 64 chunks per round at 8 rows: K = 520 is 17 chunks, rounds vary
    };
    for (const auto& [n, k] : shapes) {
        const Problem p = make_problem(n, k);
        for (int t = 1; t <= kMaxT; ++t)
            for (const Epilogue& e : kEpilogues)
                for (const int rows : {0, 8, 16, 32})
                    for (const int pad : {0, 1}) {
                        check(p,
                              {.t = t,
                               .f32 = e.f32,
                               .bias = e.bias,
                               .accumulate = e.accumulate,
                               .pad_x = 24 * pad,
                               .pad_y = 5 * pad,
                               .rows = rows},
                              blas);
                        if (HasFailure()) return;  // one report, not thousands
                    }
    }
}

// More row blocks than the persistent grid (2 CTAs per SM): each CTA loops over several blocks and
// its prefetch crosses block boundaries.
TEST(cuda_gemv, gemv_many_row_blocks_per_cta) {
    cuda::Blas blas;
    const Problem p = make_problem(20011, 136);  // 20011 = prime; 2501 8-row blocks
    for (const int t : {1, 2, 5, 8})
        for (const int rows : {8, 16, 32}) {
            check(p, {.t = t, .f32 = true, .bias = true, .rows = rows}, blas);
            check(p, {.t = t, .f32 = false, .bias = true, .pad_x = 8, .pad_y = 3, .rows = rows}, blas);
        }
}

// The real shapes with their real epilogue, every T, on the GEMV path, then cuBLASLt and the
// automatic choice on a few.
TEST(cuda_gemv, qkv_every_token_count) {
    cuda::Blas blas;
    const Problem p = make_problem(5120, 2880);
    for (int t = 1; t <= kMaxT; ++t) check(p, {.t = t}, blas);
    for (const Epilogue& e : kEpilogues)
        check(p, {.t = kMaxT, .f32 = e.f32, .bias = e.bias, .accumulate = e.accumulate}, blas);
    for (const int rows : {8, 16, 32}) check(p, {.t = 3, .rows = rows}, blas);
    check(p, {.t = 3, .pad_x = 64, .pad_y = 8}, blas);  // qkv rows of a wider activation
    check(p, {.t = 1, .path = kBlas}, blas);
    check(p, {.t = 8, .path = kBlas}, blas);
    check(p, {.t = 6, .path = kAuto}, blas);
}

TEST(cuda_gemv, out_proj_accumulates_residual_every_token_count) {
    cuda::Blas blas;
    const Problem p = make_problem(2880, 4096);
    for (int t = 1; t <= kMaxT; ++t) check(p, {.t = t, .f32 = true, .accumulate = true}, blas);
    for (const int rows : {8, 16, 32}) check(p, {.t = 8, .f32 = true, .accumulate = true, .rows = rows}, blas);
    check(p, {.t = 7, .f32 = true, .accumulate = true, .pad_x = 16, .pad_y = 40}, blas);
    check(p, {.t = 8, .f32 = true, .accumulate = true, .path = kBlas}, blas);
}

TEST(cuda_gemv, routers_every_token_count) {
    cuda::Blas blas;
    for (const int n : {32, 128}) {
        const Problem p = make_problem(n, 2880);
        for (int t = 1; t <= kMaxT; ++t) check(p, {.t = t, .f32 = true}, blas);
        check(p, {.t = 4, .f32 = true, .path = kBlas}, blas);
    }
}

TEST(cuda_gemv, unembedding_every_token_count) {
    cuda::Blas blas;
    const Problem p = make_problem(201088, 2880);
    for (int t = 1; t <= kMaxT; ++t) check(p, {.t = t, .f32 = true, .bias = false}, blas);
    check(p, {.t = 2, .f32 = true, .bias = false, .path = kBlas}, blas);
    // Determinism: the same call twice is bit-identical (fixed reduction order, no atomics).
    const Case c{.t = 5, .f32 = true, .bias = false};
    EXPECT_TRUE(run(p, c, blas, 0) == run(p, c, blas, 0)) << "two unembedding GEMVs differ";
}

// Two identical calls give bit-identical outputs (fixed reduction order, no float atomics).
TEST(cuda_gemv, gemv_is_deterministic) {
    cuda::Blas blas;
    for (const auto& [n, k] : {std::pair{5120, 2880}, std::pair{2880, 4096}, std::pair{32, 2880}}) {
        const Problem p = make_problem(n, k);
        for (const int rows : {0, 8, 32})
            for (const Epilogue& e : {kEpilogues[1], kEpilogues[5]})
                for (const int t : {1, 8}) {
                    const Case c{.t = t, .f32 = e.f32, .bias = e.bias, .accumulate = e.accumulate, .rows = rows};
                    EXPECT_TRUE(run(p, c, blas, 7) == run(p, c, blas, 7)) << describe(p, c) << ": two runs differ";
                }
    }
}

// The out-projection and the router in one launch (cuda::gemv_router_tail) against the two launches it
// replaces: the residual y, the normed rows h and the logits bit-identical, on the real shapes (out
// 2880 x 4096 with 20b's 32 and 120b's 128 experts) and a small odd one, T = 1..8, with and without the
// previous block's MoE slots added in the projection's epilogue; called three times in a row on one
// stream (the counter must come back to zero each time, or the next call's router would not wait).
TEST(cuda_gemv, router_tail_matches_two_launches) {
    cuda::Blas blas;
    cuda::DeviceBuffer<unsigned> counter(1);
    counter.fill_bytes(0);
    struct Shape {
        int d, k, experts;
    };
    for (const Shape& sh : {Shape{2880, 4096, 32}, Shape{2880, 4096, 128}, Shape{72, 136, 13}}) {
        const uint32_t seed = test::fresh_seed();
        const auto w = test::to_device(test::random_bf16(size_t(sh.d) * sh.k, seed, -0.02f, 0.02f));
        const auto wr = test::to_device(test::random_bf16(size_t(sh.experts) * sh.d, seed + 1, -0.02f, 0.02f));
        const auto b = test::to_device(test::random_floats(sh.d, seed + 2));
        const auto br = test::to_device(test::random_floats(sh.experts, seed + 3));
        const auto gain = test::to_device(test::random_floats(sh.d, seed + 4, 0.5f, 1.5f));
        const auto x = test::to_device(test::random_bf16(size_t(kMaxT) * sh.k, seed + 5));
        const std::vector<float> y0 = test::random_floats(size_t(kMaxT) * sh.d, seed + 6, -2.f, 2.f);
        const auto moe_y = test::to_device(test::random_floats(size_t(kMaxT) * 4 * sh.d, seed + 7));
        const auto moe_w = test::to_device(test::random_floats(size_t(kMaxT) * 4, seed + 8, 0.f, 0.5f));
        for (int t = 1; t <= kMaxT; ++t)
            for (const bool moe : {false, true}) {
                struct Out {
                    cuda::DeviceBuffer<float> y, logits;
                    cuda::DeviceBuffer<bf16> h;
                };
                auto fresh = [&] {
                    Out o{test::to_device(y0), test::poisoned<float>(size_t(t) * sh.experts),
                          test::poisoned<bf16>(size_t(t) * sh.d)};
                    return o;
                };
                auto args = [&](Out& o) {
                    const cuda::LinearArgs proj{.y = o.y.get(), .x = x.get(), .w = w.get(), .bias = b.get(),
                                                .n_tokens = t, .n_out = sh.d, .n_in = sh.k, .y_f32 = true,
                                                .accumulate = true, .acc_moe_y = moe ? moe_y.get() : nullptr,
                                                .acc_moe_w = moe ? moe_w.get() : nullptr};
                    const cuda::LinearArgs router{
                        .y = o.logits.get(), .w = wr.get(), .bias = br.get(), .n_tokens = t, .n_out = sh.experts,
                        .n_in = sh.d, .y_f32 = true,
                        .norm = {.res = o.y.get(), .gain = gain.get(), .h = o.h.get(), .eps = 1e-5f}};
                    return std::pair(proj, router);
                };
                Out sep = fresh();
                {
                    const auto [proj, router] = args(sep);
                    ASSERT_TRUE(cuda::gemv_router_tail_supported(proj, router)) << "d " << sh.d << " T " << t;
                    blas.linear(proj, nullptr);
                    blas.linear(router, nullptr);
                }
                for (int rep = 0; rep < 3; ++rep) {
                    Out fused = fresh();
                    const auto [proj, router] = args(fused);
                    cuda::gemv_router_tail(proj, router, counter.get(), nullptr);
                    CUDA_CHECK(cudaDeviceSynchronize());
                    const std::string what = "d " + std::to_string(sh.d) + " experts " + std::to_string(sh.experts) +
                                             " T " + std::to_string(t) + " moe " + std::to_string(moe) + " call " +
                                             std::to_string(rep);
                    const auto ys = sep.y.download(), yf = fused.y.download();
                    const auto ls = sep.logits.download(), lf = fused.logits.download();
                    const auto hs = sep.h.download(), hf = fused.h.download();
                    EXPECT_EQ(0, std::memcmp(ys.data(), yf.data(), ys.size() * sizeof(float))) << what << ": y";
                    EXPECT_EQ(0, std::memcmp(ls.data(), lf.data(), ls.size() * sizeof(float))) << what << ": logits";
                    EXPECT_EQ(0, std::memcmp(hs.data(), hf.data(), hs.size() * sizeof(bf16))) << what << ": h";
                    for (float v : lf) ASSERT_TRUE(std::isfinite(v)) << what << ": a logit was not written";
                    EXPECT_EQ(counter.download()[0], 0u) << what << ": counter left non-zero";
                }
            }
    }
}

// What gemv_router_tail_supported turns away: an FP8 or non-accumulating projection, a router that does
// not norm the projection's output, a router past 8 rows per CTA.
TEST(cuda_gemv, router_tail_rejects_other_pairs) {
    const auto w = test::poisoned<bf16>(size_t(64) * 64);
    auto y = test::poisoned<float>(64), y2 = test::poisoned<float>(64), logits = test::poisoned<float>(16);
    const auto gain = test::poisoned<float>(64);
    const auto x = test::poisoned<bf16>(64);
    const cuda::LinearArgs proj{.y = y.get(), .x = x.get(), .w = w.get(), .n_tokens = 1, .n_out = 64, .n_in = 64,
                                .y_f32 = true, .accumulate = true};
    const cuda::LinearArgs router{.y = logits.get(), .w = w.get(), .n_tokens = 1, .n_out = 16, .n_in = 64,
                                  .y_f32 = true, .norm = {.res = y.get(), .gain = gain.get()}};
    EXPECT_TRUE(cuda::gemv_router_tail_supported(proj, router));
    cuda::LinearArgs p2 = proj;
    p2.accumulate = false;
    EXPECT_FALSE(cuda::gemv_router_tail_supported(p2, router));
    p2 = proj, p2.w = nullptr, p2.w8 = {.codes = reinterpret_cast<const uint8_t*>(w.get()), .scale = gain.get()};
    EXPECT_FALSE(cuda::gemv_router_tail_supported(p2, router));
    cuda::LinearArgs r2 = router;
    r2.norm.res = y2.get();
    EXPECT_FALSE(cuda::gemv_router_tail_supported(proj, r2));
    r2 = router, r2.gemv_rows = 16;
    EXPECT_FALSE(cuda::gemv_router_tail_supported(proj, r2));
    r2 = router, r2.n_tokens = 2;
    EXPECT_FALSE(cuda::gemv_router_tail_supported(proj, r2));
    cuda::DeviceBuffer<unsigned> counter(1);
    counter.fill_bytes(0);
    EXPECT_THROW(cuda::gemv_router_tail(p2, router, counter.get(), nullptr), std::exception);
}

// cuBLASLt's shapes beyond the GEMV (prefill) through the automatic path.
TEST(cuda_gemv, prefill_shapes_use_blas) {
    cuda::Blas blas;
    {
        const Problem p = make_problem(5120, 2880, 77);
        check(p, {.t = 77, .path = kAuto}, blas);
    }
    {
        const Problem p = make_problem(2880, 4096, 33);
        check(p, {.t = 33, .f32 = true, .accumulate = true, .path = kAuto}, blas);
    }
    {
        const Problem p = make_problem(128, 2880, 300);
        check(p, {.t = 300, .f32 = true, .path = kAuto}, blas);
    }
    {
        const Problem p = make_problem(96, 64, 9);
        check(p, {.t = 9, .f32 = true, .accumulate = true, .pad_x = 16, .pad_y = 16, .path = kAuto}, blas);
        check(p, {.t = 6, .pad_x = 16, .pad_y = 16, .path = kBlas}, blas);
        check(p, {.t = 5, .bias = false, .path = kBlas}, blas);
    }
}

TEST(cuda_gemv, rejects_accumulate_into_bf16) {
    cuda::Blas blas;
    cuda::DeviceBuffer<bf16> x(64), w(64), y(64);
    EXPECT_THROW(
        blas.linear(
            {.y = y.get(), .x = x.get(), .w = w.get(), .n_tokens = 8, .n_out = 8, .n_in = 8, .accumulate = true},
            nullptr),
        Error);
}

TEST(cuda_gemv, gemv_rejects_what_it_cannot_do) {
    cuda::Blas blas;
    cuda::DeviceBuffer<bf16> x(64 * 16), w(64 * 16), y(64 * 16);
    const cuda::LinearArgs ok{
        .y = y.get(), .x = x.get(), .w = w.get(), .n_tokens = 2, .n_out = 8, .n_in = 64, .path = kGemv};
    EXPECT_NO_THROW(blas.linear(ok, nullptr));
    CUDA_CHECK(cudaDeviceSynchronize());
    cuda::LinearArgs a = ok;
    a.n_tokens = kMaxT + 1;
    EXPECT_THROW(blas.linear(a, nullptr), Error);
    a = ok, a.n_in = 60;  // K not a multiple of 8
    EXPECT_THROW(blas.linear(a, nullptr), Error);
    a = ok, a.ldx = 68;  // ldx not a multiple of 8
    EXPECT_THROW(blas.linear(a, nullptr), Error);
    a = ok, a.x = x.get() + 1;  // x not 16-byte aligned
    EXPECT_THROW(blas.linear(a, nullptr), Error);
    a = ok, a.gemv_rows = 24;
    EXPECT_THROW(blas.linear(a, nullptr), Error);
    a = ok, a.n_in = 1 << 16, a.n_tokens = 8;  // x does not fit in shared memory
    EXPECT_THROW(blas.linear(a, nullptr), Error);
}

TEST(cuda_gemv, rejects_empty_shape) {
    cuda::Blas blas;
    cuda::LinearArgs a{};
    EXPECT_THROW(blas.linear(a, nullptr), Error);
}

}  // namespace
}  // namespace osprey
