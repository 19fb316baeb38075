// Sink attention over the paged KV cache (kernels/cuda/attention.h) and the K/V store that follows it
// (kernels/cuda/kv_store.h): one table of ragged batches for the test (tests/kernels/test_attention_cuda.cu,
// against kernels/cpu/attention.h) and the benchmark (bench/bench_attention.cu).
//
// A case is a list of sequences, each a slice of n_tokens query tokens at positions start_pos.. whose
// keys [0, start_pos) are in the cache: decode tokens (one token) with short and long contexts (one
// KV split, several), prefill chunks from an empty cache and continuing a cached prefix, mixed in one
// call; full layers (pages of page_size rows, shuffled ids) and sliding layers (a 128-row ring per
// sequence, including the window boundary at positions 127, 128, 129 and chunks longer than the ring).
// Always gpt-oss's heads: 64 query / 8 KV heads of dim 64 (the only ones compiled).
//
// Check: the attention output against the CPU reference, then the step's K/V stored and every cache
// element compared (written rows and, as important, untouched ones). Perf: attention alone; bytes are
// the K/V rows the longest token of each sequence reads, FLOPs 4 · heads · head_dim per (query, key).
// Cases whose CPU reference would exceed ~5e10 of those FLOPs or 2^28 cache elements are perf-only
// (their classes are checked smaller: long prefill at 1024 tokens, batch 64 at 1k contexts).
//
// FP8 KV cache (Case::fp8, kernels/cuda/kv_fp8.h): the same random BF16 K/V quantised on the device per
// (row, KV head) into codes and multipliers, the step's own rows too (as rope() does); the reference is
// the CPU attention over exactly what each path reads: decode tokens the codes times their multipliers
// (FP32), prefill chunks BF16(code · s) (what both prefill kernels stage). Bytes: 64 codes + 4 for
// the multiplier per row, K and V.
//
// Fused RoPE (Case::fused_rope, decode tokens over a BF16 cache; attention.h AttnArgs::rope_cos): qkv is
// unrotated, the kernel rotates q and the own key and stores the roped K and the V rows at each token's
// position. Reference: rope() on a copy of qkv (the unfused path), then the CPU attention over it; the
// cache must equal its previous contents with exactly those rows replaced by rope()'s bits.
#pragma once

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cases/harness.h"
#include "kernels/cpu/attention.h"
#include "core/fp8.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_fp8.cuh"
#include "kernels/cuda/kv_store.h"
#include "kernels/cuda/rope.h"

namespace osprey::cases::attention {

inline constexpr int kD = 64;                      // head_dim
inline constexpr int kNkv = 8;                     // KV heads
inline constexpr int kNq = kNkv * cuda::kAttnGroup;  // 64 query heads
inline constexpr int kLd = (kNq + 2 * kNkv) * kD;  // qkv row: q heads, k heads, v heads

struct Seq {
    int start_pos = 0;
    int n_tokens = 1;
    int first_key = 0;  // ring layers: first position present (a prefix-cache replay's start)
};

struct Case {
    std::string name;       // gtest name; empty: identifier(label)
    std::string label;      // bench label
    Use use = Use::both;
    int page_size = 16;     // rows per page of a full layer
    int window = 0;         // 0: full layer with pages; else a ring of `window` rows per sequence
    float q_scale = 1.0f;   // queries scaled (sharper softmax)
    bool shuffle_pages = true;  // page ids in random order (false: in position order, as a fresh cache)
    bool merge_kernel = false;  // split decode tokens merged by attention_merge_kernel (false: in the
                                // decode kernel, with arrival counters, as the forward does)
    bool wgmma = false;         // prefill items on the wgmma kernel (false: $OSPREY_ATTN_WGMMA decides)
    int wgmma_variant = -1;     // its variant (kAttnWgmmaVariants; -1: $OSPREY_ATTN_WGMMA_VARIANT decides)
    bool mma_sync = false;      // prefill items on the mma.sync kernel whatever $OSPREY_ATTN_WGMMA says
    bool fp8 = false;           // FP8 KV cache (see above)
    bool fp8_bf16_mma = false;  // its decode kernel with BF16 MMAs (false: $OSPREY_ATTN_FP8_DECODE decides)
    bool fused_rope = false;    // RoPE and the K/V store fused into decode (see above)
    std::vector<Seq> seqs;
};

// Quantises rows of 64 BF16 values (row r at x + (r / per) * ld + (r % per) * 64: `per` heads of a
// qkv row, or per = rows of a contiguous cache) into E4M3 codes [r, 64] and multipliers [r], as rope()
// does (kv_fp8.cuh: amax / 448, IEEE division, round to nearest even, saturating). One thread per row.
__global__ void quantise_kv_rows_kernel(const bf16* x, size_t n_rows, int per, size_t ld, uint8_t* codes,
                                        float* scales) {
    const size_t r = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    if (r >= n_rows) return;
    const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(x) + (r / per) * ld + (r % per) * 64;
    float amax = 0.f;
    for (int d = 0; d < 64; ++d) amax = fmaxf(amax, fabsf(__bfloat162float(v[d])));
    const float s = cuda::kv_fp8_scale(amax);
    for (int d = 0; d < 64; d += 2)
        *reinterpret_cast<uint16_t*>(codes + r * 64 + d) =
            cuda::kv_fp8_encode2(__bfloat162float(v[d]), __bfloat162float(v[d + 1]), s);
    scales[r] = s;
}
inline void quantise_kv_rows(const bf16* x, size_t n_rows, int per, size_t ld, uint8_t* codes, float* scales) {
    if (n_rows == 0) return;
    quantise_kv_rows_kernel<<<unsigned((n_rows + 127) / 128), 128>>>(x, n_rows, per, ld, codes, scales);
    CUDA_CHECK(cudaGetLastError());
}

// Keys a query at `pos` of `s` attends to, under the case's window.
inline int keys_of(const Case& c, const Seq& s, int pos) {
    const int lo = std::max(s.first_key, c.window ? pos - c.window + 1 : 0);
    return pos + 1 - lo;
}
// The bench's bytes (K and V rows of each sequence's longest token: bf16, or FP8 codes and a 4-byte
// multiplier per row) and FLOPs (QK and PV).
inline double bytes_of(const Case& c) {
    double b = 0;
    for (const Seq& s : c.seqs) {
        int keys = 0;
        for (int t = 0; t < s.n_tokens; ++t) keys = std::max(keys, keys_of(c, s, s.start_pos + t));
        b += double(keys) * kNkv * (c.fp8 ? kD + 4 : kD * 2) * 2;
    }
    return b;
}
inline double flops_of(const Case& c) {
    double pairs = 0;
    for (const Seq& s : c.seqs)
        for (int t = 0; t < s.n_tokens; ++t) pairs += keys_of(c, s, s.start_pos + t);
    return pairs * kNq * kD * 4;
}
inline double cache_elems_of(const Case& c) {
    const int rows = c.window ? c.window : c.page_size;
    double blocks = c.window ? double(c.seqs.size() + 1) : 0.0;
    if (!c.window)
        for (const Seq& s : c.seqs) blocks += (s.start_pos + s.n_tokens + rows - 1) / rows;
    return blocks * kNkv * rows * kD;
}

inline Result run(const Case& c, Mode mode) {
    Result r;
    r.seed = case_seed(mode);
    std::mt19937 rng(r.seed);
    const bool ring = c.window > 0;
    const int rows = ring ? c.window : c.page_size;
    const int n_seqs = int(c.seqs.size());
    int n_tokens = 0;
    for (const Seq& s : c.seqs) n_tokens += s.n_tokens;

    // Pages: every sequence gets pages for [0, start_pos + n_tokens), ids shuffled globally.
    std::vector<std::vector<int32_t>> pages(n_seqs);
    int n_pages = 0;
    for (int i = 0; i < n_seqs; ++i) {
        const int need = (c.seqs[i].start_pos + c.seqs[i].n_tokens + rows - 1) / rows;
        for (int p = 0; p < need; ++p) pages[i].push_back(n_pages++);
    }
    std::vector<int32_t> perm(std::max(1, n_pages));
    std::iota(perm.begin(), perm.end(), 0);
    if (c.shuffle_pages) std::shuffle(perm.begin(), perm.end(), rng);
    for (auto& pt : pages)
        for (int32_t& p : pt) p = perm[p];
    const int n_blocks = ring ? n_seqs + 1 : std::max(1, n_pages);

    // Cache (random everywhere: rows never written by a position are garbage, never read), queries,
    // keys and values of this step, sinks.
    const size_t cache_elems = size_t(n_blocks) * kNkv * rows * kD;
    auto d_k = device_uniform<bf16>(cache_elems, stream_seed(r.seed, 1), -1.f, 1.f);
    auto d_v = device_uniform<bf16>(cache_elems, stream_seed(r.seed, 2), -1.f, 1.f);
    auto d_qkv = device_uniform<bf16>(size_t(n_tokens) * kLd, stream_seed(r.seed, 3), -1.f, 1.f);
    auto d_sinks = device_uniform<bf16>(kNq, stream_seed(r.seed, 4), -2.f, 2.f);
    if (c.q_scale != 1.0f) {
        std::vector<bf16> qkv = d_qkv.download(size_t(n_tokens) * kLd);
        for (int t = 0; t < n_tokens; ++t)
            for (int i = 0; i < kNq * kD; ++i) {
                bf16& q = qkv[size_t(t) * kLd + i];
                q = float_to_bf16(bf16_to_float(q) * c.q_scale);
            }
        d_qkv.upload(qkv);
    }

    // Ring slots: sequence i uses slot n_blocks - 1 - i (not its index, to catch mix-ups).
    std::vector<cuda::AttnSlice> slices;
    std::vector<int32_t> page_table;
    int first = 0;
    for (int i = 0; i < n_seqs; ++i) {
        const Seq& s = c.seqs[i];
        slices.push_back({first, s.n_tokens, s.start_pos, int32_t(n_blocks - 1 - i), int32_t(page_table.size()),
                          ring ? s.first_key : 0});
        page_table.insert(page_table.end(), pages[i].begin(), pages[i].end());
        first += s.n_tokens;
    }

    const cuda::AttnPlan plan =
        cuda::plan_attention(slices, c.window, kNkv, 2 * cuda::sm_count(), false,
                             c.wgmma      ? cuda::AttnPrefillKernel::wgmma
                             : c.mma_sync ? cuda::AttnPrefillKernel::mma_sync
                                          : cuda::attention_prefill_kernel_default(),
                             c.wgmma_variant >= 0 ? c.wgmma_variant : cuda::attention_wgmma_variant_default());
    auto d_pt = to_device(page_table);
    auto d_out = poisoned<bf16>(size_t(n_tokens) * kNq * kD);
    auto d_dec = to_device(plan.decode);
    auto d_pre = to_device(plan.prefill);
    auto d_mg = to_device(plan.merges);
    const size_t n_part = std::max(1, plan.n_partials);
    auto d_pacc = poisoned<float>(n_part * kNkv * cuda::kAttnGroup * kD);
    auto d_pml = poisoned<float2>(n_part * kNkv * cuda::kAttnGroup);
    const size_t n_counters = std::max<size_t>(1, plan.merges.size()) * kNkv;
    auto d_counters = to_device(std::vector<int32_t>(n_counters, 0));
    cuda::AttnArgs a{.out = d_out.get(), .ld_out = kNq * kD, .qkv = d_qkv.get(), .ld_qkv = kLd,
                     .k_cache = d_k.get(), .v_cache = d_v.get(), .rows = rows, .ring = ring,
                     .window = c.window, .page_table = d_pt.get(), .sinks = d_sinks.get(), .n_q_heads = kNq,
                     .n_kv_heads = kNkv, .head_dim = kD, .partial_acc = d_pacc.get(),
                     .partial_ml = d_pml.get(), .merge_counters = c.merge_kernel ? nullptr : d_counters.get()};
    // FP8: the cache rows [block, head, row] and the step's rows [token, head] quantised on the device.
    const size_t cache_rows = cache_elems / kD, step_rows = size_t(n_tokens) * kNkv;
    cuda::DeviceBuffer<uint8_t> d_k8(c.fp8 ? cache_elems : 1), d_v8(c.fp8 ? cache_elems : 1);
    cuda::DeviceBuffer<float> d_ks(c.fp8 ? cache_rows : 1), d_vs(c.fp8 ? cache_rows : 1);
    cuda::DeviceBuffer<uint8_t> d_sk8(std::max<size_t>(1, step_rows * kD)), d_sv8(std::max<size_t>(1, step_rows * kD));
    cuda::DeviceBuffer<float> d_sks(std::max<size_t>(1, step_rows)), d_svs(std::max<size_t>(1, step_rows));
    if (c.fp8) {
        quantise_kv_rows(d_k.get(), cache_rows, 1, kD, d_k8.get(), d_ks.get());
        quantise_kv_rows(d_v.get(), cache_rows, 1, kD, d_v8.get(), d_vs.get());
        quantise_kv_rows(d_qkv.get() + kNq * kD, step_rows, kNkv, kLd, d_sk8.get(), d_sks.get());
        quantise_kv_rows(d_qkv.get() + (kNq + kNkv) * kD, step_rows, kNkv, kLd, d_sv8.get(), d_svs.get());
        CUDA_CHECK(cudaDeviceSynchronize());
        d_k = cuda::DeviceBuffer<bf16>(1);  // the BF16 cache is gone: a kernel reading it would fault
        d_v = cuda::DeviceBuffer<bf16>(1);
        a.k_cache = a.v_cache = nullptr;
        a.cache8 = {d_k8.get(), d_v8.get(), d_ks.get(), d_vs.get()};
        a.step8 = {d_sk8.get(), d_sv8.get(), d_sks.get(), d_svs.get()};
    }
    // Fused RoPE: random cos/sin tables, the unfused path's roped qkv (rope() on a copy) for the reference.
    cuda::DeviceBuffer<bf16> d_roped(1);
    cuda::DeviceBuffer<float> d_cos(1), d_sin(1);
    std::vector<bf16> k_before, v_before;
    if (c.fused_rope) {
        OSPREY_CHECK(!c.fp8 && n_tokens == n_seqs, "attention case ", c.name, ": fused RoPE is for decode over BF16");
        int n_pos = 1;
        std::vector<int32_t> pos;
        for (const Seq& s : c.seqs) n_pos = std::max(n_pos, s.start_pos + 1), pos.push_back(s.start_pos);
        std::vector<float> cs(size_t(n_pos) * kD / 2), sn(cs.size());
        std::uniform_real_distribution<float> angle(-3.2f, 3.2f);
        for (size_t i = 0; i < cs.size(); ++i) {
            const float t = angle(rng);
            cs[i] = std::cos(t), sn[i] = std::sin(t);
        }
        d_cos = to_device(cs), d_sin = to_device(sn);
        auto d_pos = to_device(pos);
        d_roped = to_device(d_qkv.download(size_t(n_tokens) * kLd));
        cuda::rope({.qkv = d_roped.get(), .positions = d_pos.get(), .cos = d_cos.get(), .sin = d_sin.get(),
                    .n_tokens = n_tokens, .ld = kLd, .n_q_heads = kNq, .n_kv_heads = kNkv, .head_dim = kD},
                   nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        k_before = d_k.download(cache_elems), v_before = d_v.download(cache_elems);
        a.rope_cos = d_cos.get(), a.rope_sin = d_sin.get();
        a.k_store = d_k.get(), a.v_store = d_v.get();
    }
    const cuda::AttnDevicePlan dp{.decode = d_dec.get(), .n_decode = int(plan.decode.size()),
                                  .prefill = d_pre.get(), .n_prefill = int(plan.prefill.size()),
                                  .merges = d_mg.get(), .n_merges = int(plan.merges.size()),
                                  .prefill_kernel = plan.prefill_kernel,
                                  .wgmma_variant = plan.wgmma_variant,
                                  .fp8_decode = c.fp8_bf16_mma ? cuda::AttnFp8DecodeMma::bf16
                                                               : cuda::attention_fp8_decode_mma()};

    if (mode == Mode::perf) {
        const double us = time_us([&](int) { cuda::attention(a, dp, nullptr); }, iters_or(50));
        r.timings.push_back({c.label, us, bytes_of(c), flops_of(c)});
        return r;
    }

    cuda::attention(a, dp, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    if (!plan.merges.empty())
        r.note("(", plan.merges.size(), " decode tokens split into ", plan.n_partials, " partials)");
    // The fused merge leaves every counter at zero for the next call.
    for (int32_t v : d_counters.download(n_counters))
        if (v != 0) r.fail("merge counter left at ", v, " (must return to 0)");

    if (c.fp8) {
        // CPU reference over what each path reads (see the top): codes in the reference's layout
        // [blocks, rows, n_kv * head_dim] with multipliers [blocks, rows, n_kv] for decode tokens, those
        // values staged as BF16(code · s) for prefill chunks.
        const std::vector<uint8_t> k8 = d_k8.download(cache_elems), v8 = d_v8.download(cache_elems);
        const std::vector<float> ks = d_ks.download(cache_rows), vs = d_vs.download(cache_rows);
        const std::vector<uint8_t> sk8 = d_sk8.download(step_rows * kD), sv8 = d_sv8.download(step_rows * kD);
        const std::vector<float> sks = d_sks.download(step_rows), svs = d_svs.download(step_rows);
        const std::vector<float> qkv_f = to_float(d_qkv.download(size_t(n_tokens) * kLd));
        const std::vector<float> sinks_f = to_float(d_sinks.download(kNq));
        const auto& e4m3 = fp8::e4m3_table();
        auto staged = [&](uint8_t code, float sc) { return bf16_to_float(float_to_bf16(e4m3[code] * sc)); };
        std::vector<uint8_t> rk8(cache_elems), rv8(cache_elems);
        std::vector<float> rks(cache_rows), rvs(cache_rows), sk(cache_elems), sv(cache_elems);
        for (int b = 0; b < n_blocks; ++b)
            for (int g = 0; g < kNkv; ++g)
                for (int row = 0; row < rows; ++row) {
                    const size_t mine = (size_t(b) * kNkv + g) * rows + row, theirs = size_t(b) * rows + row;
                    rks[theirs * kNkv + g] = ks[mine], rvs[theirs * kNkv + g] = vs[mine];
                    for (int d = 0; d < kD; ++d) {
                        const size_t o = theirs * kNkv * kD + g * kD + d;
                        rk8[o] = k8[mine * kD + d], rv8[o] = v8[mine * kD + d];
                        sk[o] = staged(k8[mine * kD + d], ks[mine]), sv[o] = staged(v8[mine * kD + d], vs[mine]);
                    }
                }
        std::vector<double> want(size_t(n_tokens) * kNq * kD);
        for (int i = 0; i < n_seqs; ++i) {
            const cuda::AttnSlice& s = slices[i];
            const bool decode = s.n_tokens == 1;
            std::vector<float> q(size_t(s.n_tokens) * kNq * kD), out(q.size()), fk(size_t(s.n_tokens) * kNkv * kD),
                fv(fk.size());
            std::vector<int32_t> pos(s.n_tokens);
            for (int t = 0; t < s.n_tokens; ++t) {
                pos[t] = s.start_pos + t;
                for (int j = 0; j < kNq * kD; ++j) q[size_t(t) * kNq * kD + j] = qkv_f[size_t(s.first_token + t) * kLd + j];
                for (int g = 0; g < kNkv; ++g) {
                    const size_t si = size_t(s.first_token + t) * kNkv + g;
                    for (int d = 0; d < kD; ++d) {
                        const size_t o = (size_t(t) * kNkv + g) * kD + d;
                        fk[o] = decode ? e4m3[sk8[si * kD + d]] * sks[si] : staged(sk8[si * kD + d], sks[si]);
                        fv[o] = decode ? e4m3[sv8[si * kD + d]] * svs[si] : staged(sv8[si * kD + d], svs[si]);
                    }
                }
            }
            const int32_t slot = s.window_slot;
            cpu::AttentionArgs ra;
            ra.out = out;
            ra.q = q;
            ra.positions = pos;
            ra.sinks = sinks_f;
            if (decode) {
                ra.kv.cache_k8 = rk8.data(), ra.kv.cache_v8 = rv8.data();
                ra.kv.cache_k_scale = rks.data(), ra.kv.cache_v_scale = rvs.data();
            } else {
                ra.kv.cache_k = sk.data(), ra.kv.cache_v = sv.data();
            }
            ra.kv.blocks = ring ? std::span<const int32_t>(&slot, 1) : std::span<const int32_t>(pages[i]);
            ra.kv.block_rows = rows;
            ra.kv.ring = ring;
            ra.kv.n_cached = s.start_pos;
            ra.kv.first_cached = s.first_key;
            ra.kv.fresh_k = fk.data();
            ra.kv.fresh_v = fv.data();
            ra.kv.fresh_stride = kNkv * kD;
            ra.kv.n_fresh = s.n_tokens;
            ra.n_heads = kNq;
            ra.n_kv_heads = kNkv;
            ra.head_dim = kD;
            ra.window = c.window;
            ra.scale = 0.125f;
            cpu::attention_sinks(ra);
            for (size_t j = 0; j < out.size(); ++j) want[size_t(s.first_token) * kNq * kD + j] = out[j];
        }
        // As BF16 below, but 1/128 relative: decode rounds p · s_v to BF16 (code · s is not a BF16
        // value, so a term that alone makes the output of a sharp softmax carries 2^-9), then the output
        // rounding (2^-9).
        expect_close(r, to_float(d_out.download(size_t(n_tokens) * kNq * kD)), want, 1.0 / 512 + 1e-4, 1.0 / 128,
                     "attention (fp8 KV)");

        // The FP8 store: the step's codes and multipliers into the cache rows (paged: all but the first
        // token of each slice), every other byte unchanged.
        std::vector<cuda::KvStoreSlice> st;
        for (int i = 0; i < n_seqs; ++i)
            st.push_back({slices[i].first_token, slices[i].n_tokens, slices[i].start_pos, /*n_skip=*/1,
                          slices[i].window_slot, pages[i]});
        const std::vector<cuda::KvStoreRow> dst = cuda::plan_kv_store(st, ring, rows);
        auto d_dst = to_device(dst);
        cuda::kv_store({.qkv = d_qkv.get(), .ld_qkv = kLd, .n_q_heads = kNq, .n_kv_heads = kNkv, .head_dim = kD,
                        .rows = rows, .dst = d_dst.get(), .n = int(dst.size()), .step8 = a.step8, .cache8 = a.cache8},
                       nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint8_t> want_k8 = k8, want_v8 = v8;
        std::vector<float> want_ks = ks, want_vs = vs;
        for (const cuda::KvStoreRow& d : dst)
            for (int g = 0; g < kNkv; ++g) {
                const size_t to = (size_t(d.block) * kNkv + g) * rows + d.row, from = size_t(d.token) * kNkv + g;
                std::copy_n(sk8.begin() + from * kD, kD, want_k8.begin() + to * kD);
                std::copy_n(sv8.begin() + from * kD, kD, want_v8.begin() + to * kD);
                want_ks[to] = sks[from], want_vs[to] = svs[from];
            }
        size_t bad = 0;
        const std::vector<uint8_t> got_k8 = d_k8.download(cache_elems), got_v8 = d_v8.download(cache_elems);
        const std::vector<float> got_ks = d_ks.download(cache_rows), got_vs = d_vs.download(cache_rows);
        for (size_t i = 0; i < cache_elems; ++i) bad += got_k8[i] != want_k8[i] || got_v8[i] != want_v8[i];
        for (size_t i = 0; i < cache_rows; ++i) bad += got_ks[i] != want_ks[i] || got_vs[i] != want_vs[i];
        if (bad) r.fail("kv_store (fp8): ", bad, " cache codes or multipliers differ from the expected cache");
        return r;
    }

    // CPU reference: the cache in its layout [blocks, rows, n_kv * head_dim] f32.
    const std::vector<bf16> k_cache = d_k.download(cache_elems), v_cache = d_v.download(cache_elems);
    const std::vector<bf16> qkv = (c.fused_rope ? d_roped : d_qkv).download(size_t(n_tokens) * kLd);
    const std::vector<float> qkv_f = to_float(qkv), sinks_f = to_float(d_sinks.download(kNq));
    std::vector<float> ck(cache_elems), cv(cache_elems);
    for (int b = 0; b < n_blocks; ++b)
        for (int g = 0; g < kNkv; ++g)
            for (int row = 0; row < rows; ++row)
                for (int d = 0; d < kD; ++d) {
                    const size_t mine = ((size_t(b) * kNkv + g) * rows + row) * kD + d;
                    const size_t theirs = (size_t(b) * rows + row) * kNkv * kD + g * kD + d;
                    ck[theirs] = bf16_to_float(k_cache[mine]);
                    cv[theirs] = bf16_to_float(v_cache[mine]);
                }
    std::vector<double> want(size_t(n_tokens) * kNq * kD);
    for (int i = 0; i < n_seqs; ++i) {
        const cuda::AttnSlice& s = slices[i];
        std::vector<float> q(size_t(s.n_tokens) * kNq * kD), out(q.size());
        std::vector<int32_t> pos(s.n_tokens);
        for (int t = 0; t < s.n_tokens; ++t) {
            pos[t] = s.start_pos + t;
            for (int j = 0; j < kNq * kD; ++j) q[size_t(t) * kNq * kD + j] = qkv_f[size_t(s.first_token + t) * kLd + j];
        }
        const int32_t slot = s.window_slot;
        cpu::AttentionArgs ra;
        ra.out = out;
        ra.q = q;
        ra.positions = pos;
        ra.sinks = sinks_f;
        ra.kv.cache_k = ck.data();
        ra.kv.cache_v = cv.data();
        ra.kv.blocks = ring ? std::span<const int32_t>(&slot, 1) : std::span<const int32_t>(pages[i]);
        ra.kv.block_rows = rows;
        ra.kv.ring = ring;
        ra.kv.n_cached = s.start_pos;
        ra.kv.first_cached = s.first_key;
        ra.kv.fresh_k = qkv_f.data() + size_t(s.first_token) * kLd + kNq * kD;
        ra.kv.fresh_v = qkv_f.data() + size_t(s.first_token) * kLd + (kNq + kNkv) * kD;
        ra.kv.fresh_stride = kLd;
        ra.kv.n_fresh = s.n_tokens;
        ra.n_heads = kNq;
        ra.n_kv_heads = kNkv;
        ra.head_dim = kD;
        ra.window = c.window;
        ra.scale = 0.125f;
        cpu::attention_sinks(ra);
        for (size_t j = 0; j < out.size(); ++j) want[size_t(s.first_token) * kNq * kD + j] = out[j];
    }
    // Outputs are combinations Σ w_j v_j of values |v| <= 1 with weights summing to < 1. Prefill and
    // decode rows both run on tensor cores with the weights rounded to bf16 before P·V (2^-9 relative
    // each), so |error| <= 2^-9 · Σ w_j |v_j| < 2^-9 absolute; then the output is rounded to bf16
    // (2^-9 relative): 2^-9 + 1e-4 absolute, 1/256 relative.
    expect_close(r, to_float(d_out.download(size_t(n_tokens) * kNq * kD)), want, 1.0 / 512 + 1e-4, 1.0 / 256,
                 "attention");

    if (c.fused_rope) {  // the kernel's own store: each token's roped K and V at its position, nothing else
        std::vector<bf16> want_k = k_before, want_v = v_before;
        for (int i = 0; i < n_seqs; ++i) {
            const cuda::AttnSlice& s = slices[i];
            const int p = s.start_pos, b = ring ? s.window_slot : pages[i][p / rows];
            for (int g = 0; g < kNkv; ++g)
                for (int d = 0; d < kD; ++d) {
                    const size_t off = ((size_t(b) * kNkv + g) * rows + p % rows) * kD + d;
                    want_k[off] = qkv[size_t(s.first_token) * kLd + (kNq + g) * kD + d];
                    want_v[off] = qkv[size_t(s.first_token) * kLd + (kNq + kNkv + g) * kD + d];
                }
        }
        const std::vector<bf16> got_k = d_k.download(cache_elems), got_v = d_v.download(cache_elems);
        size_t bad = 0;
        for (size_t i = 0; i < cache_elems; ++i) bad += got_k[i].bits != want_k[i].bits || got_v[i].bits != want_v[i].bits;
        if (bad) r.fail("fused K/V store: ", bad, " cache elements differ from rope()'s rows at the tokens' positions");
        return r;
    }
    // Store this step's K/V and check every cache element (written rows, and that skipped rows kept
    // their data). Paged layers skip the first token of each slice (as if already cached).
    std::vector<cuda::KvStoreSlice> st;
    for (int i = 0; i < n_seqs; ++i)
        st.push_back({slices[i].first_token, slices[i].n_tokens, slices[i].start_pos, /*n_skip=*/1,
                      slices[i].window_slot, pages[i]});
    const std::vector<cuda::KvStoreRow> dst = cuda::plan_kv_store(st, ring, rows);
    auto d_dst = to_device(dst);
    cuda::kv_store({.qkv = d_qkv.get(), .ld_qkv = kLd, .n_q_heads = kNq, .n_kv_heads = kNkv, .head_dim = kD,
                    .k_cache = d_k.get(), .v_cache = d_v.get(), .rows = rows, .dst = d_dst.get(), .n = int(dst.size())},
                   nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<bf16> want_k = k_cache, want_v = v_cache;
    for (int i = 0; i < n_seqs; ++i) {
        const cuda::AttnSlice& s = slices[i];
        const int from = ring ? std::max(0, s.n_tokens - rows) : 1;
        for (int t = from; t < s.n_tokens; ++t) {
            const int p = s.start_pos + t;
            const int b = ring ? s.window_slot : pages[i][p / rows];
            for (int g = 0; g < kNkv; ++g)
                for (int d = 0; d < kD; ++d) {
                    const size_t off = ((size_t(b) * kNkv + g) * rows + p % rows) * kD + d;
                    want_k[off] = qkv[size_t(s.first_token + t) * kLd + (kNq + g) * kD + d];
                    want_v[off] = qkv[size_t(s.first_token + t) * kLd + (kNq + kNkv + g) * kD + d];
                }
        }
    }
    const std::vector<bf16> got_k = d_k.download(cache_elems), got_v = d_v.download(cache_elems);
    size_t bad = 0;
    for (size_t i = 0; i < cache_elems; ++i) bad += got_k[i].bits != want_k[i].bits || got_v[i].bits != want_v[i].bits;
    if (bad) r.fail("kv_store: ", bad, " cache elements differ from the expected cache");
    return r;
}

// gpt-oss decode: `batch` sequences of `ctx` cached tokens, one new token each, pages of 32 in
// position order (a fresh cache), as the bench measured them before the tables.
inline Case decode(int batch, int ctx, int window = 0, int page_size = 32) {
    Case c;
    c.label = str("attn decode B=", batch, " ctx=", ctx, " new=1", window ? " win" : "",
                  page_size != 32 ? str(" ps=", page_size) : std::string());
    c.page_size = page_size;
    c.window = window;
    c.shuffle_pages = false;
    for (int i = 0; i < batch; ++i) c.seqs.push_back({ctx, 1, window ? std::max(0, ctx - window + 1) : 0});
    return c;
}
// A prefill chunk of n_new tokens after ctx cached ones (one sequence). variant: of the wgmma kernel
// (labelled "wgmma vN" when not 0).
inline Case prefill(int ctx, int n_new, int window = 0, bool wgmma = false, int variant = -1) {
    Case c;
    c.label = str("attn ", wgmma ? "wgmma " : "", variant > 0 ? str("v", variant, " ") : std::string(),
                  "prefill B=1 ctx=", ctx, " new=", n_new, window ? " win" : "");
    c.wgmma = wgmma;
    c.wgmma_variant = variant;
    c.page_size = 32;
    c.window = window;
    c.shuffle_pages = false;
    c.seqs.push_back({ctx, n_new, window ? std::max(0, ctx - window + 1) : 0});
    return c;
}

inline std::vector<Case> cases() {
    std::vector<Case> t;
    auto edge = [&](const char* name, Case c) {
        c.name = name;
        c.label = str("attn ", name);
        c.use = Use::check_only;
        t.push_back(std::move(c));
    };
    // Tile edges and ragged batches (pages of 16, shuffled).
    edge("decode_first_token", {.seqs = {{0, 1}}});
    edge("decode_one_tile", {.seqs = {{63, 1}}});
    edge("decode_long_context_split", {.seqs = {{5000, 1}}});
    edge("decode_batch_mixed_lengths", {.seqs = {{0, 1}, {100, 1}, {1000, 1}, {4097, 1}, {31, 1}}});
    // The same split tokens merged by the separate merge kernel (the path without counters).
    edge("decode_long_context_split_merge_kernel", {.merge_kernel = true, .seqs = {{5000, 1}}});
    edge("decode_batch_mixed_lengths_merge_kernel",
         {.merge_kernel = true, .seqs = {{0, 1}, {100, 1}, {1000, 1}, {4097, 1}, {31, 1}}});
    edge("window_decode_merge_kernel", {.window = 128, .merge_kernel = true, .seqs = {{126, 1}, {1000, 1}}});
    edge("prefill_from_empty_less_than_one_item", {.seqs = {{0, 5}}});
    edge("prefill_from_empty_remainder", {.seqs = {{0, 300}}});
    edge("prefill_continues_cached_prefix", {.seqs = {{200, 77}}});
    edge("sharp_softmax", {.q_scale = 8.0f, .seqs = {{300, 1}, {50, 20}}});
    edge("ragged_prefill_and_decode", {.seqs = {{0, 9}, {700, 1}, {37, 64}, {2, 1}, {129, 3}}});
    edge("page_size_32", {.page_size = 32, .seqs = {{95, 1}, {10, 40}}});
    edge("page_size_64", {.page_size = 64, .seqs = {{127, 1}, {64, 1}, {10, 130}}});
    edge("window_decode_boundaries", {.window = 128, .seqs = {{126, 1}, {127, 1}, {128, 1}, {129, 1}, {1000, 1}}});
    edge("window_prefill_longer_than_window", {.window = 128, .seqs = {{0, 300}}});
    edge("window_chunk_over_ring", {.window = 128, .seqs = {{200, 150}, {130, 1}, {5, 7}}});
    edge("window_refilled_by_replay", {.window = 128, .seqs = {{300, 1, 250}, {500, 100, 420}, {64, 1, 64}}});
    {
        Case c;
        for (int i = 0; i < 64; ++i) c.seqs.push_back({37 * i + 1, 1});
        edge("gpt_oss_decode_batch_64", c);
    }

    // RoPE and the K/V store fused into the BF16 decode kernel: tile edges, splits (fused merge and merge
    // kernel), the window ring and its boundaries, a replayed ring, pages of 64, a sharp softmax.
    auto fr = [&](const char* name, Case c) {
        c.fused_rope = true;
        edge(name, std::move(c));
    };
    fr("rope_decode_first_token", {.seqs = {{0, 1}}});
    fr("rope_decode_tile_edges", {.seqs = {{62, 1}, {63, 1}, {64, 1}, {65, 1}, {127, 1}, {128, 1}}});
    fr("rope_decode_batch_mixed_lengths", {.seqs = {{0, 1}, {100, 1}, {1000, 1}, {4097, 1}, {31, 1}}});
    fr("rope_decode_split_merge_kernel", {.merge_kernel = true, .seqs = {{5000, 1}, {70, 1}}});
    fr("rope_window_decode_boundaries", {.window = 128, .seqs = {{126, 1}, {127, 1}, {128, 1}, {129, 1}, {1000, 1}}});
    fr("rope_window_refilled_by_replay", {.window = 128, .seqs = {{300, 1, 250}, {64, 1, 64}}});
    fr("rope_page_size_64", {.page_size = 64, .seqs = {{127, 1}, {64, 1}, {200, 1}}});
    fr("rope_sharp_softmax", {.q_scale = 8.0f, .seqs = {{300, 1}, {50, 1}}});

    // FP8 KV cache (kv_fp8.h): the decode kernel's tile edges, splits (fused and merge kernel), windows
    // and replays, the sharp softmax, ragged mixes, then each prefill kernel's staging path.
    auto f8 = [&](const char* name, Case c) {
        c.fp8 = true;
        edge(name, std::move(c));
    };
    f8("fp8_decode_first_token", {.seqs = {{0, 1}}});
    f8("fp8_decode_tile_edges", {.seqs = {{62, 1}, {63, 1}, {64, 1}, {65, 1}, {127, 1}, {128, 1}}});
    f8("fp8_decode_long_context_split", {.seqs = {{5000, 1}}});
    f8("fp8_decode_long_context_split_merge_kernel", {.merge_kernel = true, .seqs = {{5000, 1}}});
    f8("fp8_decode_batch_mixed_lengths", {.seqs = {{0, 1}, {100, 1}, {1000, 1}, {4097, 1}, {31, 1}}});
    f8("fp8_window_decode_boundaries", {.window = 128, .seqs = {{126, 1}, {127, 1}, {128, 1}, {129, 1}, {1000, 1}}});
    f8("fp8_window_decode_ring_slack", {.window = 131, .seqs = {{130, 1}, {131, 1}, {700, 1}}});
    f8("fp8_window_refilled_by_replay", {.window = 128, .seqs = {{300, 1, 250}, {500, 100, 420}, {64, 1, 64}}});
    f8("fp8_sharp_softmax", {.q_scale = 8.0f, .seqs = {{300, 1}, {50, 20}}});
    f8("fp8_page_size_64", {.page_size = 64, .seqs = {{127, 1}, {64, 1}, {10, 130}}});
    {
        Case c;
        for (int i = 0; i < 64; ++i) c.seqs.push_back({37 * i + 1, 1});
        f8("fp8_gpt_oss_decode_batch_64", c);
    }
    // The decode kernel's BF16-MMA variant ($OSPREY_ATTN_FP8_DECODE=bf16) on the same edges.
    f8("fp8_bf16mma_decode_tile_edges", {.fp8_bf16_mma = true, .seqs = {{62, 1}, {63, 1}, {64, 1}, {65, 1}, {127, 1}}});
    f8("fp8_bf16mma_decode_split", {.fp8_bf16_mma = true, .seqs = {{5000, 1}, {31, 1}}});
    f8("fp8_bf16mma_decode_split_merge_kernel", {.merge_kernel = true, .fp8_bf16_mma = true, .seqs = {{5000, 1}}});
    f8("fp8_bf16mma_window_decode", {.window = 128, .fp8_bf16_mma = true, .seqs = {{127, 1}, {128, 1}, {1000, 1}}});
    f8("fp8_bf16mma_sharp_softmax", {.q_scale = 8.0f, .fp8_bf16_mma = true, .seqs = {{300, 1}, {50, 1}}});
    for (bool wgmma : {false, true}) {
        auto pf = [&](std::string name, Case c) {
            c.wgmma = wgmma;
            c.mma_sync = !wgmma;
            name = str(name, wgmma ? "_wgmma" : "_mma_sync");
            f8(name.c_str(), std::move(c));
        };
        pf("fp8_prefill_from_empty_less_than_one_item", {.seqs = {{0, 5}}});
        pf("fp8_prefill_from_empty_remainder", {.seqs = {{0, 300}}});
        pf("fp8_prefill_continues_cached_prefix", {.seqs = {{200, 77}}});
        pf("fp8_prefill_long_cached_prefix", {.seqs = {{1700, 40}}});
        pf("fp8_ragged_prefill_and_decode", {.seqs = {{0, 9}, {700, 1}, {37, 64}, {2, 1}, {129, 3}}});
        pf("fp8_window_prefill_longer_than_window", {.window = 128, .seqs = {{0, 300}}});
        pf("fp8_window_chunk_over_ring", {.window = 128, .seqs = {{200, 150}, {130, 1}, {5, 7}}});
        pf("fp8_prefill_sharp_softmax", {.q_scale = 8.0f, .seqs = {{50, 20}, {400, 33}}});
    }

    // gpt-oss shapes (pages of 32 in order). The first eleven are bench_attention's lines before the
    // tables (docs/performance.md quotes them).
    for (int ctx : {1024, 8192, 32768, 131071}) t.push_back(decode(1, ctx));
    for (int ctx : {1024, 8192}) t.push_back(decode(64, ctx));
    t.push_back(decode(128, 32768));  // gpt-oss-20b decode at its largest benchmarked batch
    t.push_back(decode(1, 8192, 128));
    t.push_back(decode(64, 8192, 128));
    t.push_back(prefill(0, 1024));
    t.push_back(prefill(0, 8192));
    t.push_back(prefill(0, 8192, 128));
    // Decode batches 8..128 at 8k and 32k, another page size, longer prefill chunks (the engine cuts
    // prompts into chunks of 8192), a ragged step of 63 decodes and one prefill chunk (small enough to check).
    for (int b : {8, 32, 128}) t.push_back(decode(b, 8192));
    for (int b : {8, 32}) t.push_back(decode(b, 32768));
    t.push_back(decode(128, 8192, 128));
    t.push_back(decode(64, 8192, 0, 16));
    t.push_back(prefill(0, 1024, 128));
    t.push_back(prefill(2048, 1024));
    t.push_back(prefill(24576, 8192));
    t.push_back(prefill(0, 32768, 128));
    {
        Case c;
        c.label = "attn mixed B=64 ctx=2048 decode=63 prefill=512";
        c.page_size = 32;
        c.shuffle_pages = false;
        for (int i = 0; i < 63; ++i) c.seqs.push_back({2048, 1});
        c.seqs.push_back({2048, 512});
        t.push_back(c);
    }

    // The wgmma prefill kernel (attention_prefill_wgmma.cu: items of 16 tokens = 128 query rows (24 in
    // variant 4), key tiles of 128 (64 in variant 5), rings of 3 to 12 tiles), under every variant
    // (kAttnWgmmaVariants; variant 0 keeps the names without a suffix): its tile edges, the prefill
    // cases above, and gpt-oss shapes. Variants past 0 check the 1k shapes and leave the larger checked
    // ones (2k + 1k, 8k window) to perf, so that one run of all of them stays short.
    for (int v = 0; v < cuda::kAttnWgmmaVariantCount; ++v) {
        const std::string sfx = v ? str("_v", v) : std::string();
        auto wg = [&](const char* name, Case c) {
            c.wgmma = true;
            c.wgmma_variant = v;
            const std::string full = str(name, sfx);
            edge(full.c_str(), std::move(c));
        };
        wg("wgmma_less_than_one_item", {.seqs = {{0, 5}}});
        wg("wgmma_one_item", {.seqs = {{0, 16}}});
        wg("wgmma_one_item_and_one_token", {.seqs = {{0, 17}}});
        wg("wgmma_three_consumer_item", {.seqs = {{0, 24}, {3, 25}}});  // variant 4's item and one more
        wg("wgmma_one_key_tile", {.seqs = {{112, 16}}});
        wg("wgmma_half_key_tile_plus_one", {.seqs = {{0, 65}}});  // variant 5's tile of 64 and one key
        wg("wgmma_key_tile_plus_one", {.seqs = {{0, 129}}});
        wg("wgmma_ring_wraps", {.seqs = {{0, 700}}});         // 6 key tiles: the 3-stage ring turns twice
        wg("wgmma_deep_ring_wraps", {.seqs = {{1700, 40}}});  // 14 tiles (28 of 64): every ring wraps
        wg("wgmma_continues_cached_prefix", {.seqs = {{200, 77}}});
        wg("wgmma_long_cached_prefix", {.seqs = {{1000, 50}}});
        wg("wgmma_sharp_softmax", {.q_scale = 8.0f, .seqs = {{300, 1}, {50, 20}}});
        wg("wgmma_ragged_prefill_and_decode", {.seqs = {{0, 9}, {700, 1}, {37, 64}, {2, 1}, {129, 3}}});
        wg("wgmma_page_size_32", {.page_size = 32, .seqs = {{95, 1}, {10, 40}}});
        wg("wgmma_page_size_64", {.page_size = 64, .seqs = {{127, 1}, {64, 1}, {10, 130}}});
        wg("wgmma_window_prefill_longer_than_window", {.window = 128, .seqs = {{0, 300}}});
        wg("wgmma_window_chunk_over_ring", {.window = 128, .seqs = {{200, 150}, {130, 1}, {5, 7}}});
        wg("wgmma_window_unaligned_chunk", {.window = 128, .seqs = {{130, 33}, {1000, 17}}});
        wg("wgmma_window_refilled_by_replay", {.window = 128, .seqs = {{300, 1, 250}, {500, 100, 420}, {64, 1, 64}}});
        // Several (item, KV head) units per persistent CTA: 600 units on 132 SMs, of unequal lengths.
        wg("wgmma_many_units_per_cta", {.page_size = 32, .seqs = {{60, 1100}, {0, 33}}});
        for (auto [ctx, n, win] : {std::tuple{0, 1024, 0}, {0, 1024, 128}, {2048, 1024, 0}, {0, 8192, 0},
                                   {0, 8192, 128}, {24576, 8192, 0}, {0, 32768, 0}, {0, 32768, 128}}) {
            Case c = prefill(ctx, n, win, /*wgmma=*/true, v);
            if (v > 0 && (ctx > 0 || n > 1024)) c.use = Use::perf_only;
            t.push_back(std::move(c));
        }
    }

    // FP8 KV next to the BF16 lines above: decode batches 1/64/128 at 8k and 32k (the issue-13 shape is
    // B=128 ctx=8192: 12 full layers of it read 25.8 GB in BF16, 13.7 GB in FP8), a window layer, and
    // both prefill kernels at 8k and after a 24k prefix.
    auto fp8_case = [](Case c) {
        c.fp8 = true;
        c.label = str(c.label, " fp8");
        return c;
    };
    for (int ctx : {8192, 32768})
        for (int b : {1, 64, 128}) t.push_back(fp8_case(decode(b, ctx)));
    for (int ctx : {8192, 32768}) {  // the decode kernel's BF16-MMA variant, for the A/B
        Case c = fp8_case(decode(128, ctx));
        c.fp8_bf16_mma = true;
        c.label = str(c.label, " bf16mma");
        t.push_back(c);
    }
    t.push_back(fp8_case(decode(128, 8192, 128)));
    t.push_back(fp8_case(decode(64, 1024)));  // checked (small enough for the CPU reference)
    for (bool wgmma : {false, true}) {
        Case c = fp8_case(prefill(0, 8192, 0, wgmma));
        c.mma_sync = !wgmma;
        if (!wgmma) c.label = str(c.label, " mma_sync");
        t.push_back(c);
    }
    t.push_back(fp8_case(prefill(24576, 8192, 0, true)));
    t.push_back(fp8_case(prefill(0, 1024, 0, true)));
    // Fused RoPE next to the plain decode lines (the difference is what the fusion adds to attention;
    // bench_rope times the kernel it saves).
    for (auto [b, ctx, win] : {std::tuple{1, 1024, 0}, {1, 8192, 0}, {1, 8192, 128}, {64, 8192, 0}, {128, 8192, 0}}) {
        Case c = decode(b, ctx, win);
        c.fused_rope = true;
        c.label = str(c.label, " rope");
        t.push_back(c);
    }

    for (Case& c : t)
        if (c.use == Use::both && (flops_of(c) > 5e10 || cache_elems_of(c) > double(1 << 28))) c.use = Use::perf_only;
    return t;
}

}  // namespace osprey::cases::attention
