// Runs the decode MoE kernels' device code (extracted from src/kernels/cuda/moe_decode.cu into
// moe_decode_emulated.h by scripts/emulate_moe_decode.sh) on the CPU emulation and compares u and
// the output with the CPU reference (routing, mxfp4_matmul, swiglu), for small shapes with full and
// partial k-steps, batches of 1..8 tokens, tied and concentrated routings, and grids from 2 CTAs
// (long chunk ranges: the weight and partial-sum rings wrap many times) to one CTA per SM. Dynamic
// shared memory starts as NaN bytes, so data read from stages the bulk copies did not fill would show.
// Runs on 7-CTA grids read decode-layout copies of the weights (mxfp4_words.h).
//   usage: emulate_moe_decode [seed]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "emu_moe_check.h"
#include "kernels/cpu/mxfp4_matmul.h"
#include "kernels/cpu/routing.h"
#include "kernels/cpu/swiglu.h"
#include "moe_decode_emulated.h"

namespace osprey::cuda {

// One grid, block after block, a std::thread per CUDA thread (moe_decode_emulation.h).
template <Proj kProj>
void emu_grid(const Params& p, int grid, size_t smem, Mxfp4WordLayout words) {
    for (int b = 0; b < grid; ++b)
        emu_run_mma_cta(b, grid, kThreads, smem, [&] {
            if (words == Mxfp4WordLayout::decode) {
                moe_decode_kernel<kProj, Mxfp4WordLayout::decode>(p);
            } else {
                moe_decode_kernel<kProj, Mxfp4WordLayout::published>(p);
            }
        });
}

void emu_moe_decode(const MoeDecodeArgs& a, int max_ctas, int& grid1, int& grid2) {
    check_args(a);
    const Plan pl = plan(a, max_ctas);
    grid1 = pl.grid1, grid2 = pl.grid2;
    emu_grid<Proj::mlp1>(pl.p1, pl.grid1, pl.smem1, a.words);
    emu_grid<Proj::mlp2>(pl.p2, pl.grid2, pl.smem2, a.words);
    if (a.out)  // moe_combine's sum (a CUDA launch in moe_decode): slot order, one FMA per slot
        for (int t = 0; t < a.n_tokens; ++t)
            for (int c = 0; c < a.d_model; ++c) {
                float sum = 0.0f;
                for (int k = 0; k < kTopK; ++k)
                    sum = std::fma(pl.p1.w[t * kTopK + k], pl.p2.y[size_t(t * kTopK + k) * a.d_model + c], sum);
                a.out[size_t(t) * a.d_model + c] = sum;
            }
}

size_t emu_workspace_bytes(int, int d_model, int d_ff, int) {
    return layout(d_model, d_ff).total;
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
    int n_experts, d_model, d_ff;
};

// The blocks in moe_decode's decode layout (mxfp4_words.h).
std::vector<uint8_t> decode_layout(const std::vector<uint8_t>& blocks) {
    std::vector<uint8_t> out(blocks.size());
    cuda::mxfp4_blocks_to_decode_layout(blocks.data(), out.data(), blocks.size());
    return out;
}

// words = decode: the kernels read decode-layout copies of the blocks (the reference reads the published ones).
void run(const Shape& s, const Weights& w1, const Weights& w2, int n_tokens, int routing, int max_ctas,
         cuda::Mxfp4WordLayout words, std::mt19937& rng) {
    const int E = s.n_experts;
    std::uniform_real_distribution<float> ux(-2.0f, 2.0f), ul(-4.0f, 4.0f);
    std::vector<bf16> h(size_t(n_tokens) * s.d_model);
    std::vector<float> hf(h.size()), logits(size_t(n_tokens) * E);
    for (size_t i = 0; i < h.size(); ++i) h[i] = float_to_bf16(ux(rng)), hf[i] = bf16_to_float(h[i]);
    for (auto& l : logits) l = ul(rng);
    for (int t = 0; t < n_tokens; ++t) {
        float* r = logits.data() + size_t(t) * E;
        if (routing == 1)  // ties
            for (int e = 0; e < E; ++e) r[e] = std::round(r[e] / 3.0f);
        if (routing == 2)  // all tokens on experts 1, 2, E-1, E-3
            for (int e : {1, 2, E - 1, E - 3}) r[e] += 50.0f;
    }
    // Reference.
    const int rows = n_tokens * 4;
    std::vector<int32_t> ids(rows);
    std::vector<float> wt(rows);
    cpu::route_topk_softmax(ids, wt, logits, n_tokens, E, 4);
    std::vector<float> u_ref(size_t(rows) * s.d_ff), out_ref(size_t(n_tokens) * s.d_model, 0.0f);
    for (int r = 0; r < rows; ++r) {
        const std::vector<float> x(hf.begin() + size_t(r / 4) * s.d_model, hf.begin() + size_t(r / 4 + 1) * s.d_model);
        const std::vector<float> a = w1.matmul(ids[r], x, 1);
        std::vector<float> u(s.d_ff);
        cpu::swiglu_clamped(u, a, 1, s.d_ff, 1.702f, 7.0f);
        for (int j = 0; j < s.d_ff; ++j) u_ref[size_t(r) * s.d_ff + j] = u[j], u[j] = round_to_bf16(u[j]);
        const std::vector<float> y = w2.matmul(ids[r], u, 1);
        for (int c = 0; c < s.d_model; ++c) out_ref[size_t(r / 4) * s.d_model + c] += wt[r] * y[c];
    }
    // Emulated kernels.
    const size_t ws_bytes = cuda::emu_workspace_bytes(E, s.d_model, s.d_ff, max_ctas);
    std::vector<uint8_t> ws_mem(ws_bytes + 256, 0);
    uint8_t* ws = ws_mem.data() + (256 - reinterpret_cast<uintptr_t>(ws_mem.data()) % 256) % 256;
    std::memset(ws, 0xFF, sizeof(bf16) * cuda::kMoeDecodeMaxTokens * 4 * s.d_ff);  // u poisoned
    std::vector<float> out(size_t(n_tokens) * s.d_model, NAN);
    const bool dec = words == cuda::Mxfp4WordLayout::decode;
    const std::vector<uint8_t> b1 = dec ? decode_layout(w1.blocks) : w1.blocks;
    const std::vector<uint8_t> b2 = dec ? decode_layout(w2.blocks) : w2.blocks;
    const cuda::MoeDecodeArgs a{.out = out.data(),
                                .router = logits.data(),
                                .h = h.data(),
                                .mlp1 = {b1.data(), w1.scales.data(), w1.bias.data()},
                                .mlp2 = {b2.data(), w2.scales.data(), w2.bias.data()},
                                .workspace = ws,
                                .n_tokens = n_tokens,
                                .n_experts = E,
                                .top_k = 4,
                                .d_model = s.d_model,
                                .d_ff = s.d_ff,
                                .words = words};
    int grid1 = 0, grid2 = 0;
    cuda::emu_moe_decode(a, max_ctas, grid1, grid2);
    char tag[160];
    std::snprintf(tag, sizeof tag, "[%s T=%d routing=%d max_ctas=%d grids=%d/%d words=%s]", s.name, n_tokens, routing,
                  max_ctas, grid1, grid2, dec ? "decode" : "published");
    std::vector<float> u(size_t(rows) * s.d_ff);
    const bf16* ud = reinterpret_cast<const bf16*>(ws);
    for (int r = 0; r < rows; ++r)
        for (int j = 0; j < s.d_ff; ++j)
            u[size_t(r) * s.d_ff + j] = bf16_to_float(ud[size_t(r) * s.d_ff + cuda::moe_u_column(j)]);
    compare("u", tag, u, u_ref, s.d_ff, 1.0 / 64);
    compare("out", tag, out, out_ref, s.d_model, 1.0 / 64);
    std::printf("%s done\n", tag);
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    const unsigned seed = argc > 1 ? unsigned(std::atoi(argv[1])) : 1u;
    std::mt19937 rng(seed);
    // tiny: 1 k-step per unit; odd: 3 groups (lanes c = 3 idle) and 5 groups (2 k-steps, the second
    // with one group); mid: 4 and 3 k-steps with a partial last step, 16 experts.
    const Shape shapes[] = {{"tiny", 8, 128, 128}, {"odd", 6, 96, 160}, {"mid", 16, 512, 288}};
    for (const Shape& s : shapes) {
        const Weights w1(s.n_experts, 2 * s.d_ff, s.d_model, rng, 16), w2(s.n_experts, s.d_model, s.d_ff, rng, 16);
        for (int max_ctas : {2, 7, 132})
            for (int t : {1, 3, 8})
                for (int routing : {0, 1, 2}) {
                    if (s.name[0] == 'm' && routing != 0 && t != 8) continue;  // keep the mid shape short
                    // the decode layout on the 7-CTA grids (every shape, batch and routing)
                    run(s, w1, w2, t, routing, max_ctas,
                        max_ctas == 7 ? cuda::Mxfp4WordLayout::decode : cuda::Mxfp4WordLayout::published, rng);
                }
    }
    std::printf("%d of %d checks failed (seed %u)\n", failures, checks, seed);
    return failures ? 1 : 0;
}
