// Runs the decode attention kernels' device code (extracted from src/kernels/cuda/attention.cu into
// attention_decode_emulated.h by scripts/emulate_attention_decode.sh) on the CPU emulation
// (attention_emulation.h: a std::thread per CUDA thread, mma.sync and ldmatrix from the PTX fragment
// layouts) and compares every output row with the CPU reference (kernels/cpu/attention.h). Both the
// BF16 kernel (a check of the emulation itself) and the FP8 one in both its MMA types (kv_fp8.h:
// swizzled code rows, the permuted K dimensions and V columns, the multipliers on S and P); contexts at and around the 64-key
// tile edges, splits merged by the fused counters and by the merge kernel, empty splits, shuffled
// pages of 16 rows, the 131-row window ring with a replayed prefix, sharp softmaxes. Shared memory
// starts as NaN bytes and the output as NaN, so unloaded stages and unwritten rows show.
//   usage: emulate_attention_decode [seed]
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <thread>

#include "attention_decode_emulated.h"
#include "core/fp8.h"
#include "kernels/cpu/attention.h"

namespace osprey::cuda {

// One launch: grid (gx, gy) of `threads`, one CTA after another.
template <class F>
void emu_launch(int gx, int gy, int threads, size_t smem, F&& body) {
    std::vector<uint8_t> mem(smem + 2048);
    uint8_t* window = mem.data() + (1024 - reinterpret_cast<uintptr_t>(mem.data()) % 1024) % 1024;
    g_smem_window = window;
    g_smem_window_bytes = std::max<size_t>(smem, 16);
    g_dyn_smem = window;
    gridDim.x = unsigned(gx), gridDim.y = unsigned(gy);
    for (int y = 0; y < gy; ++y)
        for (int x = 0; x < gx; ++x) {
            std::memset(window, 0xFF, g_smem_window_bytes);
            const EmuCtaSync sync(threads);
            g_warp_frag.assign(size_t(threads / 32), EmuWarpFrag{});
            g_mma.assign(size_t(threads / 32), {});
            std::vector<std::thread> ts;
            for (int t = 0; t < threads; ++t)
                ts.emplace_back([&, t] {
                    threadIdx.x = unsigned(t);
                    blockIdx.x = unsigned(x), blockIdx.y = unsigned(y);
                    body();
                });
            for (auto& th : ts) th.join();
        }
}

}  // namespace osprey::cuda

using namespace osprey;

namespace {

constexpr int kD = 64, kNkv = 2, kNq = kNkv * 8, kLd = (kNq + 2 * kNkv) * kD;
int failures = 0, checks = 0;

struct Seq {
    int pos;            // the decode token's position (keys [first_key or window start, pos])
    int first_key = 0;  // ring refilled by a replay: nothing older
};
struct Case {
    const char* name;
    int window = 0;      // 0: paged full layer; else a ring of window + 3 rows
    int splits = 1;      // KV splits per token (fixed: some may be empty)
    bool fused_merge = true;
    float q_scale = 1.0f;
    std::vector<Seq> seqs;
};

// fp8 && f16: the FP16-MMA FP8 kernel (the default), fp8 && !f16: its BF16-MMA variant. rope (BF16
// only): qkv unrotated, RoPE fused into the kernel with its K/V store into the cache (AttnArgs::rope_cos).
void run(const Case& c, bool fp8, bool f16, bool rope, std::mt19937& rng) {
    const bool ring = c.window > 0;
    const int page = 16;
    const int rows = ring ? c.window + 3 : page;
    const int n = int(c.seqs.size());  // tokens (one per sequence)
    std::vector<std::vector<int32_t>> pages(n);
    int n_pages = 0;
    for (int i = 0; i < n; ++i)
        for (int p = 0; p < c.seqs[i].pos / page + 1; ++p) pages[i].push_back(n_pages++);
    std::vector<int32_t> perm(std::max(1, n_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (auto& pt : pages)
        for (int32_t& p : pt) p = perm[p];
    const int n_blocks = ring ? n + 1 : std::max(1, n_pages);
    const size_t cache_rows = size_t(n_blocks) * kNkv * rows;  // [block, head, row]

    std::uniform_real_distribution<float> u(-1.f, 1.f), us(-2.f, 2.f), ue(-4.f, 2.f);
    // Values: bf16 caches, or FP8 rows quantised as the runner does (amax / 448 per row and head),
    // with row magnitudes spread over 2^-4 .. 2^2 so that the multipliers matter.
    std::vector<bf16> k_cache(cache_rows * kD), v_cache(cache_rows * kD);
    std::vector<uint8_t> k8(cache_rows * kD), v8(cache_rows * kD);
    std::vector<float> ks(cache_rows), vs(cache_rows);
    auto fill_row = [&](bf16* b, uint8_t* q, float* s) {
        const float mag = std::exp2(ue(rng));
        float x[kD], amax = 0;
        for (int d = 0; d < kD; ++d) x[d] = u(rng) * mag, amax = std::max(amax, std::fabs(x[d]));
        for (int d = 0; d < kD; ++d) b[d] = float_to_bf16(x[d]);
        *s = fp8::block_scale_inv(amax);
        for (int d = 0; d < kD; ++d) q[d] = fp8::quantize(x[d], *s);
    };
    for (size_t r = 0; r < cache_rows; ++r) {
        fill_row(&k_cache[r * kD], &k8[r * kD], &ks[r]);
        fill_row(&v_cache[r * kD], &v8[r * kD], &vs[r]);
    }
    std::vector<bf16> qkv(size_t(n) * kLd);
    std::vector<uint8_t> sk8(size_t(n) * kNkv * kD), sv8(sk8.size());
    std::vector<float> sks(size_t(n) * kNkv), svs(sks.size());
    for (int t = 0; t < n; ++t) {
        for (int i = 0; i < kNq * kD; ++i) qkv[size_t(t) * kLd + i] = float_to_bf16(u(rng) * c.q_scale);
        for (int g = 0; g < kNkv; ++g) {
            const size_t si = size_t(t) * kNkv + g;
            fill_row(&qkv[size_t(t) * kLd + (kNq + g) * kD], &sk8[si * kD], &sks[si]);
            fill_row(&qkv[size_t(t) * kLd + (kNq + kNkv + g) * kD], &sv8[si * kD], &svs[si]);
        }
    }
    std::vector<bf16> sinks(kNq);
    for (auto& s : sinks) s = float_to_bf16(us(rng));
    // Fused RoPE: random cos/sin per (position, pair); the roped qkv as rope() makes it (rope_pair's
    // expression, rounded to BF16), what the reference attends over and what the store must write.
    int n_pos = 1;
    for (const Seq& s : c.seqs) n_pos = std::max(n_pos, s.pos + 1);
    std::vector<float> rcos(size_t(n_pos) * kD / 2), rsin(rcos.size());
    std::uniform_real_distribution<float> angle(-3.2f, 3.2f);
    for (size_t i = 0; i < rcos.size(); ++i) {
        const float t = angle(rng);
        rcos[i] = std::cos(t), rsin[i] = std::sin(t);
    }
    std::vector<bf16> roped = qkv;
    if (rope)
        for (int t = 0; t < n; ++t)
            for (int head = 0; head < kNq + kNkv; ++head)
                for (int d = 0; d < kD / 2; ++d) {
                    bf16* x = &roped[size_t(t) * kLd + head * kD];
                    const float x0 = bf16_to_float(qkv[size_t(t) * kLd + head * kD + d]);
                    const float x1 = bf16_to_float(qkv[size_t(t) * kLd + head * kD + d + kD / 2]);
                    const float cs = rcos[size_t(c.seqs[t].pos) * kD / 2 + d], sn = rsin[size_t(c.seqs[t].pos) * kD / 2 + d];
                    x[d] = float_to_bf16(x0 * cs - x1 * sn);
                    x[d + kD / 2] = float_to_bf16(x1 * cs + x0 * sn);
                }
    const std::vector<bf16> k_before = k_cache, v_before = v_cache;

    // Items as plan_attention cuts decode tokens with fixed splits (whole 64-key tiles each).
    std::vector<cuda::AttnItem> items;
    std::vector<cuda::AttnMerge> merges;
    std::vector<int32_t> page_table;
    int n_partials = 0;
    for (int i = 0; i < n; ++i) {
        const Seq& s = c.seqs[i];
        cuda::AttnItem base{};
        base.slice_first_token = i, base.slice_start_pos = s.pos, base.window_slot = n_blocks - 1 - i;
        base.page_offset = int(page_table.size());
        page_table.insert(page_table.end(), pages[i].begin(), pages[i].end());
        base.q_token = i, base.n_q = 1, base.pos0 = s.pos;
        const int lo = std::max(s.first_key, ring ? s.pos - c.window + 1 : 0), n_keys = s.pos + 1 - lo;
        const int per = ((n_keys + c.splits - 1) / c.splits + 63) / 64 * 64;
        for (int k = 0; k < c.splits; ++k) {
            cuda::AttnItem it = base;
            it.key_begin = std::min(s.pos + 1, lo + k * per);
            it.key_end = std::min(s.pos + 1, lo + (k + 1) * per);
            it.partial = c.splits > 1 ? n_partials + k : -1;
            it.merge = c.splits > 1 ? int(merges.size()) : -1;
            items.push_back(it);
        }
        if (c.splits > 1) merges.push_back({i, n_partials, c.splits}), n_partials += c.splits;
    }
    std::vector<bf16> out(size_t(n) * kNq * kD, bf16{0x7FC0});  // NaN
    std::vector<float> pacc(size_t(std::max(1, n_partials)) * kNkv * 8 * kD);
    std::vector<float2> pml(size_t(std::max(1, n_partials)) * kNkv * 8);
    std::vector<int32_t> counters(std::max<size_t>(1, merges.size() * kNkv), 0);
    cuda::AttnArgs a{.out = out.data(), .ld_out = kNq * kD, .qkv = qkv.data(), .ld_qkv = kLd,
                     .k_cache = fp8 ? nullptr : k_cache.data(), .v_cache = fp8 ? nullptr : v_cache.data(),
                     .rows = rows, .ring = ring, .window = c.window, .page_table = page_table.data(),
                     .sinks = sinks.data(), .n_q_heads = kNq, .n_kv_heads = kNkv, .head_dim = kD,
                     .partial_acc = pacc.data(), .partial_ml = pml.data(),
                     .merge_counters = c.fused_merge ? counters.data() : nullptr};
    if (fp8) {
        a.cache8 = {k8.data(), v8.data(), ks.data(), vs.data()};
        a.step8 = {sk8.data(), sv8.data(), sks.data(), svs.data()};
    }
    if (rope) {
        a.rope_cos = rcos.data(), a.rope_sin = rsin.data();
        a.k_store = k_cache.data(), a.v_store = v_cache.data();
    }
    if (fp8 && f16)
        cuda::emu_launch(int(items.size()), kNkv, cuda::kThreads, cuda::decode_fp8_smem_bytes(),
                         [&] { cuda::attention_decode_fp8_kernel<true>(a, items.data(), merges.data()); });
    else if (fp8)
        cuda::emu_launch(int(items.size()), kNkv, cuda::kThreads, cuda::decode_fp8_smem_bytes(),
                         [&] { cuda::attention_decode_fp8_kernel<false>(a, items.data(), merges.data()); });
    else
        cuda::emu_launch(int(items.size()), kNkv, cuda::kThreads, cuda::decode_smem_bytes(),
                         [&] { cuda::attention_decode_kernel(a, items.data(), merges.data()); });
    if (!merges.empty() && !c.fused_merge)
        cuda::emu_launch(int(merges.size()), kNkv, cuda::kAttnGroup * 32, 0,
                         [&] { cuda::attention_merge_kernel(a, merges.data()); });
    bool counters_clean = std::all_of(counters.begin(), counters.end(), [](int32_t v) { return v == 0; });

    // Reference: the cache as [blocks, rows, n_kv * head_dim] (f32, or FP8 codes with [blocks, rows,
    // n_kv] multipliers), the step's own row as f32 (FP8: its dequantised values).
    const auto& table = fp8::e4m3_table();
    std::vector<float> ck(cache_rows * kD), cv(ck.size()), cks(cache_rows), cvs(cache_rows);
    std::vector<uint8_t> ck8(ck.size()), cv8(ck.size());
    for (int b = 0; b < n_blocks; ++b)
        for (int g = 0; g < kNkv; ++g)
            for (int row = 0; row < rows; ++row) {
                const size_t mine = (size_t(b) * kNkv + g) * rows + row, theirs = size_t(b) * rows + row;
                cks[theirs * kNkv + g] = ks[mine], cvs[theirs * kNkv + g] = vs[mine];
                for (int d = 0; d < kD; ++d) {
                    ck[theirs * kNkv * kD + g * kD + d] = bf16_to_float(k_cache[mine * kD + d]);
                    cv[theirs * kNkv * kD + g * kD + d] = bf16_to_float(v_cache[mine * kD + d]);
                    ck8[theirs * kNkv * kD + g * kD + d] = k8[mine * kD + d];
                    cv8[theirs * kNkv * kD + g * kD + d] = v8[mine * kD + d];
                }
            }
    ++checks;
    std::vector<float> want(out.size());
    for (int i = 0; i < n; ++i) {
        const Seq& s = c.seqs[i];
        std::vector<float> q(size_t(kNq) * kD), o(q.size()), fk(size_t(kNkv) * kD), fv(fk.size());
        for (int j = 0; j < kNq * kD; ++j) q[j] = bf16_to_float(roped[size_t(i) * kLd + j]);
        for (int g = 0; g < kNkv; ++g)
            for (int d = 0; d < kD; ++d) {
                const size_t si = size_t(i) * kNkv + g;
                fk[g * kD + d] = fp8 ? table[sk8[si * kD + d]] * sks[si] : bf16_to_float(roped[size_t(i) * kLd + (kNq + g) * kD + d]);
                fv[g * kD + d] = fp8 ? table[sv8[si * kD + d]] * svs[si]
                                     : bf16_to_float(qkv[size_t(i) * kLd + (kNq + kNkv + g) * kD + d]);
            }
        const int32_t pos = s.pos, slot = n_blocks - 1 - i;
        std::vector<float> sinks_f(kNq);
        for (int h = 0; h < kNq; ++h) sinks_f[h] = bf16_to_float(sinks[h]);
        cpu::AttentionArgs ra;
        ra.out = o;
        ra.q = q;
        ra.positions = std::span<const int32_t>(&pos, 1);
        ra.sinks = sinks_f;
        if (fp8) {
            ra.kv.cache_k8 = ck8.data(), ra.kv.cache_v8 = cv8.data();
            ra.kv.cache_k_scale = cks.data(), ra.kv.cache_v_scale = cvs.data();
        } else {
            ra.kv.cache_k = ck.data(), ra.kv.cache_v = cv.data();
        }
        ra.kv.blocks = ring ? std::span<const int32_t>(&slot, 1) : std::span<const int32_t>(pages[i]);
        ra.kv.block_rows = rows;
        ra.kv.ring = ring;
        ra.kv.n_cached = s.pos;
        ra.kv.first_cached = s.first_key;
        ra.kv.fresh_k = fk.data();
        ra.kv.fresh_v = fv.data();
        ra.kv.fresh_stride = kNkv * kD;
        ra.kv.n_fresh = 1;
        ra.n_heads = kNq;
        ra.n_kv_heads = kNkv;
        ra.head_dim = kD;
        ra.window = c.window;
        ra.scale = 0.125f;
        cpu::attention_sinks(ra);
        std::copy(o.begin(), o.end(), want.begin() + size_t(i) * kNq * kD);
    }
    // The GPU test's bounds (tests/kernels/cases/attention_cases.h): 2^-9 + 1e-4 absolute + 1/256
    // relative; FP8 1/128 relative (the dequantised values code · s are not BF16 values: P · V rounds
    // p · s_v to BF16, 2^-9 relative on a term that alone makes the output of a sharp softmax).
    // Values here reach |v| = 4 (rows scaled by up to 2^2, where the GPU test's are within 1), so the
    // absolute part (2^-9 of Σ p_j |v_j|) is 4 · 2^-9.
    const double rel = fp8 ? 1.0 / 128 : 1.0 / 256;
    double worst = -1;
    size_t worst_i = 0, bad = 0;
    for (size_t i = 0; i < out.size(); ++i) {
        const double got = bf16_to_float(out[i]), w = want[i];
        const double err = std::isfinite(got) ? std::fabs(got - w) / (4.0 / 512 + 1e-4 + std::fabs(w) * rel) : INFINITY;
        if (!(err <= 1)) ++bad;
        if (!(err <= worst)) worst = err, worst_i = i;
    }
    // The fused store: each token's roped K row and its V row at its own position, every other cache
    // element as it was (bit for bit); without it the caches are untouched.
    size_t bad_store = 0;
    {
        std::vector<bf16> want_k = k_before, want_v = v_before;
        if (rope)
            for (int i = 0; i < n; ++i) {
                const int p = c.seqs[i].pos, b = ring ? n_blocks - 1 - i : pages[i][p / rows];
                for (int g = 0; g < kNkv; ++g)
                    for (int d = 0; d < kD; ++d) {
                        const size_t off = ((size_t(b) * kNkv + g) * rows + p % rows) * kD + d;
                        want_k[off] = roped[size_t(i) * kLd + (kNq + g) * kD + d];
                        want_v[off] = qkv[size_t(i) * kLd + (kNq + kNkv + g) * kD + d];
                    }
            }
        for (size_t e = 0; e < want_k.size(); ++e)
            bad_store += want_k[e].bits != k_cache[e].bits || want_v[e].bits != v_cache[e].bits;
    }
    const bool fail = bad || !counters_clean || bad_store;
    std::printf("%s %s %s (%zu items x %d heads): worst token %zu head %zu dim %zu got %g want %g (%.3g x bound)%s",
                fail ? "FAIL" : "ok  ", fp8 ? (f16 ? "fp8/f16 " : "fp8/bf16") : rope ? "bf16+rope" : "bf16    ", c.name, items.size(), kNkv, worst_i / (kNq * kD),
                (worst_i % (kNq * kD)) / kD, worst_i % kD, double(bf16_to_float(out[worst_i])), want[worst_i], worst,
                counters_clean ? "" : ", merge counters left non-zero");
    if (bad) std::printf(", %zu of %zu bad", bad, out.size());
    if (bad_store) std::printf(", %zu cache elements wrong", bad_store);
    failures += fail;
    std::printf("\n");
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    const unsigned seed = argc > 1 ? unsigned(std::atoi(argv[1])) : 1u;
    std::mt19937 rng(seed);
    const std::vector<Case> cases = {
        {.name = "first_token", .seqs = {{0}}},
        {.name = "tile_edges", .seqs = {{62}, {63}, {64}, {65}, {127}, {128}}},
        {.name = "long_one_split", .seqs = {{300}}},
        {.name = "splits_fused_merge", .splits = 4, .seqs = {{700}, {9}, {191}}},  // some splits empty
        {.name = "splits_merge_kernel", .splits = 3, .fused_merge = false, .seqs = {{450}, {64}}},
        {.name = "sharp_softmax", .q_scale = 8.0f, .seqs = {{257}, {30}}},
        {.name = "window_ring", .window = 128, .seqs = {{127}, {128}, {400}, {5}}},
        {.name = "window_replay_split", .window = 128, .splits = 2, .seqs = {{600, 550}, {300}}},
    };
    // BF16 cache; FP8 with FP16 MMAs; FP8 with BF16 MMAs; BF16 with RoPE and the K/V store fused
    for (int mode = 0; mode < 4; ++mode)
        for (const Case& c : cases) run(c, mode == 1 || mode == 2, mode == 1, mode == 3, rng);
    std::printf("%d of %d checks failed (seed %u)\n", failures, checks, seed);
    return failures ? 1 : 0;
}
