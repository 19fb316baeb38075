// The whole MoE block of a decode step (spec §3.6 steps 3-5) for n_tokens <= kMoeDecodeMaxTokens, in
// two launches, bound by streaming the active experts' MXFP4 weights from HBM once:
//
//   moe_decode_mlp1:  route (every CTA, from the [T, E] logits) ; u = clamped SwiGLU(h · W1_eᵀ + b1_e)
//   moe_decode_mlp2:  route again ; y = u · W2_eᵀ + b2_e ; moe[t] = Σ_slot w · y   (fixed slot order)
//
// Same contract as MoeStep::run (model/cuda/moe_step.h) and the same numerics as moe_mlp_mxfp4.h:
// weights decoded exactly for scale bytes 34..160, BF16 activations, FP32 accumulation, u rounded
// to BF16, biases included. Results are bit-identical from run to run (no float atomics: split
// sums are added in a fixed order by whichever warp finishes last, see moe_decode.cu).
// Test: tests/kernels/test_moe_decode.cu; benchmark: bench/bench_moe_decode.cu.
//
// Design (the reasoning behind the tiling; details in moe_decode.cu):
// - Work = chunks of (active expert, 16 weight rows, all inputs): 16 consecutive rows of one expert
//   are one contiguous run of MXFP4 blocks, one of scales and one of biases, so a producer warp
//   streams each chunk with three cp.async.bulk copies into a 4-stage shared-memory ring (~96 KB
//   in flight per CTA, no registers spent on it). Every CTA (two per SM: a second CTA's warps and ring
//   hide the first's mbarrier waits; measured on the H200, 20b 8 tokens 111.6 against 145.7 us with one
//   per SM, 1 token 34.2 against 35.6) takes an equal contiguous
//   range of chunks, so all 132 SMs stream for any T, including T = 1 where only 4 experts are
//   active. 8 consumer warps split each chunk's K and meet in a partial-sum ring; the chunk's
//   finisher (rotating) sums in warp order: deterministic.
// - A lane (g, c) takes, per k-step, the whole 16-byte MXFP4 group 4s + c of weight rows g and
//   g + 8 and feeds it as the A operand of mma.sync m16n8k16 (M = 16 weight rows, N = 8 tokens).
//   The k order inside an mma is free, so each lane's k-values are its own group's elements; the
//   activations are loaded once per consumer into registers in the same permuted order.
// - Tensor cores vs FP32 FMA, by instructions per weight byte (H200: ~0.22 warp-instructions per
//   byte at 4.64 TB/s; the integer pipe runs at half that): decoding 8 nibbles to 4 BF16x2 costs
//   ~13 integer ops + 4 BF16 multiplies by the group's scale (~2.1 per weight) on either path.
//   FP32 FMA then adds 1 FMA per weight per token plus 1 unpack per weight (T = 1: ~4 per weight,
//   ~0.26 warp-instr/byte: issue-bound; T = 8: far worse), while one mma consumes 256 weights for
//   all 8 tokens at once (~0.004 per weight). Total with mma: ~150-170 warp-instructions per KB,
//   ~0.16 per byte, independent of T <= 8, i.e. ~70% of the issue rate at full bandwidth (the
//   mma gemv tiling of moe_mlp_mxfp4 is at ~0.31). Measured (docs/performance.md, ninth session):
//   0.229 warp-instructions per byte issued (the decode ~53% of them), at ~0.5 per cycle per
//   scheduler with under one eligible warp: 34.6% of 4.64 TB/s at T = 1, 57% at T = 8 (20b).
// - FP4 decode: nibble (s, e1, e0, m) -> BF16 bits 15, 8, 7, 6 is FP4 · 2^-126 exactly (0.5 is a
//   BF16 subnormal), built for two nibbles 16 bits apart with one mask, one multiply by
//   (2^12 + 2^6) or (2^8 + 2^2) and one mask; one mul.bf16x2 by 2^(scale - 33) makes it normal
//   and exact; the accumulators are multiplied by 2^32 at the end.
//
// Workspace: moe_decode_workspace_bytes(n_experts, d_model, d_ff) bytes of device memory, 256-byte
// aligned (no state is kept between calls). Its first kMoeDecodeMaxTokens * 4 * d_ff bf16 are u (routed row t * 4 + slot,
// columns in moe_u_column order), which tests may read. One workspace per stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/bf16.h"
#include "kernels/cuda/moe_mlp_mxfp4.h"
#include "kernels/cuda/mxfp4_words.h"

namespace osprey::cuda {

// Largest batch the decode path takes (one mma n-tile of 8 tokens). Larger batches use MoeStep.
inline constexpr int kMoeDecodeMaxTokens = 8;

struct MoeDecodeArgs {
    float* out = nullptr;           // [n_tokens, d_model] f32: Σ_slot w · (W2_e · u + b2_e), overwritten by a
                                    // third launch (moe_combine); null: the caller sums moe_decode_outputs()
    const float* router = nullptr;  // [n_tokens, n_experts] f32 logits, router bias included
    const bf16* h = nullptr;        // [n_tokens, d_model] normed hidden state, 16-byte aligned
    Mxfp4Experts mlp1;              // n_out = 2 * d_ff (gate, up interleaved), n_in = d_model
    Mxfp4Experts mlp2;              // n_out = d_model, n_in = d_ff
    void* workspace = nullptr;      // moe_decode_workspace_bytes(...) bytes, zeroed once (see above)
    int n_tokens = 0;               // 0..kMoeDecodeMaxTokens (0: no-op)
    int n_experts = 0;              // 4..kMoeMaxExperts (gpt-oss: 32 or 128)
    int top_k = 4;                  // specialised: only 4
    int d_model = 0;                // positive multiple of 32
    int d_ff = 0;                   // positive multiple of 32
    float swiglu_alpha = 1.702f;
    float swiglu_limit = 7.0f;
    // Bit layout of mlp1's and mlp2's block words (mxfp4_words.h): the published one, or the decode
    // layout (a copy made by mxfp4_to_decode_layout; 9 integer operations per word instead of 13).
    Mxfp4WordLayout words = Mxfp4WordLayout::published;
    bool pdl = true;  // launch mlp2 with programmatic dependent launch (overlaps its
                      // routing and first weight loads with mlp1's tail)
};

size_t moe_decode_workspace_bytes(int n_experts, int d_model, int d_ff);

// Where a call leaves its per-slot results in the workspace: y [n_tokens * 4, d_model] f32 (routed
// row t * 4 + slot, bias included) and w [n_tokens * 4] f32 (the softmax weight of each routed row):
// the MoE output is Σ_slot w · y in slot order (what moe_combine and rmsnorm's moe_y/moe_w compute).
struct MoeDecodeOutputs {
    const float* y;
    const float* w;
};
MoeDecodeOutputs moe_decode_outputs(void* workspace, int d_model, int d_ff);

// Two kernel launches on `stream`; graph-capturable (no host synchronisation, no allocation).
void moe_decode(const MoeDecodeArgs& a, cudaStream_t stream);

// dst[i] = mxfp4_word_to_decode_layout(src[i]) for the bytes / 4 words of MXFP4 blocks (bytes a multiple
// of 16, both pointers 16-byte aligned, dst may equal src): the decode-layout copy moe_decode reads
// with MoeDecodeArgs::words = decode. One kernel on `stream`.
void mxfp4_to_decode_layout(const uint8_t* src, uint8_t* dst, size_t bytes, cudaStream_t stream);

}  // namespace osprey::cuda
