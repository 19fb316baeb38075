// Runs the wgmma prefill attention kernel's device code (extracted from
// src/kernels/cuda/attention_prefill_wgmma.cu into attention_wgmma_emulated.h by
// scripts/emulate_attention_wgmma.sh) on the CPU emulation (wgmma_emulation.h) and compares every
// output row with the CPU reference (kernels/cpu/attention.h), on small ragged batches: items shorter
// than 16 tokens, several items, key tiles of 128 crossing the cached/fresh boundary, enough tiles
// for the 3-stage ring to turn, shuffled pages of 16 and 64 rows, the 128-row window ring with and
// without a replayed prefix, sharp softmaxes. Two KV heads (16 query heads) to keep it quick; shared
// memory starts as NaN bytes and the output as NaN, so unloaded stages and unwritten rows show. Every
// case runs twice: BF16 K/V, then the FP8 KV cache (kv_fp8.h) whose tiles the producer dequantises.
//   usage: emulate_attention_wgmma [seed]
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <utility>

#include "attention_wgmma_emulated.h"
#include "core/fp8.h"
#include "kernels/cpu/attention.h"

namespace osprey::cuda {

// The grid of variant V, one CTA after another, a std::thread per CUDA thread. skew: where the dynamic
// shared memory starts past a 1024-byte boundary (the kernel aligns its tiles itself). sms: the SM
// count the persistent variants size their grid by (small, so that a CTA loops over several units).
template <int V>
void emu_attention_prefill_wgmma(const AttnArgs& a, const std::vector<AttnItem>& items, int skew, int sms) {
    using C = Cfg<V>;
    std::vector<uint8_t> mem(size_t(C::kSmemBytes) + skew + 2048);
    uint8_t* window = mem.data() + (1024 - reinterpret_cast<uintptr_t>(mem.data()) % 1024) % 1024;
    g_smem_window = window;
    g_smem_window_bytes = size_t(C::kSmemBytes) + skew;
    g_dyn_smem = window + skew;
    const int n_items = int(items.size());
    gridDim.x = unsigned(attention_wgmma_grid<V>(n_items * a.n_kv_heads, sms));
    for (unsigned x = 0; x < gridDim.x; ++x) {
        std::memset(window, 0xFF, g_smem_window_bytes);
        sm90::g_mbars.clear();
        sm90::emu_named_reset();
        const EmuCtaSync sync(C::kThreads);
        sm90::g_wg_bar.clear();
        for (int w = 0; w < C::kThreads / 128; ++w) sm90::g_wg_bar.push_back(std::make_unique<std::barrier<>>(128));
        sm90::g_wg_slots.assign(C::kThreads / 128, {});
        std::vector<std::thread> threads;
        for (int t = 0; t < C::kThreads; ++t)
            threads.emplace_back([&, t] {
                threadIdx.x = unsigned(t);
                blockIdx.x = x;
                attention_prefill_wgmma_kernel<V>(a, items.data(), n_items);
            });
        for (auto& th : threads) th.join();
        // Every named barrier must end balanced (no arrival left waiting for a partner).
        for (const auto& b : sm90::g_named)
            if (b.arrived != 0) emu_fail("a named barrier ended with pending arrivals");
    }
}

}  // namespace osprey::cuda

using namespace osprey;

namespace {

constexpr int kD = 64, kNkv = 2, kNq = kNkv * 8, kLd = (kNq + 2 * kNkv) * kD;
int failures = 0, checks = 0;

struct Seq {
    int start_pos, n_tokens, first_key = 0;
};
struct Case {
    const char* name;
    int page_size = 16;
    int window = 0;
    float q_scale = 1.0f;
    std::vector<Seq> seqs;
};

// Prefill items as plan_attention cuts them for AttnPrefillKernel::wgmma (tests/kernels/
// test_attention_plan.cpp checks the real plan).
std::vector<cuda::AttnItem> prefill_items(const std::vector<Seq>& seqs, const std::vector<int>& first_token,
                                          const std::vector<int>& slots, const std::vector<int>& page_offsets,
                                          int window, int item_tokens) {
    std::vector<cuda::AttnItem> items;
    for (size_t i = 0; i < seqs.size(); ++i) {
        const Seq& s = seqs[i];
        for (int t = 0; t < s.n_tokens; t += item_tokens) {
            cuda::AttnItem it{};
            it.slice_first_token = first_token[i];
            it.slice_start_pos = s.start_pos;
            it.window_slot = slots[i];
            it.page_offset = page_offsets[i];
            it.q_token = first_token[i] + t;
            it.n_q = std::min(item_tokens, s.n_tokens - t);
            it.pos0 = s.start_pos + t;
            it.key_begin = std::max(s.first_key, window ? it.pos0 - window + 1 : 0);
            it.key_end = it.pos0 + it.n_q;
            items.push_back(it);
        }
    }
    return items;
}

// fp8: the cache and the step's own rows as FP8 KV (kv_fp8.h), quantised from the same values per
// (row, head); the producer dequantises them to BF16(code · s), which is what the reference gets.
template <int V>
void run(const Case& c, std::mt19937& rng, int skew, bool fp8) {
    const bool ring = c.window > 0;
    const int rows = ring ? c.window : c.page_size;
    const int n_seqs = int(c.seqs.size());
    int n_tokens = 0;
    std::vector<int> first_token;
    for (const Seq& s : c.seqs) first_token.push_back(n_tokens), n_tokens += s.n_tokens;
    std::vector<std::vector<int32_t>> pages(n_seqs);
    int n_pages = 0;
    for (int i = 0; i < n_seqs; ++i)
        for (int p = 0; p < (c.seqs[i].start_pos + c.seqs[i].n_tokens + rows - 1) / rows; ++p) pages[i].push_back(n_pages++);
    std::vector<int32_t> perm(std::max(1, n_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (auto& pt : pages)
        for (int32_t& p : pt) p = perm[p];
    const int n_blocks = ring ? n_seqs + 1 : std::max(1, n_pages);
    const size_t cache_elems = size_t(n_blocks) * kNkv * rows * kD;

    std::uniform_real_distribution<float> u(-1.f, 1.f), us(-2.f, 2.f);
    auto rnd = [&](size_t n, float scale) {
        std::vector<bf16> v(n);
        for (auto& x : v) x = float_to_bf16(u(rng) * scale);
        return v;
    };
    const std::vector<bf16> k_cache = rnd(cache_elems, 1), v_cache = rnd(cache_elems, 1);
    std::vector<bf16> qkv = rnd(size_t(n_tokens) * kLd, 1);
    for (int t = 0; t < n_tokens; ++t)
        for (int i = 0; i < kNq * kD; ++i) {
            bf16& q = qkv[size_t(t) * kLd + i];
            q = float_to_bf16(bf16_to_float(q) * c.q_scale);
        }
    std::vector<bf16> sinks(kNq);
    for (auto& s : sinks) s = float_to_bf16(us(rng));

    std::vector<int> slots, page_offsets;
    std::vector<int32_t> page_table;
    for (int i = 0; i < n_seqs; ++i) {
        slots.push_back(n_blocks - 1 - i);
        page_offsets.push_back(int(page_table.size()));
        page_table.insert(page_table.end(), pages[i].begin(), pages[i].end());
    }
    const std::vector<cuda::AttnItem> items =
        prefill_items(c.seqs, first_token, slots, page_offsets, c.window, cuda::wgmma_prefill_tokens(V));
    // FP8 KV: codes and multipliers per (block, head, row) of the cache and per (token, head) of the step.
    const size_t cache_rows = cache_elems / kD;
    std::vector<uint8_t> k8(cache_elems), v8(cache_elems), sk8(size_t(n_tokens) * kNkv * kD), sv8(sk8.size());
    std::vector<float> ks(cache_rows), vs(cache_rows), sks(size_t(n_tokens) * kNkv), svs(sks.size());
    auto quantise = [](const bf16* x, uint8_t* q, float* s) {
        float amax = 0;
        for (int d = 0; d < kD; ++d) amax = std::max(amax, std::fabs(bf16_to_float(x[d])));
        *s = fp8::block_scale_inv(amax);
        for (int d = 0; d < kD; ++d) q[d] = fp8::quantize(bf16_to_float(x[d]), *s);
    };
    auto staged = [](uint8_t code, float s) { return bf16_to_float(float_to_bf16(fp8::e4m3_to_float(code) * s)); };
    for (size_t r = 0; r < cache_rows; ++r) {
        quantise(&k_cache[r * kD], &k8[r * kD], &ks[r]);
        quantise(&v_cache[r * kD], &v8[r * kD], &vs[r]);
    }
    for (int t = 0; t < n_tokens; ++t)
        for (int g = 0; g < kNkv; ++g) {
            const size_t si = size_t(t) * kNkv + g;
            quantise(&qkv[size_t(t) * kLd + (kNq + g) * kD], &sk8[si * kD], &sks[si]);
            quantise(&qkv[size_t(t) * kLd + (kNq + kNkv + g) * kD], &sv8[si * kD], &svs[si]);
        }
    std::vector<bf16> out(size_t(n_tokens) * kNq * kD, bf16{0x7FC0});  // NaN
    cuda::AttnArgs a{.out = out.data(), .ld_out = kNq * kD, .qkv = qkv.data(), .ld_qkv = kLd,
                           .k_cache = k_cache.data(), .v_cache = v_cache.data(), .rows = rows, .ring = ring,
                           .window = c.window, .page_table = page_table.data(), .sinks = sinks.data(),
                           .n_q_heads = kNq, .n_kv_heads = kNkv, .head_dim = kD};
    if (fp8) {
        a.k_cache = a.v_cache = nullptr;
        a.cache8 = {k8.data(), v8.data(), ks.data(), vs.data()};
        a.step8 = {sk8.data(), sv8.data(), sks.data(), svs.data()};
    }
    cuda::emu_attention_prefill_wgmma<V>(a, items, skew, /*sms=*/3);

    // Reference: the cache as [blocks, rows, n_kv * head_dim] f32, one call per sequence.
    std::vector<float> ck(cache_elems), cv(cache_elems), qkv_f(qkv.size()), sinks_f(kNq);
    for (size_t i = 0; i < qkv.size(); ++i) qkv_f[i] = bf16_to_float(qkv[i]);
    for (int h = 0; h < kNq; ++h) sinks_f[h] = bf16_to_float(sinks[h]);
    for (int b = 0; b < n_blocks; ++b)
        for (int g = 0; g < kNkv; ++g)
            for (int row = 0; row < rows; ++row)
                for (int d = 0; d < kD; ++d) {
                    const size_t mine = ((size_t(b) * kNkv + g) * rows + row) * kD + d;
                    const size_t theirs = (size_t(b) * rows + row) * kNkv * kD + g * kD + d;
                    ck[theirs] = bf16_to_float(k_cache[mine]), cv[theirs] = bf16_to_float(v_cache[mine]);
                    if (fp8) {
                        const size_t r = mine / kD;
                        ck[theirs] = staged(k8[mine], ks[r]), cv[theirs] = staged(v8[mine], vs[r]);
                    }
                }
    if (fp8)  // the step's own K/V rows as staged (qkv_f's q columns stay)
        for (int t = 0; t < n_tokens; ++t)
            for (int g = 0; g < kNkv; ++g)
                for (int d = 0; d < kD; ++d) {
                    const size_t si = size_t(t) * kNkv + g;
                    qkv_f[size_t(t) * kLd + (kNq + g) * kD + d] = staged(sk8[si * kD + d], sks[si]);
                    qkv_f[size_t(t) * kLd + (kNq + kNkv + g) * kD + d] = staged(sv8[si * kD + d], svs[si]);
                }
    ++checks;
    double worst = -1;
    size_t worst_i = 0, bad = 0;
    std::vector<float> want_all(out.size());
    for (int i = 0; i < n_seqs; ++i) {
        const Seq& s = c.seqs[i];
        std::vector<float> q(size_t(s.n_tokens) * kNq * kD), o(q.size());
        std::vector<int32_t> pos(s.n_tokens);
        for (int t = 0; t < s.n_tokens; ++t) {
            pos[t] = s.start_pos + t;
            for (int j = 0; j < kNq * kD; ++j) q[size_t(t) * kNq * kD + j] = qkv_f[size_t(first_token[i] + t) * kLd + j];
        }
        const int32_t slot = slots[i];
        cpu::AttentionArgs ra;
        ra.out = o;
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
        ra.kv.fresh_k = qkv_f.data() + size_t(first_token[i]) * kLd + kNq * kD;
        ra.kv.fresh_v = qkv_f.data() + size_t(first_token[i]) * kLd + (kNq + kNkv) * kD;
        ra.kv.fresh_stride = kLd;
        ra.kv.n_fresh = s.n_tokens;
        ra.n_heads = kNq;
        ra.n_kv_heads = kNkv;
        ra.head_dim = kD;
        ra.window = c.window;
        ra.scale = 0.125f;
        cpu::attention_sinks(ra);
        std::copy(o.begin(), o.end(), want_all.begin() + size_t(first_token[i]) * kNq * kD);
    }
    // The GPU test's bound (tests/kernels/cases/attention_cases.h): 2^-9 + 1e-4 absolute + 1/256 relative.
    for (size_t i = 0; i < out.size(); ++i) {
        const double got = bf16_to_float(out[i]), want = want_all[i];
        const double err = std::isfinite(got) ? std::fabs(got - want) / (1.0 / 512 + 1e-4 + std::fabs(want) / 256) : INFINITY;
        if (!(err <= 1)) ++bad;
        if (!(err <= worst)) worst = err, worst_i = i;
    }
    const size_t row = worst_i / (kNq * kD), col = worst_i % (kNq * kD);
    std::printf(
        "%s v%d %s%s (%zu items x %d heads, skew %d): worst token %zu head %zu dim %zu got %g want %g (%.3g x bound)",
        bad ? "FAIL" : "ok  ", V, fp8 ? "fp8 " : "", c.name, items.size(), kNkv, skew, row, col / kD, col % kD,
        double(bf16_to_float(out[worst_i])), double(want_all[worst_i]), worst);
    if (bad) std::printf(", %zu of %zu bad", bad, out.size()), ++failures;
    std::printf("\n");
    std::fflush(stdout);
}

template <int V>
void run_variant(const std::vector<Case>& cases, std::mt19937& rng) {
    int skew = 0;
    for (bool fp8 : {false, true})
        for (const Case& c : cases) {
            run<V>(c, rng, skew, fp8);
            skew = (skew + 48) % 1024;
        }
}

// Runs variant v (a runtime number) of the ones in kV.
template <int... kV>
bool run_variant_numbered(int v, const std::vector<Case>& cases, std::mt19937& rng, std::integer_sequence<int, kV...>) {
    return ((v == kV ? (run_variant<kV>(cases, rng), true) : false) || ...);
}

}  // namespace

//   usage: emulate_attention_wgmma [seed [variant...]]   (no variants: all of them)
int main(int argc, char** argv) {
    const unsigned seed = argc > 1 ? unsigned(std::atoi(argv[1])) : 1u;
    std::vector<int> variants;
    for (int i = 2; i < argc; ++i) variants.push_back(std::atoi(argv[i]));
    if (variants.empty())
        for (int v = 0; v < cuda::kAttnWgmmaVariantCount; ++v) variants.push_back(v);
    std::mt19937 rng(seed);
    const std::vector<Case> cases = {
        {.name = "less_than_one_item", .seqs = {{0, 5}}},
        {.name = "items_and_a_remainder", .seqs = {{0, 40}}},
        {.name = "cached_prefix_tile_edge", .seqs = {{100, 37}}},
        {.name = "ragged_batch", .seqs = {{0, 9}, {37, 64}, {129, 3}}},
        {.name = "ring_turns", .seqs = {{400, 20}}},  // 4 key tiles of 128 (7 of 64): the ring wraps
        {.name = "page_size_64_sharp", .page_size = 64, .q_scale = 8.0f, .seqs = {{10, 130}}},
        {.name = "window_longer_than_ring", .window = 128, .seqs = {{0, 200}}},
        {.name = "window_chunk_and_replay", .window = 128, .seqs = {{200, 40}, {500, 20, 420}, {5, 7}}},
        {.name = "long_prefix_many_units", .seqs = {{1500, 70}, {0, 3}}},  // 12+ tiles per unit: deep rings wrap
    };
    for (int v : variants) {
        if (!run_variant_numbered(v, cases, rng, std::make_integer_sequence<int, cuda::kAttnWgmmaVariantCount>{})) {
            std::printf("no variant %d\n", v);
            return 2;
        }
    }
    std::printf("%d of %d checks failed (seed %u, variants", failures, checks, seed);
    for (int v : variants) std::printf(" %d", v);
    std::printf(")\n");
    return failures ? 1 : 0;
}
