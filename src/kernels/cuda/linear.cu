// cuBLASLt plans for the dense linears. Row-major y[T, N] = x[T, K]·Wᵀ is computed as the
// column-major product yᵀ[N, T] = op(W)[N, K] · xᵀ[K, T] with op = transpose on the row-major W
// (which cuBLASLt sees as a column-major [K, N] matrix), so both operands are read as stored.
#include "kernels/cuda/linear.h"

#include <cublasLt.h>

#include <algorithm>
#include <memory>

#include <cuda_bf16.h>

#include "core/log.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/rmsnorm_row.cuh"

#define CUBLAS_CHECK(expr)                                                                          \
    do {                                                                                            \
        const cublasStatus_t osprey_blas_st_ = (expr);                                              \
        if (osprey_blas_st_ != CUBLAS_STATUS_SUCCESS) {                                             \
            std::fprintf(stderr, "cuBLASLt error %s (%d) in `%s` at %s:%d\n",                       \
                         cublasLtGetStatusName(osprey_blas_st_), int(osprey_blas_st_), #expr, __FILE__, \
                         __LINE__);                                                                 \
            std::abort();                                                                           \
        }                                                                                           \
    } while (0)

namespace osprey::cuda {

namespace {

// GEMV for decode-sized batches (T <= kGemvMaxTokens) on the tensor cores. A memory-bound kernel:
// the weight is streamed from HBM exactly once per call whatever T is, x is tiny.
//
// mma.sync m16n8k16 with the roles of a decode GEMV: B (16 k x 8 n) = 8 weight rows, A (16 m x 16 k)
// = x with tokens as rows m (rows 8..15 stay zero, so T = 1..8 all cost the same), C = y[token][row].
// The sum over k does not care how k is ordered as long as A and B agree, so a lane's fragment
// slots are filled straight from one 16-byte load of 8 consecutive k: lane (g = lane / 4,
// q = lane % 4) loads W[row g][32c + 8q .. + 8) of a 32-wide chunk c; elements 0-3 go to the k slots
// {2q, 2q+1, 2q+8, 2q+9} of the first mma and 4-7 to those of the second. x uses the same map from
// a 16-byte shared-memory load of x[token g][32c + 8q .. + 8]. No conversions, no shuffles.
//
// CTA = 8 warps on kRows = 8 kTiles rows; the warps split K (each takes kUnroll adjacent chunks per
// round, i.e. 64 kUnroll contiguous bytes of each row) and keep kTiles x kUnroll = 8 16-byte loads per
// lane in flight, double-buffered in registers across rounds and across row blocks: up to 8 KB per
// warp. x is staged once per CTA into shared memory (bf16, rows padded so that the fragment loads
// are conflict-free) while the first weight loads are already in flight. Per row block the 8 warps'
// partial tiles are summed through shared memory in a fixed order (deterministic), then bias,
// residual and rounding. The grid is persistent (at most 2 CTAs per SM, grid-stride over row blocks)
// so the large unembedding keeps its prefetch running across row blocks.
constexpr int kGemvWarps = 8;
constexpr int kGemvThreads = kGemvWarps * kWarpSize;
constexpr int kGemvLoads = 8;      // 16-byte weight loads per lane per round (x2: double-buffered)
constexpr int kGemvChunk = 32;     // k per lane group of 4 per round: 4 lanes x 8 bf16
constexpr int kGemvCtasPerSm = 2;  // __launch_bounds__ below; the persistent grid's size

struct GemvParams {
    void* y;           // [T, ldy] bf16 or f32
    const bf16* x;     // [T, ldx]
    const bf16* w;     // [N, K]
    const void* bias;  // [N] bf16 (bf16 y) or f32 (f32 y), or null
    int n_tokens, n_out, n_in, ldx, ldy;
    int xs_ld;  // row stride of x in shared memory (elements): xs_ld % 64 == 32
    bool accumulate;
    GemvNorm norm;            // kNorm: x = this norm of the residual, computed in every CTA
    const float* acc_moe_y;   // accumulate: the MoE slots added to y first (linear.h), or null
    const float* acc_moe_w;
};

// Row stride of the staged x: K rounded up to 64 elements plus 32, so that rows g and g + 1 of one
// 8-lane phase of a 16-byte shared load fall into different halves of the 32 banks.
constexpr int gemv_xs_ld(int k) {
    return (k + 63) / 64 * 64 + 32;
}
__host__ __device__ constexpr size_t gemv_red_bytes(int tiles) {
    return size_t(kGemvWarps) * tiles * 64 * sizeof(float);
}
size_t gemv_smem_bytes(int tiles, int t, int k) {
    return gemv_red_bytes(tiles) + size_t(t) * gemv_xs_ld(k) * sizeof(bf16);
}

template <int kTiles, bool kF32, bool kNorm>
__global__ void __launch_bounds__(kGemvThreads, kGemvCtasPerSm) gemv_kernel(const GemvParams p) {
    constexpr int kUnroll = kGemvLoads / kTiles;  // adjacent chunks per warp and round
    constexpr int kRows = 8 * kTiles;             // output rows per row block
    static_assert(kGemvLoads % kTiles == 0 && kTiles * 64 <= kGemvThreads);
    extern __shared__ __align__(16) unsigned char smem[];
    float* red = reinterpret_cast<float*>(smem);                        // [warps][kTiles][8 tokens][8 rows]
    bf16* xs = reinterpret_cast<bf16*>(smem + gemv_red_bytes(kTiles));  // [T][xs_ld]

    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const int g = lane / 4, q = lane % 4;  // fragment coordinates: weight row / token g, k group q
    const int K = p.n_in, N = p.n_out;
    const int n_chunks = (K + kGemvChunk - 1) / kGemvChunk;
    const int per_round = kGemvWarps * kUnroll;  // chunks a CTA covers per round
    const int n_rounds = (n_chunks + per_round - 1) / per_round;
    const int n_blocks = (N + kRows - 1) / kRows;
    // Row blocks blockIdx.x, + gridDim.x, ...; every warp runs the same number of steps (rounds of
    // every block), so the __syncthreads below are reached uniformly.
    const int my_blocks = int(blockIdx.x) < n_blocks ? (n_blocks - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
    const int n_steps = my_blocks * n_rounds;
    if (n_steps == 0) {
        pdl_enter();  // launch.cuh: every block waits before it exits
        return;
    }

    // Weight fragments of one step; zeros past K or N (the matching x fragment is zero past K too).
    auto load_step = [&](int step, uint4(&wv)[kUnroll][kTiles]) {
        const int block = int(blockIdx.x) + step / n_rounds * int(gridDim.x);
        const int round = step % n_rounds;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int k = ((round * kGemvWarps + warp) * kUnroll + u) * kGemvChunk + 8 * q;
#pragma unroll
            for (int r = 0; r < kTiles; ++r) {
                const int row = block * kRows + 8 * r + g;
                wv[u][r] = k < K && row < N
                               ? __ldcs(reinterpret_cast<const uint4*>(p.w + size_t(row) * K + k))  // streamed once
                               : make_uint4(0, 0, 0, 0);
            }
        }
    };

    uint4 cur[kUnroll][kTiles];
    load_step(0, cur);  // in flight while x is staged
    // The weights are constant, so their first loads go out before the wait: when the previous kernel
    // triggered early (rmsnorm does), they overlap its tail. x and y belong to the kernels before.
    pdl_enter();

    const int vecs_per_row = K / 8;
    if constexpr (kNorm) {
        // xs[t] = rmsnorm(res[t] + MoE slots) · gain, bit-identical to the rmsnorm kernel's rows.
        for (int t = 0; t < p.n_tokens; ++t) {
            if (t > 0) __syncthreads();  // rmsnorm_row's reduction scratch is reused
            const size_t r = size_t(t) * K;
            rmsnorm_row<kGemvThreads>(p.norm.res + r, nullptr, p.norm.moe_y ? p.norm.moe_y + 4 * r : nullptr,
                                      p.norm.moe_w ? p.norm.moe_w + 4 * t : nullptr, nullptr, p.norm.gain, K,
                                      p.norm.eps, reinterpret_cast<__nv_bfloat162*>(xs + size_t(t) * p.xs_ld));
        }
        __syncthreads();
        if (blockIdx.x == 0 && p.norm.h)  // the normed rows for later kernels
            for (int v = threadIdx.x; v < p.n_tokens * vecs_per_row; v += kGemvThreads) {
                const int t = v / vecs_per_row, j = v % vecs_per_row;
                *reinterpret_cast<uint4*>(p.norm.h + size_t(t) * K + 8 * j) =
                    *reinterpret_cast<const uint4*>(xs + size_t(t) * p.xs_ld + 8 * j);
            }
    } else {
        // x[T, K] -> xs[T, xs_ld], 16 bytes per thread and step (K, ldx multiples of 8; x 16-byte aligned).
        for (int v = threadIdx.x; v < p.n_tokens * vecs_per_row; v += kGemvThreads) {
            const int t = v / vecs_per_row, j = v % vecs_per_row;
            *reinterpret_cast<uint4*>(xs + size_t(t) * p.xs_ld + 8 * j) =
                __ldg(reinterpret_cast<const uint4*>(p.x + size_t(t) * p.ldx + 8 * j));
        }
        __syncthreads();
    }

    float acc[kTiles][4];
#pragma unroll
    for (int r = 0; r < kTiles; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.f;

    for (int step = 0; step < n_steps; ++step) {
        uint4 next[kUnroll][kTiles];
        if (step + 1 < n_steps) {
            load_step(step + 1, next);  // issued before this step's fragments are used
        } else {
#pragma unroll
            for (int u = 0; u < kUnroll; ++u)
#pragma unroll
                for (int r = 0; r < kTiles; ++r) next[u][r] = make_uint4(0, 0, 0, 0);
        }

        const int round = step % n_rounds;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int k = ((round * kGemvWarps + warp) * kUnroll + u) * kGemvChunk + 8 * q;
            const uint4 xv = g < p.n_tokens && k < K ? *reinterpret_cast<const uint4*>(xs + size_t(g) * p.xs_ld + k)
                                                     : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int r = 0; r < kTiles; ++r) {
                // A rows g + 8 (tokens 8..15) are zero; B = the weight row's k slots of this lane.
                mma_bf16(acc[r], xv.x, 0u, xv.y, 0u, cur[u][r].x, cur[u][r].y);
                mma_bf16(acc[r], xv.z, 0u, xv.w, 0u, cur[u][r].z, cur[u][r].w);
            }
        }

        if (round == n_rounds - 1) {
            // End of a row block: lane (g, q) holds y[token g][rows 8r + 2q, 2q + 1] of its K share.
#pragma unroll
            for (int r = 0; r < kTiles; ++r) {
                *reinterpret_cast<float2*>(red + ((warp * kTiles + r) * 8 + g) * 8 + 2 * q) =
                    make_float2(acc[r][0], acc[r][1]);
                acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.f;
            }
            __syncthreads();
            if (threadIdx.x < kTiles * 64) {
                const int r = threadIdx.x / 64, t = threadIdx.x / 8 % 8, j = threadIdx.x % 8;
                const int block = int(blockIdx.x) + step / n_rounds * int(gridDim.x);
                const int row = block * kRows + 8 * r + j;
                if (t < p.n_tokens && row < N) {
                    float v = 0.f;
#pragma unroll
                    for (int w = 0; w < kGemvWarps; ++w) v += red[((w * kTiles + r) * 8 + t) * 8 + j];  // fixed order
                    if constexpr (kF32) {
                        if (p.bias) v += static_cast<const float*>(p.bias)[row];
                        float* y = static_cast<float*>(p.y) + size_t(t) * p.ldy + row;
                        if (p.accumulate) {
                            float base = *y;
                            if (p.acc_moe_y) {  // the previous block's MoE residual add, in rmsnorm's order
                                float dv = 0.f;
#pragma unroll
                                for (int k = 0; k < 4; ++k)
                                    dv += __ldcg(p.acc_moe_w + 4 * t + k) *
                                          __ldcg(p.acc_moe_y + (size_t(t) * 4 + k) * N + row);
                                base += dv;
                            }
                            *y = base + v;
                        } else {
                            *y = v;
                        }
                    } else {
                        if (p.bias) v += __bfloat162float(static_cast<const __nv_bfloat16*>(p.bias)[row]);
                        static_cast<__nv_bfloat16*>(p.y)[size_t(t) * p.ldy + row] = __float2bfloat16_rn(v);
                    }
                }
            }
            __syncthreads();  // red is rewritten by the next row block
        }

#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
            for (int r = 0; r < kTiles; ++r) cur[u][r] = next[u][r];
    }
}

bool aligned16(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// Rows per CTA: the most (fewest x copies into shared memory, x traffic = T / rows of the weight's)
// that still gives every SM a CTA; small N (the routers) takes 8 rows per CTA, K split over 8 warps.
int gemv_rows_auto(int n_out) {
    for (const int rows : {32, 16})
        if ((n_out + rows - 1) / rows >= sm_count()) return rows;
    return 8;
}

// Dynamic shared memory a block may opt in to (227 KB on the H200).
int smem_optin() {
    static const int v = [] {
        int device = 0, bytes = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        return bytes;
    }();
    return v;
}

// x of T tokens fits in shared memory with the largest row block (T = 8: K up to ~13k).
bool gemv_fits(int n_tokens, int n_in) {
    return gemv_smem_bytes(4, n_tokens, n_in) + 256 <= size_t(smem_optin());  // + the norm's static scratch
}

void gemv(const LinearArgs& a, int ldx, int ldy, cudaStream_t stream) {
    const int rows = a.gemv_rows ? a.gemv_rows : gemv_rows_auto(a.n_out);
    OSPREY_CHECK(rows == 8 || rows == 16 || rows == 32, "linear: GEMV rows per CTA must be 8, 16 or 32, got ",
                 a.gemv_rows);
    const int tiles = rows / 8;
    const size_t smem = gemv_smem_bytes(tiles, a.n_tokens, a.n_in);
    const GemvParams p{.y = a.y,
                       .x = a.x,
                       .w = a.w,
                       .bias = a.bias,
                       .n_tokens = a.n_tokens,
                       .n_out = a.n_out,
                       .n_in = a.n_in,
                       .ldx = ldx,
                       .ldy = ldy,
                       .xs_ld = gemv_xs_ld(a.n_in),
                       .accumulate = a.accumulate,
                       .norm = a.norm,
                       .acc_moe_y = a.acc_moe_y,
                       .acc_moe_w = a.acc_moe_w};
    const int n_blocks = (a.n_out + rows - 1) / rows;
    const int grid = std::min(n_blocks, kGemvCtasPerSm * sm_count());
    dispatch_int<1, 2, 4>("gemv tiles", tiles, [&]<int kTiles>() {
        dispatch_bool(a.y_f32, [&]<bool kF32>() {
            dispatch_bool(a.norm.res != nullptr, [&]<bool kNorm>() {
                cuda::launch(gemv_kernel<kTiles, kF32, kNorm>, grid, kGemvThreads, smem, stream, p);
            });
        });
    });
    CUDA_CHECK(cudaGetLastError());
}

// gemv_wide (linear.h): one warp per output feature n streams W's row once (16-byte loads, twelve in
// flight per lane: a whole 2880-wide row in one round) and dots it with the kT token rows of x (read
// through L1: x is tiny); FP32 accumulation, a warp reduction, then bias / residual / rounding.
constexpr int kWideWarps = 8;
constexpr int kWideUnroll = 12;

template <int kT, bool kF32>
__global__ void __launch_bounds__(kWideWarps * kWarpSize) gemv_wide_kernel(const LinearArgs a, int ldx, int ldy) {
    pdl_enter();  // launch.cuh: before any early return or global access
    const int lane = threadIdx.x % kWarpSize;
    const int n = blockIdx.x * kWideWarps + threadIdx.x / kWarpSize;
    if (n >= a.n_out) return;
    const uint4* w = reinterpret_cast<const uint4*>(a.w + size_t(n) * a.n_in);
    const int n_vec = a.n_in / 8;
    float acc[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) acc[t] = 0.f;
    for (int base = lane; base < n_vec; base += kWarpSize * kWideUnroll) {
        uint4 wv[kWideUnroll];
#pragma unroll
        for (int u = 0; u < kWideUnroll; ++u) {
            const int v = base + u * kWarpSize;
            wv[u] = v < n_vec ? __ldcs(w + v) : make_uint4(0, 0, 0, 0);  // streamed once: evict first
        }
#pragma unroll
        for (int u = 0; u < kWideUnroll; ++u) {
            const int v = base + u * kWarpSize;
            if (v >= n_vec) break;
            float wf[8];
            bf16x8_to_float(wv[u], wf);
#pragma unroll
            for (int t = 0; t < kT; ++t) {
                if (t >= a.n_tokens) break;
                float xf[8];
                bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(a.x + size_t(t) * ldx) + v), xf);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[t] = fmaf(wf[e], xf[e], acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < kT; ++t) acc[t] = warp_reduce_sum(acc[t]);
    if (lane != 0) return;
    for (int t = 0; t < a.n_tokens; ++t) {
        if constexpr (kF32) {
            const float v = acc[t] + (a.bias ? static_cast<const float*>(a.bias)[n] : 0.f);
            float* y = static_cast<float*>(a.y) + size_t(t) * ldy + n;
            *y = a.accumulate ? *y + v : v;
        } else {
            const float b = a.bias ? __bfloat162float(static_cast<const __nv_bfloat16*>(a.bias)[n]) : 0.f;
            static_cast<__nv_bfloat16*>(a.y)[size_t(t) * ldy + n] = __float2bfloat16_rn(acc[t] + b);
        }
    }
}

void gemv_wide(const LinearArgs& a, int ldx, int ldy, cudaStream_t stream) {
    const dim3 grid((a.n_out + kWideWarps - 1) / kWideWarps);
    const int t_case = a.n_tokens <= 1 ? 1 : a.n_tokens <= 2 ? 2 : a.n_tokens <= 4 ? 4 : 8;
    dispatch_int<1, 2, 4, 8>("gemv tokens", t_case, [&]<int kT>() {
        dispatch_bool(a.y_f32, [&]<bool kF32>() {
            cuda::launch(gemv_wide_kernel<kT, kF32>, grid, kWideWarps * kWarpSize, 0, stream, a, ldx, ldy);
        });
    });
    CUDA_CHECK(cudaGetLastError());
}

// Opts every GEMV instance in to all the dynamic shared memory a block may have (x of 8 tokens at
// K = 4096 is 66 KB). Done by Blas's constructor, before any graph capture (not a stream operation).
void gemv_configure() {
    const int smem_limit = smem_optin();
    for (auto kernel : {gemv_kernel<1, false, false>, gemv_kernel<1, true, false>, gemv_kernel<2, false, false>,
                        gemv_kernel<2, true, false>, gemv_kernel<4, false, false>, gemv_kernel<4, true, false>,
                        gemv_kernel<1, false, true>, gemv_kernel<1, true, true>, gemv_kernel<2, false, true>,
                        gemv_kernel<2, true, true>, gemv_kernel<4, false, true>, gemv_kernel<4, true, true>}) {
        cudaFuncAttributes attr{};  // the norm prologue's reduction scratch is static shared memory
        CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        smem_limit - int(attr.sharedSizeBytes)));
    }
}

}  // namespace

bool gemv_norm_supported(int n_tokens, int n_in) {
    return n_tokens >= 1 && n_tokens <= kGemvMaxTokens && n_in % 8 == 0 && n_in <= kRmsNormMaxChannels &&
           gemv_fits(n_tokens, n_in);
}

struct Blas::Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    ~Plan() {
        if (op) cublasLtMatmulDescDestroy(op);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (c) cublasLtMatrixLayoutDestroy(c);
    }
};

Blas::Blas(size_t workspace_bytes) : workspace_(workspace_bytes) {
    gemv_configure();
    cublasLtHandle_t h = nullptr;
    CUBLAS_CHECK(cublasLtCreate(&h));
    handle_ = h;
}

Blas::~Blas() {
    for (auto& [key, plan] : plans_) delete plan;
    if (handle_) cublasLtDestroy(handle_);
}

Blas::Plan& Blas::plan_for(const LinearArgs& a) {
    const int ldx = a.ldx ? a.ldx : a.n_in;
    const int ldy = a.ldy ? a.ldy : a.n_out;
    const Key key{a.n_tokens, a.n_out, a.n_in, ldx, ldy, a.y_f32, a.bias != nullptr, a.accumulate};
    if (auto it = plans_.find(key); it != plans_.end()) return *it->second;

    auto plan = std::make_unique<Plan>();
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof no_trans));
    if (a.bias) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        const cudaDataType_t bias_type = a.y_f32 ? CUDA_R_32F : CUDA_R_16BF;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                    sizeof bias_type));
    }
    const cudaDataType_t out_type = a.y_f32 ? CUDA_R_32F : CUDA_R_16BF;
    // A = W as column-major [K, N] (ld K), B = x as column-major [K, T] (ld ldx), C = D = y [N, T].
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, a.n_in, a.n_out, a.n_in));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, a.n_in, a.n_tokens, ldx));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, out_type, a.n_out, a.n_tokens, ldy));

    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = workspace_.bytes();
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t result{};
    int n_results = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, plan->op, plan->a, plan->b, plan->c, plan->c,
                                                             pref, 1, &result, &n_results);
    cublasLtMatmulPreferenceDestroy(pref);
    OSPREY_CHECK(st == CUBLAS_STATUS_SUCCESS && n_results > 0, "cuBLASLt has no algorithm for linear T=",
                 a.n_tokens, " N=", a.n_out, " K=", a.n_in, " (status ", cublasLtGetStatusName(st), ")");
    plan->algo = result.algo;
    log::debug("cublasLt plan T=", a.n_tokens, " N=", a.n_out, " K=", a.n_in, " f32=", a.y_f32,
               " bias=", a.bias != nullptr, " acc=", a.accumulate);
    Plan* raw = plan.release();
    plans_.emplace(key, raw);
    return *raw;
}

void Blas::linear(const LinearArgs& a, cudaStream_t stream) {
    OSPREY_CHECK(a.n_tokens > 0 && a.n_out > 0 && a.n_in > 0, "linear: empty shape T=", a.n_tokens, " N=", a.n_out,
                 " K=", a.n_in);
    const bool fused = a.norm.res != nullptr || a.acc_moe_y != nullptr;
    OSPREY_CHECK((a.x || a.norm.res) && a.w && a.y, "linear: null pointer");
    OSPREY_CHECK(!a.norm.res || (!a.x && a.norm.gain && (!a.norm.moe_y || a.norm.moe_w) &&
                                 a.n_in <= kRmsNormMaxChannels && a.n_in % 8 == 0),
                 "linear: the norm prologue takes no x, needs the gain (and moe_w with moe_y) and K a multiple of 8 up "
                 "to ", kRmsNormMaxChannels, " (K=", a.n_in, ")");
    OSPREY_CHECK(!a.acc_moe_y || (a.acc_moe_w && a.accumulate && a.y_f32 && (a.ldy == 0 || a.ldy == a.n_out)),
                 "linear: acc_moe_y needs acc_moe_w and a dense accumulating f32 output");
    OSPREY_CHECK(!a.accumulate || a.y_f32, "linear: accumulating into a bf16 output is not supported (f32 only)");
    OSPREY_CHECK((a.ldx == 0 || a.ldx >= a.n_in) && (a.ldy == 0 || a.ldy >= a.n_out),
                 "linear: row stride smaller than the row (ldx ", a.ldx, ", ldy ", a.ldy, ")");
    const int ldx = a.ldx ? a.ldx : a.n_in, ldy = a.ldy ? a.ldy : a.n_out;
    const bool wide_ok = a.n_tokens <= kGemvMaxTokens && a.n_in % 8 == 0 && ldx % 8 == 0 && aligned16(a.x) &&
                         aligned16(a.w);
    const bool gemv_ok = wide_ok && gemv_fits(a.n_tokens, a.n_in);
    if (fused) {  // only the GEMV kernel has the norm prologue and the MoE residual add
        OSPREY_CHECK(gemv_norm_supported(a.n_tokens, a.n_in) && a.path != LinearPath::blas &&
                         a.path != LinearPath::gemv_wide,
                     "linear: the norm prologue and acc_moe_y need the GEMV path (T=", a.n_tokens, ", K=", a.n_in,
                     ")");
        OSPREY_CHECK(aligned16(a.w) && (a.x ? aligned16(a.x) && ldx % 8 == 0 : true) &&
                         (!a.norm.h || aligned16(a.norm.h)) && (!a.norm.res || aligned16(a.norm.res)),
                     "linear: the GEMV path needs 16-byte aligned W, x, h and residual");
        gemv(a, ldx, ldy, stream);
        return;
    }
    OSPREY_CHECK(a.path != LinearPath::gemv_wide || wide_ok, "linear: the wide GEMV path needs <= ", kGemvMaxTokens,
                 " tokens, K and ldx multiples of 8 and 16-byte aligned x, W (T=", a.n_tokens, ", K=", a.n_in, ")");
    if (a.path == LinearPath::gemv_wide ||
        (a.path == LinearPath::automatic && wide_ok && a.n_tokens == 1 && a.n_out >= kGemvWideMinOut)) {
        gemv_wide(a, ldx, ldy, stream);
        return;
    }
    OSPREY_CHECK(a.path != LinearPath::gemv || gemv_ok, "linear: the GEMV path needs <= ", kGemvMaxTokens,
                 " tokens, K and ldx multiples of 8, 16-byte aligned x, W and x in shared memory (T=", a.n_tokens,
                 ", K=", a.n_in, ")");
    if (a.path == LinearPath::gemv || (a.path == LinearPath::automatic && gemv_ok && a.n_tokens <= kGemvAutoTokens)) {
        gemv(a, ldx, ldy, stream);
        return;
    }
    Plan& p = plan_for(a);
    // The bias pointer is set per call (plans are shared by all layers of one shape).
    if (a.bias) {
        const void* bias = a.bias;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    const float alpha = 1.0f, beta = a.accumulate ? 1.0f : 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(handle_, p.op, &alpha, a.w, p.a, a.x, p.b, &beta, a.y, p.c, a.y, p.c, &p.algo,
                                workspace_.get(), workspace_.bytes(), stream));
}

}  // namespace osprey::cuda
