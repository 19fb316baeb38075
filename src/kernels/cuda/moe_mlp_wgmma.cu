// MXFP4 expert GEMMs on Hopper warpgroup MMA (wgmma, sm_90a), W4A16: FP4 weights decoded in
// registers, BF16 activations, FP32 accumulation. MoeKernel::wgmma of moe_mlp1 / moe_mlp2.
//
// Roles. A persistent CTA per SM of 3 warpgroups: warpgroup 0 is the producer (all 128 threads issue
// cp.async; few registers after setmaxnreg), warpgroups 1..kConsumerWGs are consumers (setmaxnreg
// gives them the registers). A tile is (expert e, n-tile of kBN = 128 routed rows of e, m-tile of
// kBM = 256 weight rows); tiles are numbered expert-major, then n-tile, then m-tile (so the CTAs in
// flight share one expert's weights and a few token tiles in L2), and CTA b takes tiles b, b + grid,
// b + 2 grid, ... (tile_start[] below: a prefix sum over the experts, computed by every CTA).
//
// Operands. Weights are the M side: consumer warpgroup w owns weight rows [128 w, 128 w + 128) of the
// tile as kMBlocks = 2 wgmma m64 blocks; each warp decodes its 16 rows of each block from the FP4 bytes
// in shared memory straight into the A fragment (the register-A "RS" form of wgmma.mma_async). The
// routed rows are N: the B operand (K-major, 128 rows x 64 k of BF16 per stage = 128 bytes per row)
// sits in shared memory with the 128-byte swizzle and is read through a matrix descriptor.
//
// Pipeline. kStages stages of (B tile 16 KB, FP4 tile 8 KB) with full/empty mbarriers. The producer
// gathers the B rows with 16-byte cp.async (mlp1's rows are tokens sorted_rows[i] / top_k, scattered
// through x: the sm_90 TMA cannot gather rows; mlp2's are consecutive rows of u) writing each 16-byte
// chunk c of row n at chunk c ^ (n % 8) (the 128B swizzle), then cp.async.mbarrier.arrive.noinc on the
// stage's full barrier. A tile's E8M0 scales (kBM rows x n_in / 32 bytes, contiguous) come in one
// cp.async.bulk into one of two per-tile buffers.
//
// Consumers, per tile: the bias (times 2^-32, see Numerics) is loaded into the accumulators before the
// first MMA: no bias epilogue. Per stage and MXFP4 group h (two k16 steps): decode the A fragments of
// the group into the register buffer h, wgmma.fence, 2 x kMBlocks wgmma m64n128k16, commit, and
// wait_group 1: the group before is complete, so its A buffer may be rewritten next and, at h = 0, the
// previous stage is released to the producer. Epilogues as the mma.sync kernel's: mlp1 applies the
// clamped SwiGLU to the gate/up row pairs and stores u (BF16, columns moe_u_column); mlp2 stores y per
// routed row (f32, row sorted_rows[i]).
//
// Fragment layouts (PTX ISA, "Register Fragments" of wgmma .m64nNk16; CuTe ALayout_64x16 /
// CLayout_64xN): thread t of a warpgroup, warp w = t / 32, g = lane / 4, q = lane % 4;
//   A (16-bit, 4 registers): a[0] row 16w + g, k 2q, 2q+1 (low half = lower k); a[1] row +8; a[2] row
//     16w + g, k 2q+8, 2q+9; a[3] row +8, k 2q+8, 2q+9.
//   D (f32): d[4i + j]: row 16w + g + 8 (j / 2), column 8i + 2q + j % 2.
// The B layout fixes the order of k: within a k16 step, the 16 BF16 of a row at logical k 0..15. The
// A fragment must hold the same k, so a thread needs k 2q, 2q+1 of each 8-element chunk of the group:
//   mlp1 (x in natural order): elements 8c + 2q, 8c + 2q + 1 = byte q of 32-bit word c of the group's
//     16 FP4 bytes (low nibble = even element);
//   mlp2 (u stored in moe_u_column order: chunk c holds units 8c + [0 4 1 5 2 6 3 7]): units 8c + q and
//     8c + q + 4 = nibbles q and q + 4 of word c.
// Either way the two nibbles are placed at bits [3:0] and [19:16] and turned into a BF16x2 by one
// multiply and mask (fp4_pair), as in the mma.sync kernel.
//
// Shared-memory descriptor (PTX "Matrix Descriptor Format"; CuTe GmmaDescriptor): start address >> 4 in
// bits [0,14), leading byte offset >> 4 in [16,30) (unused by swizzled K-major layouts; 1 by
// convention), stride byte offset >> 4 in [32,46) (1024: from one 8-row group to the next), base offset
// in [49,52) (0: every B tile is 1024-byte aligned), layout type in [62,64) (1 = 128-byte swizzle).
// The k16 step j of a stage starts 32 j bytes into the tile; the hardware applies the swizzle to the
// address bits (bits [4,7) ^= bits [7,10)), matching the producer's chunk ^ (row % 8).
//
// Numerics: exactly the mma.sync kernel's. Weights decode to FP4 · 2^(scale - 159) (exact BF16 for
// scale bytes 34..160), so the accumulators hold the result times 2^-32; the bias enters them as
// bias · 2^-32 (exact) and the epilogue multiplies by 2^32 (exact). FP32 accumulation.
//
// Variants: the sizes above are variant 0's; variants 0-4 are this register-A form. moe_wgmma::Config
// makes the m64 blocks per consumer warpgroup (kBM = 128 or 256), the routed rows per tile (wgmma n =
// kBN = 64, 128 or 256), the stages and kSkipIdle (a warpgroup skips the decode and MMAs of its m-blocks
// wholly past n_out) compile-time parameters; moe_wgmma::Variants lists the configurations
// $OSPREY_MOE_WGMMA_VARIANT selects from, including the SS form's (below).
//
// Variants 5-8: the SS form (moe_wgmma_ss_kernel, moe_wgmma::SsConfig). Why: with register A,
// ptxas lets a consumer write A fragments only while at most one MMA group is outstanding, so each
// consumer decodes, fences, issues and waits in turn and the tensor pipe idles during every decode (20b
// at 1024 tokens: 33% of 790 TFLOP/s). Here the producer warpgroup decodes into shared memory and the
// consumers only issue wgmma with both operands in shared memory:
//   producer (warpgroup 0, kSsProducerRegs): cp.async of the B tile and the FP4 tile into a kStages
//     ring (full/empty mbarriers as above), kLookahead = kStages - 2 stages ahead of its own decode. Per
//     stage it waits for the FP4 tile (full) and a free decoded tile (a_empty; a ring of kAStages
//     tiles of kBM rows x 128 bytes), turns each 16-byte FP4 chunk (row m, group h: 32 weights) into 4
//     x 16 bytes of BF16 stored at chunk (4 h + i) ^ (m % 8) of the row (the K-major 128-byte swizzle
//     that desc_k_sw128 describes, as for B), fence.proxy.async, and arrives on a_full (one arrival per
//     thread). Lane 2 (m % 16) + h: 8 consecutive lanes store to 8 distinct 16-byte bank groups. Rows
//     past n_out are not decoded (their accumulators are never stored). The per-tile scale buffers are
//     now read by the producer, which hands a slot back per warp after the tile's last decode.
//   consumers (warpgroups 1, 2; kSsConsumerRegs): per stage wait full and a_full, then 4 k16 steps x
//     kMBlocks wgmma m64nNk16 with A = the decoded tile (64 rows per m-block, + 32 bytes per k16 step)
//     and B = the B tile, one commit, wait_group 1: the previous stage's group is complete, so its load
//     stage and decoded tile go back to the producer (empty, a_empty). So one group (4 kMBlocks MMAs) is
//     always queued while the consumer waits for the next stage, and no instruction between an MMA's
//     issue and its wait writes a wgmma operand register: ptxas serialises nothing (no C7511/C7513
//     notice; nvcc 13.0). Bias in the accumulators, tile schedule and epilogues as above.
//   No deadlock: the consumers release stage s only after issuing stage s + 1's MMAs, which needs s + 1
//     decoded; the producer issues the loads of stage s + kLookahead before decoding s, and waiting for
//     stage s + kLookahead - kStages = s - 2 to be released needs only decodes it has done. Its loads
//     never reach a tile two past the one it decodes (that tile's scale slot frees after this decode).
//   Numerics: the same decode (fp4_pair, bf16x2 multiply by 2^(scale - 33)), so the same BF16 weights,
//     products and FP32 accumulation as the register-A form (mlp2's k order follows u's moe_u_column
//     order: pair c of a decoded chunk holds units c and c + 4).
// Decode budget, per SM and k64 stage of v5's 256 x 128 tile: 2.1 M MACs = 1024 clocks at the tensor
// peak (2048 BF16 MAC/clock/SM; 1280 at 790 TFLOP/s, ~2100 at 60% of it). The decode is 16384 weights =
// 2048 words of 8 nibbles; a word costs 4 fp4_pair (mlp2: shift, and, IMAD, and; mlp1: plus the byte
// extract and the shift-or of the high nibble) + 4 HMUL2.BF16 + a quarter of an ld.shared.v4 + one
// st.shared.v4, i.e. ~11 (mlp2) to ~16 (mlp1) ALU-pipe ops (half the FP32 rate: 64 lanes/clock/SM) and
// 8 FMA-pipe ops: 2048 x 11..16 / 64 = 350..510 ALU clocks, 128 FMA clocks, and 32 KB of st.shared =
// 256 clocks of the 128 B/clock shared-memory port. That is 35-50% of the ALU pipe at the tensor peak,
// 17-25% at the 60% target: one warp per SM sub-partition (16 independent words per thread per stage)
// keeps up if it sustains ~0.4 instructions per clock. v6 and v7 (128 weight rows per tile) decode half
// as many weights for the same (v6) or 5/8 (v7) of the MACs.
// Shared-memory bandwidth is the SS form's price. Assuming each wgmma reads its A and B tiles once, a
// v5 stage reads 16 x (2 + 4) KB for its MMAs, plus 32 KB decode stores, 8 KB FP4 loads and 24 KB of
// cp.async: 160 KB = 1250 clocks at 128 B/clock against 1024 tensor clocks, so v5 is bounded near 82%
// of the tensor peak (~810 TFLOP/s); v6 (m64n256: 8 x (2 + 8) + 16 + 4 + 36 = 136 KB per 1024 clocks)
// near 96%; v7 (m64n160: 8 x (2 + 5) + 16 + 4 + 24 = 100 KB per 640 clocks) near 80%.
// Shapes: 20b at 1024 tokens has 128 +- 11 routed rows per expert: v5 (256 x 128, v0's tile: about
// half of the experts spill a few rows into a second n-tile) or v7 (128 x 160: one n-tile for nearly
// every expert, 80% filled, 45 m-tiles of mlp1 per expert: ~11 waves on 132 SMs). 8192 tokens (1024
// rows per expert): v6 (128 x 256, v3's tile, the fastest register-A shape for mlp1 at 8k) or v5 for
// mlp2. v8 (256 x 64, v4's tile) is the candidate for few rows per expert (120b at 1024 tokens: ~32):
// twice v5's decode per MAC, and by the estimate above bound by shared memory near 54% of the peak
// (m64n64: 16 x (2 + 2) + 32 + 8 + 16 = 120 KB per 512 clocks), above v4's measured 17-20%.
// Shared memory for n_in = 2880: v5 206 KB, v6 and v7 216 KB, v8 222 KB.
//
// scripts/emulate_moe_wgmma.sh runs this file's device code on the CPU (tests/kernels/emu): the parts
// under #ifndef OSPREY_CUDA_EMULATION are what the emulation replaces (PTX, launches).
#ifndef OSPREY_CUDA_EMULATION
#include "kernels/cuda/moe_mlp_wgmma.h"
#include "kernels/cuda/mbarrier.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_mlp_mxfp4.h"
#include "kernels/cuda/runtime.h"
#endif
// The pipeline PTX wrappers (emulated under OSPREY_CUDA_EMULATION), desc_k_sw128, moe_swiglu: shared with W4A8.
#include "kernels/cuda/moe_gemm_sm90.cuh"

#include <tuple>

namespace osprey::cuda::moe_wgmma {

constexpr int kConsumerWGs = 2;                          // consumer warpgroups
constexpr int kBK = 64;                                  // k per stage: two MXFP4 groups, one 128-byte swizzle row
constexpr int kThreads = 128 * (1 + kConsumerWGs);
constexpr int kConsumerWarps = 4 * kConsumerWGs;
constexpr int kMaxExperts = 256;                         // kMoeMaxExperts
// Registers per thread after setmaxnreg: the 384 x 168 allotted at launch, redistributed as 128 x 40 +
// 256 x 232 (= 64512). ptxas: no spills in mlp2, 4 bytes in mlp1 (56 / 224 spill more).
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
// The SS form's split (same total): the producer decodes with a few dozen live registers, the consumers
// hold kBN / 2 accumulators per m-block plus the epilogue's.
constexpr int kSsProducerRegs = 104;
constexpr int kSsConsumerRegs = 200;
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 384 * 168 &&
              128 * kSsProducerRegs + 256 * kSsConsumerRegs <= 384 * 168);
constexpr uint32_t kScaleExponentBias = 127 - 33;        // BF16 exponent field of 2^(scale - 33)
constexpr float kUnscale = 4294967296.0f;                // 2^32
constexpr float kBiasScale = 1.0f / 4294967296.0f;       // 2^-32

// One compile-time configuration of the kernel. Variant 0 (kVariants below) is the default; the others
// are candidates timed against it, selected by $OSPREY_MOE_WGMMA_VARIANT (docs/architecture.md).
template <int kMBlocks_, int kBN_, int kStages_, bool kSkipIdle_>
struct Config {
    static constexpr bool kSS = false;                        // register-A form (moe_wgmma_kernel)
    static constexpr int kMBlocks = kMBlocks_;                // wgmma m64 blocks per consumer warpgroup
    static constexpr int kBM = 64 * kMBlocks * kConsumerWGs;  // weight rows per tile
    static constexpr int kBN = kBN_;                          // routed rows per tile (wgmma n)
    static constexpr int kStages = kStages_;
    static constexpr bool kSkipIdle = kSkipIdle_;             // m-blocks wholly past n_out skip decode and MMA
    static constexpr int kAcc = kBN / 2;                      // accumulator registers per m-block
    static constexpr int kXStageBytes = kBN * kBK * 2;        // B tile: kBN rows x 128 bytes
    static constexpr int kWStageBytes = kBM * kBK / 2;        // FP4 tile: kBM rows x 32 bytes
    static constexpr int kStageBytes = kXStageBytes + kWStageBytes;
    static constexpr int kAStages = 0;                        // no decoded-weight ring
    static constexpr int kAStageBytes = 0;
    static_assert(kMBlocks == 1 || kMBlocks == 2);
    static_assert(kBN == 64 || kBN == 128 || kBN == 256);
    static_assert(kStageBytes % 1024 == 0 && kXStageBytes % 1024 == 0);  // every B tile stays 1024-aligned
};

// The SS form (moe_wgmma_ss_kernel; see "Variants 5 and 6" at the top): the producer warpgroup also
// decodes, into a ring of kAStages BF16 weight tiles (kBM rows x 128 bytes, 128-byte swizzle) that the
// consumers read through a descriptor. kStages is the cp.async ring (B tile + FP4 tile per stage); the
// loads run kLookahead = kStages - 2 stages ahead of the decode (the most that cannot deadlock: the
// consumers release a stage only after issuing the next one's MMAs, which needs its decode).
template <int kMBlocks_, int kBN_, int kStages_, int kAStages_>
struct SsConfig {
    static constexpr bool kSS = true;
    static constexpr int kMBlocks = kMBlocks_;
    static constexpr int kBM = 64 * kMBlocks * kConsumerWGs;
    static constexpr int kBN = kBN_;
    static constexpr int kStages = kStages_;
    static constexpr bool kSkipIdle = false;                  // partial m-tiles: rows past n_out not decoded, MMAs run
    static constexpr int kAcc = kBN / 2;
    static constexpr int kXStageBytes = kBN * kBK * 2;
    static constexpr int kWStageBytes = kBM * kBK / 2;
    static constexpr int kStageBytes = kXStageBytes + kWStageBytes;
    static constexpr int kAStages = kAStages_;                // decoded BF16 weight tiles
    static constexpr int kAStageBytes = kBM * kBK * 2;        // kBM rows x 128 bytes
    static constexpr int kLookahead = kStages - 2;
    static_assert(kMBlocks == 1 || kMBlocks == 2);
    static_assert(kBN == 64 || kBN == 128 || kBN == 160 || kBN == 256);  // the wgmma_m64nNk16_ss wrappers
    static_assert(kStages >= 3 && kAStages >= 2);
    static_assert(kStageBytes % 1024 == 0 && kXStageBytes % 1024 == 0 && kAStageBytes % 1024 == 0);
};

// The variants, by index ($OSPREY_MOE_WGMMA_VARIANT). Every one takes n_in up to 2880 (see smem_bytes).
using Variants = std::tuple<Config<2, 128, 5, false>,  // 0: 256 x 128 tiles, 5 stages (the default)
                            Config<2, 128, 5, true>,   // 1: 0 + idle m-blocks of partial m-tiles skipped
                            Config<2, 128, 7, true>,   // 2: 1 + 7 stages
                            Config<1, 256, 5, true>,   // 3: 128 x 256 tiles (m64n256), idle m-blocks skipped
                            Config<2, 64, 8, true>,    // 4: 256 x 64 tiles (m64n64), 8 stages, idle skipped
                            SsConfig<2, 128, 4, 2>,    // 5: SS, 256 x 128 tiles, 4 load stages, 2 decoded
                            SsConfig<1, 256, 4, 3>,    // 6: SS, 128 x 256 tiles (m64n256), 4 load stages, 3 decoded
                            SsConfig<1, 160, 6, 3>,    // 7: SS, 128 x 160 tiles (m64n160), 6 load stages, 3 decoded
                            SsConfig<2, 64, 7, 2>>;    // 8: SS, 256 x 64 tiles (m64n64), 7 load stages, 2 decoded
constexpr int kVariants = int(std::tuple_size_v<Variants>);
template <int kVariant>
using Variant = std::tuple_element_t<kVariant, Variants>;

enum class Proj { mlp1, mlp2 };

struct Params {
    const uint8_t* blocks;        // [n_experts, n_out, n_groups, 16]
    const uint8_t* scales;        // [n_experts, n_out, n_groups]
    const __nv_bfloat16* bias;    // [n_experts, n_out]
    const __nv_bfloat16* x;       // mlp1: [n_tokens, n_in] (gathered); mlp2: [n_rows, n_in] (sorted order)
    void* out;                    // mlp1: u [n_rows, n_out / 2] bf16; mlp2: y [n_rows, n_out] f32
    const int32_t* offsets;       // [n_experts + 1]
    const int32_t* sorted_rows;   // [n_rows]
    int n_experts, top_k, n_in, n_out, n_groups, n_kt, m_tiles;
    float alpha, limit;
};

// Dynamic shared memory after the 1024-byte alignment: kStages x (B tile, FP4 tile), the SS form's
// kAStages decoded weight tiles, then the two per-tile scale buffers [2][kBM * n_groups].
template <class Cfg>
constexpr size_t smem_bytes(int n_groups) {
    return 1024 + size_t(Cfg::kStages) * Cfg::kStageBytes + size_t(Cfg::kAStages) * Cfg::kAStageBytes +
           2 * size_t(Cfg::kBM) * n_groups;
}

#ifndef OSPREY_CUDA_EMULATION  // (mbar_t, smem_u32 and the mbarrier operations: mbarrier.cuh)

// d[64xN] += a[64x16] (registers, BF16) · b[16xN] (shared memory, K-major BF16 via desc), N = Cfg::kBN.
template <int N>
__device__ __forceinline__ void wgmma_m64nNk16(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc);
template <>
__device__ __forceinline__ void wgmma_m64nNk16<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}
template <>
__device__ __forceinline__ void wgmma_m64nNk16<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}
template <>
__device__ __forceinline__ void wgmma_m64nNk16<256>(float (&d)[128], const uint32_t (&a)[4], uint64_t desc) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "{%128, %129, %130, %131}, %132, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}

// (wgmma_m64nNk16_ss, the SS form's MMA: moe_gemm_sm90.cuh, shared with the matrix-expert GEMM.)

__device__ __forceinline__ uint4 ld_shared16(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ void st_shared16(uint8_t* p, uint4 v) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_u32(p)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
#endif  // OSPREY_CUDA_EMULATION

// Two FP4 nibbles of word w as one BF16x2 of FP4 · 2^-126 (low half from the lower k; see the top):
// with the nibbles isolated at bits [3:0] and [19:16], the product by 4160 = 2^12 + 2^6 holds each twice
// without carries; the mask keeps the sign from the high copy (bit 15) and e1 e0 m from the low copy
// (bits 8:6), in both halves. `shift` is 8 q (mlp1) or 4 q (mlp2).
template <Proj kProj>
__device__ __forceinline__ uint32_t fp4_pair(uint32_t w, uint32_t shift) {
    uint32_t iso;
    if constexpr (kProj == Proj::mlp1) {
        const uint32_t b = (w >> shift) & 0xFFu;  // byte q: elements 2q (low nibble), 2q + 1
        iso = (b | (b << 12)) & 0x000F000Fu;
    } else {
        iso = (w >> shift) & 0x000F000Fu;  // nibbles q and q + 4
    }
    return (iso * 4160u) & 0x81C081C0u;
}

// Bias into the accumulators (times 2^-32, like the products) of consumer warpgroup cw's m-blocks.
// Rows past n_out (a partial m-tile) compute on whatever the stage holds and are never stored.
template <class Cfg>
__device__ __forceinline__ void load_bias(const Params& p, const MoeTile& tile, float (&acc)[Cfg::kMBlocks][Cfg::kAcc],
                                          int cw, int warp, int g) {
    constexpr int kMBlocks = Cfg::kMBlocks;
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) {
        const int fa = tile.f0 + 64 * (kMBlocks * cw + mb) + 16 * warp + g;
        const bool ok = fa < p.n_out;  // n_out % 64 == 0: rows fa and fa + 8 are both valid or not
        const float ba = ok ? __bfloat162float(p.bias[size_t(tile.expert) * p.n_out + fa]) * kBiasScale : 0.0f;
        const float bb = ok ? __bfloat162float(p.bias[size_t(tile.expert) * p.n_out + fa + 8]) * kBiasScale : 0.0f;
#pragma unroll
        for (int i = 0; i < Cfg::kBN / 8; ++i) {
            acc[mb][4 * i + 0] = ba, acc[mb][4 * i + 1] = ba;
            acc[mb][4 * i + 2] = bb, acc[mb][4 * i + 3] = bb;
        }
    }
}

// The epilogue of consumer warpgroup cw (thread: warp, g = lane / 4, q = lane % 4) for one tile.
template <class Cfg, Proj kProj>
__device__ __forceinline__ void store_tile(const Params& p, const MoeTile& tile,
                                           const float (&acc)[Cfg::kMBlocks][Cfg::kAcc], int cw, int warp, int g,
                                           int q) {
    constexpr int kMBlocks = Cfg::kMBlocks, kBN = Cfg::kBN;
    // acc[mb][4i + j]: weight row fa (j < 2) or fa + 8, tile row 8i + 2q + j % 2.
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) {
        const int fa = tile.f0 + 64 * (kMBlocks * cw + mb) + 16 * warp + g, fb = fa + 8;
        if (fa >= p.n_out) continue;  // uniform over the warpgroup (n_out % 64 == 0)
        if constexpr (kProj == Proj::mlp1) {
            // Rows 2j (gate) and 2j + 1 (up) of unit j sit in lanes 4 apart: the even lane keeps
            // routed row 2q, the odd lane 2q + 1, after swapping the other half with its partner.
            const bool even = (g & 1) == 0;
            const int d_ff = p.n_out / 2;
            __nv_bfloat16* u = static_cast<__nv_bfloat16*>(p.out);
#pragma unroll
            for (int i = 0; i < kBN / 8; ++i) {
                const float* v = &acc[mb][4 * i];
                const float va0 = v[0] * kUnscale, va1 = v[1] * kUnscale;
                const float vb0 = v[2] * kUnscale, vb1 = v[3] * kUnscale;
                const float a_other = __shfl_xor_sync(0xffffffffu, even ? va1 : va0, 4);
                const float b_other = __shfl_xor_sync(0xffffffffu, even ? vb1 : vb0, 4);
                const int n = 8 * i + 2 * q + (even ? 0 : 1);
                if (n < tile.n_rows) {
                    const float out_a = even ? moe_swiglu(va0, a_other, p.alpha, p.limit) : moe_swiglu(a_other, va1, p.alpha, p.limit);
                    const float out_b = even ? moe_swiglu(vb0, b_other, p.alpha, p.limit) : moe_swiglu(b_other, vb1, p.alpha, p.limit);
                    __nv_bfloat16* urow = u + size_t(tile.row0 + n) * d_ff;
                    urow[moe_u_column(fa >> 1)] = __float2bfloat16_rn(out_a);
                    urow[moe_u_column(fb >> 1)] = __float2bfloat16_rn(out_b);
                }
            }
        } else {
            float* y = static_cast<float*>(p.out);
#pragma unroll
            for (int i = 0; i < kBN / 8; ++i) {
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int n = 8 * i + 2 * q + j;
                    if (n < tile.n_rows) {
                        float* yrow = y + size_t(p.sorted_rows[tile.row0 + n]) * p.n_out;
                        yrow[fa] = acc[mb][4 * i + j] * kUnscale;
                        yrow[fb] = acc[mb][4 * i + 2 + j] * kUnscale;
                    }
                }
            }
        }
    }
}

template <class Cfg, Proj kProj>
__global__ void __launch_bounds__(kThreads, 1) moe_wgmma_kernel(const Params p) {
    constexpr int kMBlocks = Cfg::kMBlocks, kBM = Cfg::kBM, kBN = Cfg::kBN, kStages = Cfg::kStages;
    constexpr int kStageBytes = Cfg::kStageBytes, kXStageBytes = Cfg::kXStageBytes;
    pdl_enter();  // launch.cuh: before any global access

    __shared__ mbar_t full[kStages], empty[kStages], scales_full[2], scales_empty[2];
    __shared__ int tile_start[kMaxExperts + 1];
    uint8_t* const raw = dynamic_smem();
    uint8_t* const smem = raw + (1024 - smem_u32(raw) % 1024) % 1024;  // B tiles must be 1024-aligned
    uint8_t* const scales_s = smem + kStages * kStageBytes;            // [2][kBM * n_groups]
    const int tid = threadIdx.x;

    // Tile counts per expert, prefix-summed by warp 0; barriers initialised by thread 0.
    if (tid < 32) {
        moe_count_tiles<Cfg::kBN>(p, tile_start, tid);
        if (tid == 0) {
            for (int s = 0; s < kStages; ++s) {
                mbar_init(&full[s], 128);             // one cp.async arrival per producer thread
                mbar_init(&empty[s], kConsumerWarps);  // one arrival per consumer warp
            }
            for (int s = 0; s < 2; ++s) {
                mbar_init(&scales_full[s], 1);
                mbar_init(&scales_empty[s], kConsumerWarps);
            }
            mbar_init_fence();
        }
    }
    __syncthreads();
    const int n_tiles = tile_start[p.n_experts];
    const int wg = tid / 128;

    if (wg == 0) {
        // ---- producer: every thread copies kBN / 16 chunks of B and kBM / 64 of the FP4 tile per stage ----
        setmaxnreg_dec<kProducerRegs>();
        const int pt = tid;
        const int xc = pt % 8, xr = pt / 8;  // chunk xc of B rows xr + 16 j
        const int wc = pt % 2, wr = pt / 2;  // chunk wc of FP4 rows wr + 64 j
        constexpr uint32_t kInvalid = 0xFFFFFFFFu;
        int it = 0;  // stage uses so far (the ring position)
        int local_tile = 0;
        for (int t = blockIdx.x; t < n_tiles; t += gridDim.x, ++local_tile) {
            const MoeTile tile = moe_tile_at<Cfg::kBN, Cfg::kBM>(p, tile_start, t);
            const int slot = local_tile & 1;
            const int rows_w = min(kBM, p.n_out - tile.f0);
            if (pt == 0) {
                mbar_wait(&scales_empty[slot], ((local_tile >> 1) & 1) ^ 1);
                const uint32_t bytes = uint32_t(rows_w) * uint32_t(p.n_groups);
                mbar_arrive_expect_tx(&scales_full[slot], bytes);
                bulk_copy_g2s(scales_s + slot * kBM * p.n_groups,
                              p.scales + (size_t(tile.expert) * p.n_out + tile.f0) * p.n_groups, bytes,
                              &scales_full[slot]);
            }
            uint32_t x_src[kBN / 16], w_src[kBM / 64];  // element / byte offsets of k = 0, or kInvalid
#pragma unroll
            for (int j = 0; j < kBN / 16; ++j) {
                const int n = xr + 16 * j;
                uint32_t row = kInvalid;
                if (n < tile.n_rows) {
                    const int sorted = tile.row0 + n;
                    row = uint32_t(kProj == Proj::mlp1 ? p.sorted_rows[sorted] / p.top_k : sorted);
                }
                x_src[j] = row == kInvalid ? kInvalid : row * uint32_t(p.n_in) + uint32_t(xc * 8);
            }
#pragma unroll
            for (int j = 0; j < kBM / 64; ++j) {
                const int m = wr + 64 * j;
                w_src[j] = m < rows_w ? (uint32_t(tile.expert) * uint32_t(p.n_out) + uint32_t(tile.f0 + m)) *
                                                uint32_t(p.n_groups * 16) + uint32_t(wc * 16)
                                      : kInvalid;
            }
            for (int kt = 0; kt < p.n_kt; ++kt, ++it) {
                const int stage = it % kStages;
                mbar_wait(&empty[stage], ((it / kStages) & 1) ^ 1);
                uint8_t* xs = smem + stage * kStageBytes;
                uint8_t* ws = xs + kXStageBytes;
#pragma unroll
                for (int j = 0; j < kBN / 16; ++j) {
                    const int n = xr + 16 * j;
                    const bool ok = x_src[j] != kInvalid;
                    cp_async16_zfill(xs + n * 128 + ((xc ^ (n & 7)) << 4), p.x + (ok ? x_src[j] + uint32_t(kt * kBK) : 0u),
                                     ok);
                }
#pragma unroll
                for (int j = 0; j < kBM / 64; ++j) {
                    const int m = wr + 64 * j;
                    const bool ok = w_src[j] != kInvalid;
                    cp_async16_zfill(ws + m * 32 + ((wc ^ ((m >> 2) & 1)) << 4),
                                     p.blocks + (ok ? w_src[j] + uint32_t(kt * 32) : 0u), ok);
                }
                cp_async_mbar_arrive_noinc(&full[stage]);
            }
        }
        cp_async_wait_all();
        return;
    }

    // ---- consumers ----
    setmaxnreg_inc<kConsumerRegs>();
    const int cw = wg - 1;                  // consumer warpgroup: weight rows [64 kMBlocks cw, + 64 kMBlocks) of the tile
    const int wt = tid % 128;               // thread in the warpgroup
    const int warp = wt / 32, lane = wt % 32;
    const int g = lane / 4, q = lane % 4;
    const uint32_t shift = kProj == Proj::mlp1 ? 8u * q : 4u * q;
    int it = 0;
    int local_tile = 0;
    float acc[kMBlocks][Cfg::kAcc];
    uint32_t afrag[2][kMBlocks][2][4];  // [group h of the stage][m-block][k16 step][register]

    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x, ++local_tile) {
        const MoeTile tile = moe_tile_at<Cfg::kBN, Cfg::kBM>(p, tile_start, t);
        const int slot = local_tile & 1;

        load_bias<Cfg>(p, tile, acc, cw, warp, g);

        mbar_wait(&scales_full[slot], (local_tile >> 1) & 1);
        const uint8_t* sc = scales_s + slot * kBM * p.n_groups;

        // The k-loop over the first kAct m-blocks of this warpgroup (all of them unless kSkipIdle).
        auto mainloop = [&]<int kAct>() {
            for (int kt = 0; kt < p.n_kt; ++kt, ++it) {
                const int stage = it % kStages;
                mbar_wait(&full[stage], (it / kStages) & 1);
                fence_proxy_async();
                const uint8_t* xs = smem + stage * kStageBytes;
                const uint8_t* ws = xs + kXStageBytes;
                const uint32_t xs_addr = smem_u32(xs);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int grp = 2 * kt + h;
#pragma unroll
                    for (int mb = 0; mb < kAct; ++mb) {
                        const int fl = 64 * (kMBlocks * cw + mb) + 16 * warp + g;  // tile-local weight row; fl + 8 too
                        const uint8_t* row = ws + fl * 32 + ((h ^ ((fl >> 2) & 1)) << 4);
                        const uint4 wa = ld_shared16(row), wb = ld_shared16(row + 8 * 32);
                        const uint32_t sa = (uint32_t(sc[fl * p.n_groups + grp]) + kScaleExponentBias) * 0x00800080u;
                        const uint32_t sb = (uint32_t(sc[(fl + 8) * p.n_groups + grp]) + kScaleExponentBias) * 0x00800080u;
                        uint32_t(&f)[2][4] = afrag[h][mb];
                        f[0][0] = bf16x2_mul(fp4_pair<kProj>(wa.x, shift), sa);
                        f[0][1] = bf16x2_mul(fp4_pair<kProj>(wb.x, shift), sb);
                        f[0][2] = bf16x2_mul(fp4_pair<kProj>(wa.y, shift), sa);
                        f[0][3] = bf16x2_mul(fp4_pair<kProj>(wb.y, shift), sb);
                        f[1][0] = bf16x2_mul(fp4_pair<kProj>(wa.z, shift), sa);
                        f[1][1] = bf16x2_mul(fp4_pair<kProj>(wb.z, shift), sb);
                        f[1][2] = bf16x2_mul(fp4_pair<kProj>(wa.w, shift), sa);
                        f[1][3] = bf16x2_mul(fp4_pair<kProj>(wb.w, shift), sb);
                    }
                    wgmma_fence();
#pragma unroll
                    for (int mb = 0; mb < kAct; ++mb) fence_operands(acc[mb]);
#pragma unroll
                    for (int s = 0; s < 2; ++s)
#pragma unroll
                        for (int mb = 0; mb < kAct; ++mb)
                            wgmma_m64nNk16<kBN>(acc[mb], afrag[h][mb][s], desc_k_sw128(xs_addr + 32 * (2 * h + s)));
                    wgmma_commit();
                    wgmma_wait<1>();  // the group before this one is complete: its A buffer and stage are free
#pragma unroll
                    for (int mb = 0; mb < kAct; ++mb) fence_operands(acc[mb]);
                    if (h == 0 && kt > 0) {
                        __syncwarp();
                        if (lane == 0) mbar_arrive(&empty[(it - 1) % kStages]);
                    }
                }
            }
            wgmma_wait<0>();
#pragma unroll
            for (int mb = 0; mb < kAct; ++mb) fence_operands(acc[mb]);
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[(it - 1) % kStages]);
        };
        // A warpgroup whose rows of this tile all lie past n_out only hands the stages back.
        auto drain = [&]() {
            for (int kt = 0; kt < p.n_kt; ++kt, ++it) {
                const int stage = it % kStages;
                mbar_wait(&full[stage], (it / kStages) & 1);
                __syncwarp();
                if (lane == 0) mbar_arrive(&empty[stage]);
            }
        };
        if constexpr (Cfg::kSkipIdle) {
            const int active = min(kMBlocks, max(0, (p.n_out - tile.f0 - 64 * kMBlocks * cw) / 64));  // uniform
            if (active == kMBlocks) mainloop.template operator()<kMBlocks>();
            else if (kMBlocks > 1 && active == 1) mainloop.template operator()<1>();
            else drain();
        } else {
            mainloop.template operator()<kMBlocks>();
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&scales_empty[slot]);

        store_tile<Cfg, kProj>(p, tile, acc, cw, warp, g, q);
    }
}

// The SS form (Cfg::kSS; "Variants 5 and 6" at the top): the producer warpgroup loads and decodes, the
// consumers only issue wgmma with both operands in shared memory.
template <class Cfg, Proj kProj>
__global__ void __launch_bounds__(kThreads, 1) moe_wgmma_ss_kernel(const Params p) {
    static_assert(Cfg::kSS);
    constexpr int kMBlocks = Cfg::kMBlocks, kBM = Cfg::kBM, kBN = Cfg::kBN, kStages = Cfg::kStages;
    constexpr int kAStages = Cfg::kAStages, kLookahead = Cfg::kLookahead;
    constexpr int kStageBytes = Cfg::kStageBytes, kXStageBytes = Cfg::kXStageBytes;
    constexpr int kAStageBytes = Cfg::kAStageBytes;
    pdl_enter();  // launch.cuh: before any global access

    __shared__ mbar_t full[kStages], empty[kStages], a_full[kAStages], a_empty[kAStages], scales_full[2],
        scales_empty[2];
    __shared__ int tile_start[kMaxExperts + 1];
    uint8_t* const raw = dynamic_smem();
    uint8_t* const smem = raw + (1024 - smem_u32(raw) % 1024) % 1024;  // operand tiles must be 1024-aligned
    uint8_t* const a_ring = smem + kStages * kStageBytes;              // [kAStages][kBM rows x 128 bytes]
    uint8_t* const scales_s = a_ring + kAStages * kAStageBytes;        // [2][kBM * n_groups]
    const int tid = threadIdx.x;

    if (tid < 32) {
        moe_count_tiles<Cfg::kBN>(p, tile_start, tid);
        if (tid == 0) {
            for (int s = 0; s < kStages; ++s) {
                mbar_init(&full[s], 128);              // one cp.async arrival per producer thread
                mbar_init(&empty[s], kConsumerWarps);  // one arrival per consumer warp
            }
            for (int s = 0; s < kAStages; ++s) {
                mbar_init(&a_full[s], 128);             // one arrival per producer thread, after its stores
                mbar_init(&a_empty[s], kConsumerWarps);
            }
            for (int s = 0; s < 2; ++s) {
                mbar_init(&scales_full[s], 1);
                mbar_init(&scales_empty[s], 4);  // one arrival per producer warp: the decode reads them
            }
            mbar_init_fence();
        }
    }
    __syncthreads();
    const int n_tiles = tile_start[p.n_experts];
    const int wg = tid / 128;
    const int wt = tid % 128;  // thread in the warpgroup
    const int warp = wt / 32, lane = wt % 32;

    if (wg == 0) {
        // ---- producer: cp.async loads kLookahead stages ahead of the FP4 -> BF16 decode ----
        setmaxnreg_dec<kSsProducerRegs>();
        const int xc = wt % 8, xr = wt / 8;  // chunk xc of B rows xr + 16 j
        const int wc = wt % 2, wr = wt / 2;  // chunk wc of FP4 rows wr + 64 j
        constexpr uint32_t kInvalid = 0xFFFFFFFFu;
        // Load cursor: tile lt (the l_local-th of this CTA), its k-stage l_kt, ring position l_step.
        int lt = blockIdx.x, l_local = 0, l_kt = 0, l_step = 0;
        uint32_t x_src[kBN / 16], w_src[kBM / 64];  // element / byte offsets of k = 0, or kInvalid
        MoeTile ltile{};
        // Issues the loads of one stage; at a tile's first stage also its scales (thread 0) and sources.
        auto load_stage = [&]() {
            if (l_kt == 0) {
                ltile = moe_tile_at<Cfg::kBN, Cfg::kBM>(p, tile_start, lt);
                const int slot = l_local & 1;
                const int rows_w = min(kBM, p.n_out - ltile.f0);
                if (wt == 0) {
                    mbar_wait(&scales_empty[slot], ((l_local >> 1) & 1) ^ 1);
                    const uint32_t bytes = uint32_t(rows_w) * uint32_t(p.n_groups);
                    mbar_arrive_expect_tx(&scales_full[slot], bytes);
                    bulk_copy_g2s(scales_s + slot * kBM * p.n_groups,
                                  p.scales + (size_t(ltile.expert) * p.n_out + ltile.f0) * p.n_groups, bytes,
                                  &scales_full[slot]);
                }
#pragma unroll
                for (int j = 0; j < kBN / 16; ++j) {
                    const int n = xr + 16 * j;
                    uint32_t row = kInvalid;
                    if (n < ltile.n_rows) {
                        const int sorted = ltile.row0 + n;
                        row = uint32_t(kProj == Proj::mlp1 ? p.sorted_rows[sorted] / p.top_k : sorted);
                    }
                    x_src[j] = row == kInvalid ? kInvalid : row * uint32_t(p.n_in) + uint32_t(xc * 8);
                }
#pragma unroll
                for (int j = 0; j < kBM / 64; ++j) {
                    const int m = wr + 64 * j;
                    w_src[j] = m < rows_w ? (uint32_t(ltile.expert) * uint32_t(p.n_out) + uint32_t(ltile.f0 + m)) *
                                                    uint32_t(p.n_groups * 16) + uint32_t(wc * 16)
                                          : kInvalid;
                }
            }
            const int stage = l_step % kStages;
            mbar_wait(&empty[stage], ((l_step / kStages) & 1) ^ 1);
            uint8_t* xs = smem + stage * kStageBytes;
            uint8_t* ws = xs + kXStageBytes;
#pragma unroll
            for (int j = 0; j < kBN / 16; ++j) {
                const int n = xr + 16 * j;
                const bool ok = x_src[j] != kInvalid;
                cp_async16_zfill(xs + n * 128 + ((xc ^ (n & 7)) << 4),
                                 p.x + (ok ? x_src[j] + uint32_t(l_kt * kBK) : 0u), ok);
            }
#pragma unroll
            for (int j = 0; j < kBM / 64; ++j) {
                const int m = wr + 64 * j;
                const bool ok = w_src[j] != kInvalid;
                cp_async16_zfill(ws + m * 32 + ((wc ^ ((m >> 2) & 1)) << 4),
                                 p.blocks + (ok ? w_src[j] + uint32_t(l_kt * 32) : 0u), ok);
            }
            cp_async_mbar_arrive_noinc(&full[stage]);
            ++l_step;
            if (++l_kt == p.n_kt) l_kt = 0, lt += gridDim.x, ++l_local;
        };

        // Decode: lane = 2 (row % 16) + h: the 16-byte FP4 chunk h (MXFP4 group 2 kt + h) of rows
        // 64 j + 16 warp + lane / 2 becomes 4 chunks of 8 BF16, stored at chunk (4 h + i) ^ (row % 8) of the
        // 128-byte row (the 128-byte swizzle; 8 consecutive lanes hit 8 distinct chunk columns).
        const int h = lane & 1;
        int d_step = 0, d_local = 0;
        for (int t = blockIdx.x; t < n_tiles; t += gridDim.x, ++d_local) {
            const MoeTile tile = moe_tile_at<Cfg::kBN, Cfg::kBM>(p, tile_start, t);
            const int slot = d_local & 1;
            const int rows_w = min(kBM, p.n_out - tile.f0);
            bool scales_ready = false;
            const uint8_t* sc = scales_s + slot * kBM * p.n_groups;
            for (int kt = 0; kt < p.n_kt; ++kt, ++d_step) {
                // Loads up to kLookahead stages ahead, never into a tile two past this one (its scales
                // would need this tile's slot, released only after its decode).
                while (lt < n_tiles && l_step <= d_step + kLookahead && l_local <= d_local + 1) load_stage();
                if (!scales_ready) mbar_wait(&scales_full[slot], (d_local >> 1) & 1), scales_ready = true;
                const int stage = d_step % kStages, as = d_step % kAStages;
                mbar_wait(&full[stage], (d_step / kStages) & 1);
                mbar_wait(&a_empty[as], ((d_step / kAStages) & 1) ^ 1);
                const uint8_t* ws = smem + stage * kStageBytes + kXStageBytes;
                uint8_t* const at = a_ring + as * kAStageBytes;
#pragma unroll
                for (int j = 0; j < kBM / 64; ++j) {
                    if (64 * j >= rows_w) continue;  // uniform: rows past n_out are never stored, so not decoded
                    const int m = 64 * j + 16 * warp + lane / 2;
                    const uint4 w = ld_shared16(ws + m * 32 + ((h ^ ((m >> 2) & 1)) << 4));
                    const uint32_t s2 = (uint32_t(sc[m * p.n_groups + 2 * kt + h]) + kScaleExponentBias) * 0x00800080u;
                    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
                    uint8_t* const row = at + m * 128;
#pragma unroll
                    for (int i = 0; i < 4; ++i) {  // elements 8 i .. 8 i + 7 of the group: word i
                        // BF16 pair c of the chunk: mlp1 elements 2c, 2c + 1 (byte c); mlp2, whose u
                        // columns are in moe_u_column order, units c and c + 4 (nibbles c, c + 4).
                        constexpr uint32_t kShift = kProj == Proj::mlp1 ? 8u : 4u;
                        const uint4 o = make_uint4(bf16x2_mul(fp4_pair<kProj>(words[i], 0u), s2),
                                                   bf16x2_mul(fp4_pair<kProj>(words[i], kShift), s2),
                                                   bf16x2_mul(fp4_pair<kProj>(words[i], 2u * kShift), s2),
                                                   bf16x2_mul(fp4_pair<kProj>(words[i], 3u * kShift), s2));
                        st_shared16(row + (((4 * h + i) ^ (m & 7)) << 4), o);
                    }
                }
                fence_proxy_async();  // this thread's st.shared before the consumers' wgmma reads
                mbar_arrive(&a_full[as]);
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&scales_empty[slot]);
        }
        cp_async_wait_all();
        return;
    }

    // ---- consumers: wgmma with A (decoded weights) and B (routed rows) from shared memory ----
    setmaxnreg_inc<kSsConsumerRegs>();
    const int cw = wg - 1;  // consumer warpgroup: weight rows [64 kMBlocks cw, + 64 kMBlocks) of the tile
    const int g = lane / 4, q = lane % 4;
    int it = 0;
    float acc[kMBlocks][Cfg::kAcc];
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const MoeTile tile = moe_tile_at<Cfg::kBN, Cfg::kBM>(p, tile_start, t);
        load_bias<Cfg>(p, tile, acc, cw, warp, g);
        for (int kt = 0; kt < p.n_kt; ++kt, ++it) {
            const int stage = it % kStages, as = it % kAStages;
            mbar_wait(&full[stage], (it / kStages) & 1);
            mbar_wait(&a_full[as], (it / kAStages) & 1);
            fence_proxy_async();
            const uint32_t xs_addr = smem_u32(smem + stage * kStageBytes);
            const uint32_t a_addr = smem_u32(a_ring + as * kAStageBytes) + uint32_t(64 * kMBlocks * cw * 128);
            wgmma_fence();
#pragma unroll
            for (int mb = 0; mb < kMBlocks; ++mb) fence_operands(acc[mb]);
#pragma unroll
            for (int s = 0; s < kBK / 16; ++s)
#pragma unroll
                for (int mb = 0; mb < kMBlocks; ++mb)
                    wgmma_m64nNk16_ss<kBN>(acc[mb], desc_k_sw128(a_addr + mb * 64 * 128 + 32 * s),
                                            desc_k_sw128(xs_addr + 32 * s));
            wgmma_commit();
            wgmma_wait<1>();  // the stage before is complete: release its B/FP4 stage and decoded tile
#pragma unroll
            for (int mb = 0; mb < kMBlocks; ++mb) fence_operands(acc[mb]);
            if (kt > 0) {
                __syncwarp();
                if (lane == 0) mbar_arrive(&empty[(it - 1) % kStages]), mbar_arrive(&a_empty[(it - 1) % kAStages]);
            }
        }
        wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb) fence_operands(acc[mb]);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[(it - 1) % kStages]), mbar_arrive(&a_empty[(it - 1) % kAStages]);
        store_tile<Cfg, kProj>(p, tile, acc, cw, warp, g, q);
    }
}

}  // namespace osprey::cuda::moe_wgmma

#ifndef OSPREY_CUDA_EMULATION
namespace osprey::cuda {

namespace {

// The largest n_in whose two per-tile scale buffers fit beside the pipeline (227 KB per block on the
// H200, less the static barriers and tile table).
constexpr int kMaxSmemBytes = kMoeGemmMaxSmemBytes;  // moe_gemm_sm90.cuh

// Every variant takes the gpt-oss widths (n_in = 2880: 90 scale bytes per row).
template <int... kV>
constexpr bool all_fit(std::integer_sequence<int, kV...>) {
    return ((moe_wgmma::smem_bytes<moe_wgmma::Variant<kV>>(2880 / 32) <= size_t(kMaxSmemBytes)) && ...);
}
static_assert(all_fit(std::make_integer_sequence<int, moe_wgmma::kVariants>{}));

// Runs `f.template operator()<Cfg>()` with Cfg the configuration of `variant`.
template <typename F>
void with_variant(int variant, F&& f) {
    [&]<int... kV>(std::integer_sequence<int, kV...>) {
        dispatch_int<kV...>("OSPREY_MOE_WGMMA_VARIANT", variant,
                            [&]<int kVariant>() { f.template operator()<moe_wgmma::Variant<kVariant>>(); });
    }(std::make_integer_sequence<int, moe_wgmma::kVariants>{});
}

template <class Cfg, moe_wgmma::Proj kProj>
void launch(const moe_wgmma::Params& p, int n_rows, cudaStream_t stream) {
    namespace mw = moe_wgmma;
    auto kernel = [] {
        if constexpr (Cfg::kSS) return mw::moe_wgmma_ss_kernel<Cfg, kProj>;
        else return mw::moe_wgmma_kernel<Cfg, kProj>;
    }();
    const size_t smem = mw::smem_bytes<Cfg>(p.n_groups);
    // Once per thread and kernel (the attribute is per device; each rank of a parallel layout drives its
    // GPU from its own thread).
    thread_local const int n_sms = moe_gemm_prepare_device(reinterpret_cast<const void*>(kernel));
    OSPREY_CHECK(smem <= size_t(kMaxSmemBytes), "moe wgmma: n_in = ", p.n_in, " needs ", smem, " bytes of shared memory");
    // Upper bound of the tile count: Σ_e ceil(rows_e / kBN) <= rows / kBN + active experts, times m-tiles.
    const int64_t max_tiles = (int64_t(n_rows) / Cfg::kBN + std::min(p.n_experts, n_rows)) * p.m_tiles;
    const int grid = int(std::min<int64_t>(n_sms, max_tiles));
    cuda::launch(kernel, dim3(grid), dim3(mw::kThreads), smem, stream, p);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int moe_wgmma_variants() { return moe_wgmma::kVariants; }

bool moe_wgmma_variant_from_env() {
    static const bool set = [] {
        const char* v = std::getenv("OSPREY_MOE_WGMMA_VARIANT");
        return v != nullptr && *v != '\0';
    }();
    return set;
}

int moe_wgmma_default_variant() {
    static const int variant = [] {
        const char* v = std::getenv("OSPREY_MOE_WGMMA_VARIANT");
        if (v == nullptr || *v == '\0') return 0;
        char* end = nullptr;
        const long n = std::strtol(v, &end, 10);
        OSPREY_CHECK(*end == '\0' && n >= 0 && n < moe_wgmma::kVariants, "OSPREY_MOE_WGMMA_VARIANT = '", v,
                     "': expected 0..", moe_wgmma::kVariants - 1);
        return int(n);
    }();
    return variant;
}

bool moe_wgmma_supports(int n_in, int n_out, int variant) {
    if (!(n_in > 0 && n_out > 0 && n_in % 64 == 0 && n_out % 64 == 0)) return false;
    bool fits = false;
    with_variant(variant < 0 ? moe_wgmma_default_variant() : variant,
                 [&]<class Cfg>() { fits = moe_wgmma::smem_bytes<Cfg>(n_in / 32) <= size_t(kMaxSmemBytes); });
    return fits;
}

bool moe_wgmma_enabled() {
    static const bool enabled = [] {
        const char* v = std::getenv("OSPREY_MOE_WGMMA");
        return !(v != nullptr && std::strcmp(v, "0") == 0);  // on unless $OSPREY_MOE_WGMMA=0
    }();
    return enabled;
}

void moe_wgmma_launch(const MoeWgmmaProblem& a, cudaStream_t stream) {
    const int variant = a.variant < 0 ? moe_wgmma_default_variant() : a.variant;
    OSPREY_CHECK(moe_wgmma_supports(a.n_in, a.n_out, variant), "moe wgmma: unsupported projection ", a.n_out, " x ",
                 a.n_in, " (n_in and n_out must be multiples of 64) for variant ", variant);
    OSPREY_CHECK(a.n_experts > 0 && a.n_experts <= moe_wgmma::kMaxExperts, "moe wgmma: n_experts = ", a.n_experts);
    if (a.n_rows == 0) return;
    with_variant(variant, [&]<class Cfg>() {
        const moe_wgmma::Params p{a.blocks,
                                  a.scales,
                                  reinterpret_cast<const __nv_bfloat16*>(a.bias),
                                  reinterpret_cast<const __nv_bfloat16*>(a.x),
                                  a.out,
                                  a.expert_offsets,
                                  a.sorted_rows,
                                  a.n_experts,
                                  a.top_k,
                                  a.n_in,
                                  a.n_out,
                                  a.n_in / 32,
                                  a.n_in / moe_wgmma::kBK,
                                  (a.n_out + Cfg::kBM - 1) / Cfg::kBM,
                                  a.swiglu_alpha,
                                  a.swiglu_limit};
        if (a.mlp1) launch<Cfg, moe_wgmma::Proj::mlp1>(p, a.n_rows, stream);
        else launch<Cfg, moe_wgmma::Proj::mlp2>(p, a.n_rows, stream);
    });
}

}  // namespace osprey::cuda
#endif  // OSPREY_CUDA_EMULATION
