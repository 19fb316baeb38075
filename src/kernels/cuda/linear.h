// Dense linear layers through cuBLASLt: y[T, N] = x[T, K] · W[N, K]ᵀ (+ b[N]) (+ y), BF16 operands,
// FP32 accumulation, bias (and optionally the residual) fused into the epilogue. W is row-major
// [out, in] exactly as stored in the checkpoint, so no weight is ever transposed or copied.
//
// W may instead be FP8 E4M3 with one F32 multiplier per 128-input block of rows (Fp8Weight; the
// block-FP8 checkpoint layout, core/fp8.h, docs/fp8.md): W[n, k] = e4m3(Q[n, k]) · scale[n / R][k / 128].
// Decode sizes (T <= 8) read the codes directly (half the bytes of BF16): the GEMV kernels decode
// E4M3 -> BF16 exactly in registers and multiply each 128-input block's FP32 partial sum by its
// multiplier, as cpu::fp8_matmul does; 9..32 tokens run the GEMV once per 8 tokens. Larger T
// dequantises W to BF16 (one rounding per weight) in row chunks through a bounded scratch and runs
// cuBLASLt on each chunk (linear.cu, "FP8 prefill").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "core/bf16.h"
#include "kernels/cuda/runtime.h"

struct cublasLtContext;

namespace osprey::cuda {

// Which implementation runs: cuBLASLt, or our GEMV kernel for decode-sized batches, where
// cuBLASLt's kernels reach only ~30-37% of HBM bandwidth on gpt-oss's shapes (bench_linear).
//
// The GEMV (linear.cu) runs on the tensor cores (mma.sync, tokens as the zero-padded m side), so
// its cost does not depend on T up to 8: the weight is read once, x is staged once per CTA. Expected
// on the H200 (kernel time, 4.64 TB/s read ceiling; launch overhead comes on top): qkv 5120x2880
// ~7.5-8.5 us, out-proj 2880x4096 (+ residual) ~6-7 us, routers ~2-3 us (latency: one round
// trip for all of the weight), unembedding ~265-280 us, for every T = 1..8. cuBLASLt measured
// 17.5-18.2 us (qkv, out), 12.9 us (router) and ~287-290 us (unembedding) at T = 1..8.
//
// gemv_wide: the earlier one-warp-per-row GEMV (12 16-byte loads in flight per lane, x through L1, no
// shared memory or block barriers). For one token and very wide N (the unembedding) it streams
// closest to the ceiling: bench_linear on the H200, unembedding T=1: 263 us (one warp per row, earlier
// harness) against 289 us cuBLASLt and 297 us tensor-core GEMV (case-table harness, 2026-12-01). Its
// cost grows with T, so automatic uses it only at T = 1 and N >= kGemvWideMinOut.
enum class LinearPath { automatic, blas, gemv, gemv_wide };
inline constexpr int kGemvMaxTokens = 8;   // the GEMV kernels take up to this many tokens
inline constexpr int kGemvWideMinOut = 65536;  // automatic: gemv_wide for T = 1 from this many outputs
inline constexpr int kGemvAutoTokens = 8;  // automatic picks it up to this many: with the weight read once
                                           // whatever T is, it should beat cuBLASLt at every T <= 8

// The GEMV path's RMSNorm prologue (decode): x is not read from memory but computed in every CTA as
// rmsnorm(res + Σ_k moe_w[k]·moe_y[k]) · gain, exactly as rmsnorm() computes it (rmsnorm_row.cuh),
// so the separate norm kernel and its launch leave the step. Unlike rmsnorm(), the residual is not
// written: the caller adds the MoE slots to it later (LinearArgs::acc_moe_y on the out-projection).
// One CTA also writes the normed rows to h for later kernels (the MoE block reads them). Costs every
// CTA the rows' L2 reads (T · d floats, four times that with moe_y), so it pays only for small T:
// gemv_norm_supported() says when it is available, the caller chooses (kGemvNormMaxTokens).
struct GemvNorm {
    const float* res = nullptr;    // [T, d] f32 residual stream (read only); null: no prologue
    const float* moe_y = nullptr;  // [T, 4, d] f32 MoE slot outputs to add first, or null
    const float* moe_w = nullptr;  // [T, 4] f32 their routing weights
    const float* gain = nullptr;   // [d] f32
    bf16* h = nullptr;             // [T, d] bf16: the normed rows, written by one CTA (or null)
    float eps = 1e-5f;
};
inline constexpr int kGemvNormMaxTokens = 2;  // measured: +3.9% at batch 1, -6% at batch 8 (L2 reads)

// An FP8 weight: E4M3 codes and the multipliers of its blocks of block_rows x 128. A checkpoint
// matrix has block_rows = 128 (weight_block_size [128, 128]); a matrix made by stacking parts whose
// row counts or offsets are not multiples of 128 (q, k, v of a small model; a tensor-parallel slice
// of rows) keeps each part's multipliers exactly by repeating them on a finer grid: block_rows is then
// a divisor of 128 that divides every part boundary (model/cuda/device_weights.cpp).
struct Fp8Weight {
    const uint8_t* codes = nullptr;  // [N, K] e4m3 (e4m3fn; NaN codes are not supported), row-major
    const float* scale = nullptr;    // [ceil(N / block_rows), ceil(K / 128)] f32 multipliers (scale_inv)
    int block_rows = 128;            // output rows per multiplier row: 1..128
};

struct LinearArgs {
    void* y = nullptr;            // [T, ldy] bf16 (or f32 when y_f32), row t at y + t * ldy
    const bf16* x = nullptr;      // [T, ldx] bf16
    const bf16* w = nullptr;      // [N, K] bf16, row-major (checkpoint layout); null with an FP8 weight
    Fp8Weight w8{};               // or: the weight in FP8 (w8.codes non-null; w must then be null)
    const void* bias = nullptr;   // [N] bf16 for a bf16 output, f32 for an f32 output (cuBLASLt's rule); or null
    int n_tokens = 0;             // T
    int n_out = 0;                // N
    int n_in = 0;                 // K
    int ldx = 0;                  // row stride of x in elements (0: K)
    int ldy = 0;                  // row stride of y in elements (0: N)
    bool y_f32 = false;           // output f32 instead of bf16
    bool accumulate = false;      // y = x·Wᵀ + b + y (fuses a residual add; f32 outputs only)
    LinearPath path = LinearPath::automatic;
    int gemv_rows = 0;            // GEMV rows per CTA: 8, 16 or 32 (0: chosen from N; bench_linear sweeps it)
    GemvNorm norm{};              // GEMV path only: x = this norm of the residual (x must then be null)
    // GEMV path, accumulate only: y = (y + Σ_k acc_moe_w[t,k]·acc_moe_y[t,k,:]) + x·Wᵀ + b, the MoE
    // residual add of the previous block fused (the sum in rmsnorm's order); N = d of the slots.
    const float* acc_moe_y = nullptr;  // [T, 4, N] f32, or null
    const float* acc_moe_w = nullptr;  // [T, 4] f32
};

// Whether the GEMV path (and so GemvNorm and acc_moe_y) serves T tokens of K inputs (with an FP8
// weight when fp8_weight: K must also be a multiple of 16).
bool gemv_norm_supported(int n_tokens, int n_in, bool fp8_weight = false);

// The decode out-projection and the router in one launch (linear.cu, gemv_router_tail_kernel): `proj`
// as Blas::linear runs it on the GEMV path (BF16 weight, f32 y accumulated into, acc_moe_y optional,
// y dense), and `router` (BF16 weight, f32 logits, the norm prologue of proj's output:
// router.norm.res == proj.y, no x) in the same grid. The router's CTAs issue their first weight loads at
// once and wait on `counter` (one unsigned, zero before the call and left at zero by it) for the
// projection's CTAs instead of for a second launch. Bit-identical to Blas::linear(proj) then
// Blas::linear(router). gemv_router_tail_supported says whether a pair qualifies (both on the GEMV
// path, the router with 8 rows per CTA, every CTA of the grid resident at once).
bool gemv_router_tail_supported(const LinearArgs& proj, const LinearArgs& router);
void gemv_router_tail(const LinearArgs& proj, const LinearArgs& router, unsigned* counter, cudaStream_t stream);

// FP8 weights from 9 up to this many tokens (automatic path): the GEMV once per group of 8 tokens,
// each group re-reading the codes. Below this it moves fewer bytes than the prefill path, which reads
// the codes, writes and reads them again as BF16 (~5x the codes' bytes); at 9..16 tokens it reads
// what one BF16 pass reads. (The mma's rows 8..15, zero today, could take tokens 8..15 at no cost.)
inline constexpr int kFp8GemvGroupMaxTokens = 32;

// Whether an FP8 weight of K inputs can take the GEMV paths (codes read in 16-byte pieces that never
// straddle a row: K a multiple of 16); otherwise every T takes the dequantise + cuBLASLt path.
inline bool fp8_gemv_shape_ok(int n_in) { return n_in > 0 && n_in % 16 == 0; }

// One cuBLASLt handle with its workspace and a cache of matmul plans (descriptors + the chosen
// algorithm) per shape, so that steady-state calls do no heuristic queries and can be captured
// into CUDA graphs.
class Blas {
public:
    // The default bound of the FP8 dequantisation scratch: the 201088 x 2880 unembedding goes through
    // it in 18 chunks of 11650 rows (linear.cu, "FP8 prefill").
    static constexpr size_t kFp8ScratchBytes = size_t(64) << 20;

    explicit Blas(size_t workspace_bytes = size_t(32) << 20);
    ~Blas();
    Blas(const Blas&) = delete;
    Blas& operator=(const Blas&) = delete;

    void linear(const LinearArgs& a, cudaStream_t stream);

    // Allocates the FP8 dequantisation scratch now (FP8 linears with T > 32 need it; allocated on first
    // use otherwise, which a CUDA graph capture cannot do): call before capturing. bytes >= 2 K for
    // the widest K (one BF16 row).
    void reserve_fp8_scratch(size_t bytes = kFp8ScratchBytes);

private:
    struct Plan;
    using Key = std::tuple<int, int, int, int, int, bool, bool, bool>;
    Plan& plan_for(const LinearArgs& a);
    void fp8_dequant_linear(const LinearArgs& a, int ldx, int ldy, cudaStream_t stream);

    cublasLtContext* handle_ = nullptr;
    DeviceBuffer<uint8_t> workspace_;
    DeviceBuffer<bf16> fp8_scratch_;  // [rows, K] bf16 rows of an FP8 weight, dequantised
    std::map<Key, Plan*> plans_;
};

}  // namespace osprey::cuda
