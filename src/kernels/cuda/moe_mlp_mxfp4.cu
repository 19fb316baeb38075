// MXFP4 expert projections on tensor cores. One kernel template serves both projections and both
// configurations (see moe_mlp_mxfp4.h):
//   block = (token tile of one expert) x (kBM weight rows); warp w owns weight rows 16w..16w+15
//   and all kBN routed rows of the tile (mma.sync m16n8k16: M = weight rows, N = routed rows).
//   A k-loop over n_in in stages of kBK = 64 (two MXFP4 groups), cp.async multi-stage pipeline:
//   raw FP4 bytes and BF16 activations go to shared memory; each warp decodes its own weight
//   fragments in registers (every weight is decoded once per block) and feeds the tensor cores.
//
// NOTE (fragment layout): the order of k inside one mma is free as long as A and B agree. A
// thread's A fragment needs 4 k-values for each of its two rows; we give it the 8 nibbles of one
// 32-bit word of its row and pair nibble i with nibble i + 4 in each BF16x2 register, because
// those two sit 16 bits apart and one shift + mask turns both into BF16 at once. B (activations)
// must then be paired the same way: elements (i, i + 4) of each group of 8. mlp1 permutes its x
// fragments with byte_perm; mlp1 writes u already in that order (moe_u_column), so mlp2 loads it
// as is.
#include "kernels/cuda/moe_mlp_mxfp4.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/runtime.h"

namespace osprey::cuda {
namespace {

constexpr int kBK = 64;                 // k per pipeline stage = two MXFP4 groups of 32
constexpr int kWRowBytes = kBK / 2;     // packed FP4 bytes of one weight row per stage
constexpr int kXRowBytes = kBK * 2;     // BF16 bytes of one activation row per stage
constexpr int kGroupsPerStage = kBK / 32;
// Decoded weights are FP4 · 2^(scale - 127 - 32) (kept inside BF16's normal range for scale bytes
// 34..160); the accumulators are multiplied back by 2^32 in the epilogue (exact in FP32).
constexpr float kUnscale = 4294967296.0f;  // 2^32
constexpr int kScaleExponentBias = 127 - 33;  // BF16 exponent field of 2^(scale - 33)

template <int kWarps_, int kBN_, int kStages_, int kMinBlocks_>
struct Config {
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kBM = 16 * kWarps;   // weight rows per block
    static constexpr int kBN = kBN_;          // routed rows per tile
    static constexpr int kNTiles = kBN / 8;   // mma n-tiles per warp
    static constexpr int kStages = kStages_;
    static constexpr int kMinBlocks = kMinBlocks_;
    static constexpr int kWStageBytes = kBM * kWRowBytes;
    static constexpr int kStageBytes = kWStageBytes + kBN * kXRowBytes;
    static_assert(kThreads == 2 * kBM, "one 16-byte weight chunk per thread per stage");
};
using GemvConfig = Config<4, 8, 8, 8>;
using GemmConfig = Config<8, 128, 4, 2>;

enum class Proj { mlp1, mlp2 };

struct KernelArgs {
    const uint8_t* blocks;        // [n_experts, n_out, n_groups, 16]
    const uint8_t* scales;        // [n_experts, n_out, n_groups]
    const __nv_bfloat16* bias;    // [n_experts, n_out]
    const __nv_bfloat16* x;       // mlp1: [n_tokens, n_in] (gathered); mlp2: [n_rows, n_in] (sorted order)
    void* out;                    // mlp1: u [n_rows, n_out / 2] bf16; mlp2: y [n_rows, n_out] f32
    const int32_t* offsets;       // [n_experts + 1]
    const int32_t* sorted_rows;   // [n_rows]
    int n_experts, top_k, n_in, n_out, n_groups;
    float alpha, limit;
};

__device__ inline void cp_async16(void* smem, const void* gmem, bool valid) {
    const unsigned s = unsigned(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ inline void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ inline void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ inline uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

// The 8 nibbles of w (elements 0..7 of a row) as 4 BF16x2 (element i low, element i + 4 high),
// times 2^(scale - 33) in both halves of scale2. The nibble's bits (sign, e1, e0, m) land on BF16
// bits 15, 8, 7, 6: exponent field e, mantissa m, i.e. FP4 · 2^-126 exactly (0.5 is a BF16
// subnormal); the multiply by the scale makes it normal and exact.
__device__ inline void decode_fp4x8(uint32_t w, uint32_t scale2, uint32_t (&r)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t t = w >> (4 * i);
        const uint32_t raw = ((t << 6) & 0x01C001C0u) | ((t << 12) & 0x80008000u);
        r[i] = bf16x2_mul(raw, scale2);
    }
}

// Swizzled offsets inside one stage. Weight row r keeps its two 16-byte groups swapped when bit 2
// of r is set, activation row r its 16-byte chunks XOR 4 when r is odd: the fragment loads below
// then hit 32 distinct banks (weights) or are conflict-free per quarter warp (activations).
__device__ inline int w_offset(int r, int h) { return r * kWRowBytes + ((h ^ ((r >> 2) & 1)) << 4); }
__device__ inline int x_offset(int r, int chunk) { return r * kXRowBytes + ((chunk ^ ((r & 1) << 2)) << 4); }

// Finds this block's token tile: the blockIdx.x-th tile when each expert's rows are cut into tiles
// of kBN, experts in order. Returns false for blocks past the last tile.
template <int kBN>
__device__ bool find_tile(const KernelArgs& a, int& expert, int& row0, int& n_rows) {
    __shared__ int s_tile[3];
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        const int target = blockIdx.x;
        int before = 0;
        bool found = false;
        for (int e0 = 0; e0 < a.n_experts && !found; e0 += 32) {
            const int e = e0 + lane;
            const int begin = e < a.n_experts ? a.offsets[e] : 0;
            const int end = e < a.n_experts ? a.offsets[e + 1] : 0;
            const int tiles = (end - begin + kBN - 1) / kBN;
            int incl = tiles;
#pragma unroll
            for (int o = 1; o < 32; o *= 2) {
                const int n = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += n;
            }
            const unsigned hit = __ballot_sync(0xffffffffu, before + incl > target);
            if (hit) {
                found = true;
                if (lane == __ffs(hit) - 1) {
                    const int r0 = begin + (target - (before + incl - tiles)) * kBN;
                    s_tile[0] = e, s_tile[1] = r0, s_tile[2] = min(kBN, end - r0);
                }
            }
            before += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (!found && lane == 0) s_tile[0] = -1;
    }
    __syncthreads();
    expert = s_tile[0], row0 = s_tile[1], n_rows = s_tile[2];
    return expert >= 0;
}

__device__ inline float swiglu(float gate, float up, float alpha, float limit) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    return gate / (1.0f + __expf(-alpha * gate)) * (up + 1.0f);
}

template <class Cfg, Proj kProj>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) moe_mlp_mxfp4_kernel(const KernelArgs a) {
    extern __shared__ __align__(16) uint8_t smem[];  // [kStages][stage] then scales [kBM, n_groups]
    __shared__ int32_t s_rows[Cfg::kBN];  // mlp1: token of each tile row; mlp2: its routed row

    int e, row0, n_rows;
    if (!find_tile<Cfg::kBN>(a, e, row0, n_rows)) return;
    const int f0 = blockIdx.y * Cfg::kBM;  // first weight row of this block
    const int tid = threadIdx.x;
    for (int r = tid; r < Cfg::kBN; r += Cfg::kThreads) {
        const int s = r < n_rows ? a.sorted_rows[row0 + r] : -1;
        s_rows[r] = kProj == Proj::mlp1 && s >= 0 ? s / a.top_k : s;
    }
    __syncthreads();

    uint8_t* scales_s = smem + Cfg::kStages * Cfg::kStageBytes;  // [kBM, n_groups]
    const int n_k = a.n_in / kBK;
    const size_t row_base = size_t(e) * a.n_out + f0;  // expert e's row f0 in [n_experts * n_out]

    // Scale panel of the block's rows: contiguous, 16-byte aligned (rows come in 16s).
    {
        const int valid_bytes = min(Cfg::kBM, a.n_out - f0) * a.n_groups;
        const uint8_t* src = a.scales + row_base * a.n_groups;
        for (int i = tid; i * 16 < Cfg::kBM * a.n_groups; i += Cfg::kThreads)
            cp_async16(scales_s + i * 16, i * 16 < valid_bytes ? src + i * 16 : a.scales, i * 16 < valid_bytes);
    }

    auto load_stage = [&](int stage, int kt) {
        uint8_t* ws = smem + stage * Cfg::kStageBytes;
        uint8_t* xs = ws + Cfg::kWStageBytes;
        {  // weights: one 16-byte group per thread
            const int r = tid / 2, h = tid % 2;
            const bool valid = f0 + r < a.n_out;
            const uint8_t* src = a.blocks + ((row_base + r) * a.n_groups + kt * kGroupsPerStage + h) * 16;
            cp_async16(ws + w_offset(r, h), valid ? src : a.blocks, valid);
        }
        for (int i = tid; i < Cfg::kBN * 8; i += Cfg::kThreads) {  // activations: 8 chunks per row
            const int r = i / 8, chunk = i % 8;
            const int src_row = kProj == Proj::mlp1 ? s_rows[r] : (r < n_rows ? row0 + r : -1);
            const bool valid = src_row >= 0;
            const __nv_bfloat16* src = a.x + size_t(valid ? src_row : 0) * a.n_in + kt * kBK + chunk * 8;
            cp_async16(xs + x_offset(r, chunk), src, valid);
        }
    };

#pragma unroll
    for (int s = 0; s < Cfg::kStages - 1; ++s) {
        if (s < n_k) load_stage(s, s);
        cp_async_commit();
    }

    const int lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, c = lane % 4;
    const int ra = warp * 16 + g, rb = ra + 8;  // this thread's two weight rows (block-local)
    const bool warp_active = f0 + warp * 16 < a.n_out;
    float acc[Cfg::kNTiles][4] = {};

    for (int kt = 0; kt < n_k; ++kt) {
        cp_async_wait<Cfg::kStages - 2>();
        __syncthreads();
        {
            const int pf = kt + Cfg::kStages - 1;
            if (pf < n_k) load_stage(pf % Cfg::kStages, pf);
            cp_async_commit();
        }
        if (!warp_active) continue;
        const uint8_t* ws = smem + (kt % Cfg::kStages) * Cfg::kStageBytes;
        const uint8_t* xs = ws + Cfg::kWStageBytes;
#pragma unroll
        for (int h = 0; h < kGroupsPerStage; ++h) {
            const int grp = kt * kGroupsPerStage + h;
            const uint32_t sa = (uint32_t(scales_s[ra * a.n_groups + grp]) + kScaleExponentBias) * 0x00800080u;
            const uint32_t sb = (uint32_t(scales_s[rb * a.n_groups + grp]) + kScaleExponentBias) * 0x00800080u;
            uint32_t wa[4], wb[4];
            decode_fp4x8(*reinterpret_cast<const uint32_t*>(ws + w_offset(ra, h) + 4 * c), sa, wa);
            decode_fp4x8(*reinterpret_cast<const uint32_t*>(ws + w_offset(rb, h) + 4 * c), sb, wb);
#pragma unroll
            for (int j = 0; j < Cfg::kNTiles; ++j) {
                // Elements 8c..8c+7 of group h of routed row 8j + g.
                const uint4 xv = *reinterpret_cast<const uint4*>(xs + x_offset(8 * j + g, 4 * h + c));
                uint32_t b[4];
                if constexpr (kProj == Proj::mlp1) {  // natural order: pair (i, i + 4)
                    b[0] = __byte_perm(xv.x, xv.z, 0x5410), b[1] = __byte_perm(xv.x, xv.z, 0x7632);
                    b[2] = __byte_perm(xv.y, xv.w, 0x5410), b[3] = __byte_perm(xv.y, xv.w, 0x7632);
                } else {  // u is stored pre-paired
                    b[0] = xv.x, b[1] = xv.y, b[2] = xv.z, b[3] = xv.w;
                }
                mma_bf16(acc[j], wa[0], wb[0], wa[1], wb[1], b[0], b[1]);
                mma_bf16(acc[j], wa[2], wb[2], wa[3], wb[3], b[2], b[3]);
            }
        }
    }
    cp_async_wait<0>();
    if (!warp_active) return;

    // Epilogue. acc[j] = rows (ra, rb) x routed rows 8j + 2c, 8j + 2c + 1.
    const int fa = f0 + ra, fb = f0 + rb;  // global weight rows
    const float bias_a = __bfloat162float(a.bias[size_t(e) * a.n_out + fa]);
    const float bias_b = __bfloat162float(a.bias[size_t(e) * a.n_out + fb]);
    if constexpr (kProj == Proj::mlp1) {
        // Rows 2j (gate) and 2j + 1 (up) of unit j sit in lanes 4 apart: the even lane keeps
        // routed row 2c, the odd lane 2c + 1, after swapping the other half with its partner.
        const bool even = (g & 1) == 0;
        const int d_ff = a.n_out / 2;
        __nv_bfloat16* u = static_cast<__nv_bfloat16*>(a.out);
#pragma unroll
        for (int j = 0; j < Cfg::kNTiles; ++j) {
            const float va0 = acc[j][0] * kUnscale + bias_a, va1 = acc[j][1] * kUnscale + bias_a;
            const float vb0 = acc[j][2] * kUnscale + bias_b, vb1 = acc[j][3] * kUnscale + bias_b;
            const float ra_other = __shfl_xor_sync(0xffffffffu, even ? va1 : va0, 4);
            const float rb_other = __shfl_xor_sync(0xffffffffu, even ? vb1 : vb0, 4);
            const int n = 8 * j + 2 * c + (even ? 0 : 1);
            if (n < n_rows) {
                const float out_a = even ? swiglu(va0, ra_other, a.alpha, a.limit) : swiglu(ra_other, va1, a.alpha, a.limit);
                const float out_b = even ? swiglu(vb0, rb_other, a.alpha, a.limit) : swiglu(rb_other, vb1, a.alpha, a.limit);
                __nv_bfloat16* row = u + size_t(row0 + n) * d_ff;
                row[moe_u_column(fa >> 1)] = __float2bfloat16_rn(out_a);
                row[moe_u_column(fb >> 1)] = __float2bfloat16_rn(out_b);
            }
        }
    } else {
        float* y = static_cast<float*>(a.out);
#pragma unroll
        for (int j = 0; j < Cfg::kNTiles; ++j) {
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const int n = 8 * j + 2 * c + k;
                if (n < n_rows) {
                    float* row = y + size_t(s_rows[n]) * a.n_out;
                    row[fa] = acc[j][k] * kUnscale + bias_a;
                    row[fb] = acc[j][2 + k] * kUnscale + bias_b;
                }
            }
        }
    }
}

template <class Cfg, Proj kProj>
void launch(const KernelArgs& a, int n_routed, cudaStream_t stream) {
    const size_t smem = size_t(Cfg::kStages) * Cfg::kStageBytes + size_t(Cfg::kBM) * a.n_groups;
    auto kernel = moe_mlp_mxfp4_kernel<Cfg, kProj>;
    static const size_t smem_limit = [&] {
        int max_optin = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        max_optin - int(sizeof(int32_t) * Cfg::kBN) - 64));
        return size_t(max_optin - int(sizeof(int32_t) * Cfg::kBN) - 64);
    }();
    OSPREY_CHECK(smem <= smem_limit, "moe mlp: n_in = ", a.n_in, " needs ", smem, " bytes of shared memory");
    // Upper bound of the number of token tiles: Σ_e ceil(rows_e / kBN) <= rows / kBN + active experts.
    const int max_tiles = (n_routed + Cfg::kBN - 1) / Cfg::kBN + std::min(a.n_experts, n_routed);
    const dim3 grid(max_tiles, (a.n_out + Cfg::kBM - 1) / Cfg::kBM);
    kernel<<<grid, Cfg::kThreads, smem, stream>>>(a);
    CUDA_CHECK(cudaGetLastError());
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void check_common(const char* what, const Mxfp4Experts& w, const int32_t* offsets, const int32_t* sorted_rows,
                  int n_tokens, int n_experts, int top_k, int n_in, int n_out) {
    OSPREY_CHECK(n_tokens >= 0 && int64_t(n_tokens) * top_k < (int64_t(1) << 30), what, ": n_tokens = ", n_tokens);
    OSPREY_CHECK(n_experts > 0 && top_k > 0 && top_k <= n_experts, what, ": n_experts = ", n_experts,
                 ", top_k = ", top_k);
    OSPREY_CHECK(n_in > 0 && n_in % kBK == 0, what, ": input width ", n_in, " must be a positive multiple of ", kBK);
    OSPREY_CHECK(n_out > 0 && n_out % 16 == 0, what, ": output width ", n_out, " must be a positive multiple of 16");
    OSPREY_CHECK(w.blocks && w.scales && w.bias && offsets && sorted_rows, what, ": null pointer");
    OSPREY_CHECK(aligned16(w.blocks) && aligned16(w.scales), what, ": weight blocks and scales must be 16-byte aligned");
}

}  // namespace

MoeKernel moe_choose_kernel(int n_tokens, int top_k, int n_experts) {
    return int64_t(n_tokens) * top_k <= int64_t(kMoeGemvMaxRowsPerExpert) * n_experts ? MoeKernel::gemv
                                                                                        : MoeKernel::gemm;
}

void moe_mlp1(const MoeMlp1Args& a, cudaStream_t stream) {
    check_common("moe_mlp1", a.w, a.expert_offsets, a.sorted_rows, a.n_tokens, a.n_experts, a.top_k, a.d_model,
                 2 * a.d_ff);
    if (a.n_tokens == 0) return;
    OSPREY_CHECK(a.u && a.x && aligned16(a.x), "moe_mlp1: u and x must be set, x 16-byte aligned");
    const KernelArgs k{a.w.blocks, a.w.scales, reinterpret_cast<const __nv_bfloat16*>(a.w.bias),
                       reinterpret_cast<const __nv_bfloat16*>(a.x), a.u, a.expert_offsets, a.sorted_rows,
                       a.n_experts, a.top_k, a.d_model, 2 * a.d_ff, a.d_model / 32, a.swiglu_alpha, a.swiglu_limit};
    const MoeKernel kind = a.kernel == MoeKernel::automatic ? moe_choose_kernel(a.n_tokens, a.top_k, a.n_experts) : a.kernel;
    const int n_routed = a.n_tokens * a.top_k;
    if (kind == MoeKernel::gemv) {
        launch<GemvConfig, Proj::mlp1>(k, n_routed, stream);
    } else {
        launch<GemmConfig, Proj::mlp1>(k, n_routed, stream);
    }
}

void moe_mlp2(const MoeMlp2Args& a, cudaStream_t stream) {
    check_common("moe_mlp2", a.w, a.expert_offsets, a.sorted_rows, a.n_tokens, a.n_experts, a.top_k, a.d_ff,
                 a.d_model);
    if (a.n_tokens == 0) return;
    OSPREY_CHECK(a.y && a.u && aligned16(a.u), "moe_mlp2: y and u must be set, u 16-byte aligned");
    const KernelArgs k{a.w.blocks, a.w.scales, reinterpret_cast<const __nv_bfloat16*>(a.w.bias),
                       reinterpret_cast<const __nv_bfloat16*>(a.u), a.y, a.expert_offsets, a.sorted_rows,
                       a.n_experts, a.top_k, a.d_ff, a.d_model, a.d_ff / 32, 0.0f, 0.0f};
    const MoeKernel kind = a.kernel == MoeKernel::automatic ? moe_choose_kernel(a.n_tokens, a.top_k, a.n_experts) : a.kernel;
    const int n_routed = a.n_tokens * a.top_k;
    if (kind == MoeKernel::gemv) {
        launch<GemvConfig, Proj::mlp2>(k, n_routed, stream);
    } else {
        launch<GemmConfig, Proj::mlp2>(k, n_routed, stream);
    }
}

}  // namespace osprey::cuda
