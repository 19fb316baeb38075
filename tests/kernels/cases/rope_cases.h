// Rotary position embedding in place on the fused qkv row (kernels/cuda/rope.h), with gpt-oss's YaRN
// table (model/rope.h): one table for the test (tests/kernels/test_rope_cuda.cu, against
// kernels/cpu/rope.h; v must stay untouched) and the benchmark (bench/bench_rope.cu): one token to
// prefill chunks of 8192, positions up to 32k (and 131k), fewer (head, pair)s than threads.
// Perf bytes: the q and k heads read and written, the table rows and the positions read.
// FP8 KV (Case::fp8, kernels/cuda/kv_fp8.h): the roped K and the V heads of every token quantised into
// the step's rows (and with a store into the cache), checked bit for bit against core/fp8.h's
// quantisation of the kernel's own BF16 output; token 0's first K and V heads are zero (multiplier 1).
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/fp8.h"
#include "kernels/cases/harness.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/rope.h"
#include "model/rope.h"

namespace osprey::cases::rope {

inline constexpr int kHeadDim = 64;

struct Case {
    std::string name;   // gtest name; empty: identifier(label)
    std::string label;  // bench label
    Use use = Use::both;
    int n_tokens = 1;
    int n_q = 64, n_kv = 8;  // heads
    int max_pos = 32768;     // positions drawn below it (the first token at max_pos - 1)
    int store_rows = 0;      // > 0: also store K/V into a cache of blocks of this many rows (decode fusion)
    bool fp8 = false;        // FP8 KV: quantise K/V into the step's rows (and the cache when storing)
};

inline Result run(const Case& c, Mode mode) {
    Result r;
    r.seed = case_seed(mode);
    model::Config cfg;
    model::RopeTable table(cfg, c.max_pos);
    const int ld = (c.n_q + 2 * c.n_kv) * kHeadDim, n_rot = (c.n_q + c.n_kv) * kHeadDim;
    const size_t elems = size_t(c.n_tokens) * ld;
    auto d_qkv = device_uniform<bf16>(elems, stream_seed(r.seed, 1), -1.f, 1.f);
    std::mt19937 rng(r.seed);
    std::vector<int32_t> pos(c.n_tokens);
    for (int32_t& p : pos) p = int32_t(rng() % c.max_pos);
    pos[0] = c.max_pos - 1;
    auto d_pos = to_device(pos);
    auto d_cos = to_device(std::vector<float>(table.cos().begin(), table.cos().end()));
    auto d_sin = to_device(std::vector<float>(table.sin().begin(), table.sin().end()));
    if (c.fp8 && mode == Mode::check) {  // token 0: an all-zero K head and V head (multiplier 1, codes 0)
        std::vector<bf16> h = d_qkv.download(elems);
        for (int d = 0; d < kHeadDim; ++d)
            h[size_t(c.n_q) * kHeadDim + d] = h[size_t(c.n_q + c.n_kv) * kHeadDim + d] = float_to_bf16(0.0f);
        d_qkv.upload(h);
    }
    const std::vector<bf16> qkv = mode == Mode::check ? d_qkv.download(elems) : std::vector<bf16>{};
    cuda::RopeArgs a{.qkv = d_qkv.get(), .positions = d_pos.get(), .cos = d_cos.get(), .sin = d_sin.get(),
                     .n_tokens = c.n_tokens, .ld = ld, .n_q_heads = c.n_q, .n_kv_heads = c.n_kv,
                     .head_dim = kHeadDim};
    // The fused store: token t to block n_tokens - 1 - t (blocks in reverse order), row pos % rows, in a
    // cache of n_tokens blocks poisoned with NaN; every other row must stay NaN.
    const int n_blocks = c.store_rows > 0 ? c.n_tokens : 0;
    const size_t cache_elems = size_t(n_blocks) * c.n_kv * std::max(c.store_rows, 1) * kHeadDim;
    std::vector<cuda::KvStoreRow> dst;
    for (int t = 0; t < n_blocks; ++t) dst.push_back({t, n_blocks - 1 - t, pos[size_t(t)] % c.store_rows});
    auto d_dst = to_device(dst);
    auto d_k = poisoned<bf16>(cache_elems), d_v = poisoned<bf16>(cache_elems);
    if (c.store_rows > 0) {
        a.store = d_dst.get();
        a.k_cache = d_k.get();
        a.v_cache = d_v.get();
        a.rows = c.store_rows;
    }
    // FP8: the step's rows [T, n_kv, 64] and (storing) the cache's, all poisoned (0xFF: NaN code and scale).
    const size_t step_rows = size_t(c.n_tokens) * c.n_kv, cache_rows = cache_elems / kHeadDim;
    auto d_sk8 = poisoned<uint8_t>(step_rows * kHeadDim), d_sv8 = poisoned<uint8_t>(step_rows * kHeadDim);
    auto d_sks = poisoned<float>(step_rows), d_svs = poisoned<float>(step_rows);
    auto d_k8 = poisoned<uint8_t>(cache_elems), d_v8 = poisoned<uint8_t>(cache_elems);
    auto d_ks = poisoned<float>(cache_rows), d_vs = poisoned<float>(cache_rows);
    if (c.fp8) {
        a.step8 = {d_sk8.get(), d_sv8.get(), d_sks.get(), d_svs.get()};
        if (c.store_rows > 0) {
            a.k_cache = a.v_cache = nullptr;
            a.cache8 = {d_k8.get(), d_v8.get(), d_ks.get(), d_vs.get()};
        }
    }

    if (mode == Mode::perf) {
        const double us = time_us([&](int) { cuda::rope(a, nullptr); }, iters_or(50));
        const double bytes = double(c.n_tokens) * (2.0 * 2 * n_rot + 2.0 * 4 * (kHeadDim / 2) + 4);
        r.timings.push_back({c.label, us, bytes, 0.0});
        return r;
    }

    cuda::rope(a, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    // Reference: rotate the q and k heads (as floats of the same bf16 values).
    std::vector<float> qk(size_t(c.n_tokens) * n_rot);
    for (int t = 0; t < c.n_tokens; ++t)
        for (int i = 0; i < n_rot; ++i) qk[size_t(t) * n_rot + i] = bf16_to_float(qkv[size_t(t) * ld + i]);
    cpu::rope(qk, pos, c.n_q + c.n_kv, kHeadDim, table.cos(), table.sin());
    const std::vector<bf16> out = d_qkv.download(elems);
    std::vector<float> got_qk(qk.size()), got_v, want_v;
    for (int t = 0; t < c.n_tokens; ++t) {
        for (int i = 0; i < n_rot; ++i) got_qk[size_t(t) * n_rot + i] = bf16_to_float(out[size_t(t) * ld + i]);
        for (int i = n_rot; i < ld; ++i) {
            got_v.push_back(bf16_to_float(out[size_t(t) * ld + i]));
            want_v.push_back(bf16_to_float(qkv[size_t(t) * ld + i]));
        }
    }
    // Inputs |x| <= 1 times a table entry <= 1.35 (the YaRN concentration): outputs up to ~2.7,
    // rounded once to bf16 (half an ulp at 2..4 is 2^-7); f32 products are otherwise identical.
    expect_close(r, got_qk, to_double(qk), 1.0 / 128, 0.0, "rope q/k");
    expect_close(r, got_v, to_double(want_v), 0.0, 0.0, "rope leaves v alone");
    if (c.fp8) {
        // Codes and multipliers of every (token, K/V head), from the kernel's own BF16 output.
        const std::vector<uint8_t> sk8 = d_sk8.download(step_rows * kHeadDim), sv8 = d_sv8.download(step_rows * kHeadDim);
        const std::vector<float> sks = d_sks.download(step_rows), svs = d_svs.download(step_rows);
        const std::vector<uint8_t> k8 = d_k8.download(cache_elems), v8 = d_v8.download(cache_elems);
        const std::vector<float> ks = d_ks.download(cache_rows), vs = d_vs.download(cache_rows);
        size_t bad_codes = 0, bad_scales = 0, bad_cache = 0;
        for (int t = 0; t < c.n_tokens; ++t)
            for (int g = 0; g < c.n_kv; ++g)
                for (int is_v = 0; is_v < 2; ++is_v) {
                    const bf16* x = out.data() + size_t(t) * ld + (c.n_q + is_v * c.n_kv + g) * kHeadDim;
                    float amax = 0;
                    for (int d = 0; d < kHeadDim; ++d) amax = std::fmax(amax, std::fabs(bf16_to_float(x[d])));
                    const float sc = fp8::block_scale_inv(amax);
                    const size_t si = size_t(t) * c.n_kv + g;
                    const float got_s = (is_v ? svs : sks)[si];
                    bad_scales += got_s != sc;
                    const size_t ci = c.store_rows > 0
                                          ? (size_t(dst[size_t(t)].block) * c.n_kv + g) * c.store_rows + dst[size_t(t)].row
                                          : 0;
                    if (c.store_rows > 0) bad_cache += (is_v ? vs : ks)[ci] != sc;
                    for (int d = 0; d < kHeadDim; ++d) {
                        const uint8_t want = fp8::quantize(bf16_to_float(x[d]), sc);
                        bad_codes += (is_v ? sv8 : sk8)[si * kHeadDim + d] != want;
                        if (c.store_rows > 0) bad_cache += (is_v ? v8 : k8)[ci * kHeadDim + d] != want;
                    }
                }
        if (bad_codes || bad_scales)
            r.fail("fp8 step rows: ", bad_codes, " codes and ", bad_scales, " multipliers differ from core/fp8.h");
        if (bad_cache) r.fail("fp8 cache store: ", bad_cache, " codes or multipliers differ");
        if (c.store_rows > 0) {  // nothing written elsewhere: every other byte still 0xFF, the BF16 cache untouched
            size_t written = 0;
            for (uint8_t b : k8) written += b != 0xFF;
            size_t expect_max = step_rows * kHeadDim;
            if (written > expect_max) r.fail("fp8 k cache: ", written, " bytes written, at most ", expect_max, " expected");
            for (float f : to_float(d_k.download(cache_elems)))
                if (!std::isnan(f)) {
                    r.fail("fp8 store wrote the BF16 cache");
                    break;
                }
        }
        return r;
    }
    if (c.store_rows > 0) {
        // The cache rows are exactly the roped k and the untouched v of the qkv rows (bit for bit).
        const std::vector<bf16> kc = d_k.download(cache_elems), vc = d_v.download(cache_elems);
        std::vector<float> got_k, want_k, got_vc, want_vc;
        size_t n_nan = 0;
        for (float f : to_float(kc)) n_nan += std::isnan(f);
        for (int t = 0; t < c.n_tokens; ++t)
            for (int g = 0; g < c.n_kv; ++g)
                for (int d = 0; d < kHeadDim; ++d) {
                    const size_t at =
                        ((size_t(dst[size_t(t)].block) * c.n_kv + g) * c.store_rows + dst[size_t(t)].row) * kHeadDim + d;
                    got_k.push_back(bf16_to_float(kc[at]));
                    want_k.push_back(bf16_to_float(out[size_t(t) * ld + (c.n_q + g) * kHeadDim + d]));
                    got_vc.push_back(bf16_to_float(vc[at]));
                    want_vc.push_back(bf16_to_float(out[size_t(t) * ld + (c.n_q + c.n_kv + g) * kHeadDim + d]));
                }
        expect_close(r, got_k, to_double(want_k), 0.0, 0.0, "stored k");
        expect_close(r, got_vc, to_double(want_vc), 0.0, 0.0, "stored v");
        // Every cache element outside the stored rows is still NaN (nothing written elsewhere).
        const size_t untouched = cache_elems - size_t(c.n_tokens) * c.n_kv * kHeadDim;
        if (n_nan != untouched) r.fail(str("k cache: ", cache_elems - n_nan, " elements written, expected ",
                                            size_t(c.n_tokens) * c.n_kv * kHeadDim));
    }
    return r;
}

inline std::vector<Case> cases() {
    std::vector<Case> t;
    auto edge = [&](const char* name, Case c) {
        c.name = name;
        c.label = str("rope ", name);
        c.use = Use::check_only;
        t.push_back(c);
    };
    edge("one_token", {.n_tokens = 1, .max_pos = 16});
    edge("fewer_pairs_than_threads", {.n_tokens = 3, .n_q = 2, .n_kv = 1, .max_pos = 100});
    edge("gpt_oss_prefill", {.n_tokens = 300, .max_pos = 4096});
    edge("long_positions", {.n_tokens = 17, .max_pos = 131072});
    // The decode fusion (rope.h: store): ring-sized and page-sized blocks, gpt-oss and odd head counts.
    edge("store_ring_rows", {.n_tokens = 5, .max_pos = 4096, .store_rows = 128});
    edge("store_page_rows", {.n_tokens = 64, .max_pos = 32768, .store_rows = 32});
    edge("store_few_heads", {.n_tokens = 3, .n_q = 2, .n_kv = 1, .max_pos = 100, .store_rows = 16});
    // FP8 KV: the step's rows quantised (prefill sizes), and with the decode store into ring and page rows.
    edge("fp8_quantise_prefill", {.n_tokens = 300, .max_pos = 4096, .fp8 = true});
    edge("fp8_quantise_few_heads", {.n_tokens = 3, .n_q = 2, .n_kv = 1, .max_pos = 100, .fp8 = true});
    edge("fp8_store_ring_rows", {.n_tokens = 5, .max_pos = 4096, .store_rows = 131, .fp8 = true});
    edge("fp8_store_page_rows", {.n_tokens = 64, .max_pos = 32768, .store_rows = 32, .fp8 = true});
    // gpt-oss (64 q + 8 k heads rotated, v skipped), decode and prefill token counts, contexts to 32k.
    for (int n : {1, 8, 64, 128, 1024, 8192}) t.push_back({.label = str("rope T=", n, " pos<32768"), .n_tokens = n});
    for (int n : {128, 8192}) t.push_back({.label = str("rope T=", n, " pos<32768 fp8"), .n_tokens = n, .fp8 = true});
    return t;
}

}  // namespace osprey::cases::rope
