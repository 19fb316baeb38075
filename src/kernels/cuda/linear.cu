// cuBLASLt plans for the dense linears. Row-major y[T, N] = x[T, K]·Wᵀ is computed as the
// column-major product yᵀ[N, T] = op(W)[N, K] · xᵀ[K, T] with op = transpose on the row-major W
// (which cuBLASLt sees as a column-major [K, N] matrix), so both operands are read as stored.
#include "kernels/cuda/linear.h"

#include <cublasLt.h>

#include <memory>

#include <cuda_bf16.h>

#include "core/log.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"

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

// GEMV for few tokens: one warp per output feature n streams W's row once (16-byte loads, four in
// flight per lane) and dots it with the kT token rows of x (read through L1: x is tiny); FP32
// accumulation, a warp reduction, then bias / residual / rounding in the epilogue.
// (Row n's loads are all issued before the first use: decode GEMVs are latency-bound otherwise.)
constexpr int kGemvWarps = 8;
constexpr int kGemvUnroll = 12;  // 16-byte loads in flight per lane: a whole 2880-wide row in one round

template <int kT, bool kF32>
__global__ void __launch_bounds__(kGemvWarps * kWarpSize) gemv_kernel(const LinearArgs a, int ldx, int ldy) {
    const int lane = threadIdx.x % kWarpSize;
    const int n = blockIdx.x * kGemvWarps + threadIdx.x / kWarpSize;
    if (n >= a.n_out) return;
    const uint4* w = reinterpret_cast<const uint4*>(a.w + size_t(n) * a.n_in);
    const int n_vec = a.n_in / 8;
    float acc[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) acc[t] = 0.f;
    for (int base = lane; base < n_vec; base += kWarpSize * kGemvUnroll) {
        uint4 wv[kGemvUnroll];
#pragma unroll
        for (int u = 0; u < kGemvUnroll; ++u) {
            const int v = base + u * kWarpSize;
            wv[u] = v < n_vec ? __ldcs(w + v) : make_uint4(0, 0, 0, 0);  // streamed once: evict first
        }
#pragma unroll
        for (int u = 0; u < kGemvUnroll; ++u) {
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
            float v = acc[t] + (a.bias ? static_cast<const float*>(a.bias)[n] : 0.f);
            float* y = static_cast<float*>(a.y) + size_t(t) * ldy + n;
            *y = a.accumulate ? *y + v : v;
        } else {
            const float b = a.bias ? __bfloat162float(static_cast<const __nv_bfloat16*>(a.bias)[n]) : 0.f;
            static_cast<__nv_bfloat16*>(a.y)[size_t(t) * ldy + n] = __float2bfloat16_rn(acc[t] + b);
        }
    }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

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
    OSPREY_CHECK(a.x && a.w && a.y, "linear: null pointer");
    OSPREY_CHECK(!a.accumulate || a.y_f32, "linear: accumulating into a bf16 output is not supported (f32 only)");
    OSPREY_CHECK((a.ldx == 0 || a.ldx >= a.n_in) && (a.ldy == 0 || a.ldy >= a.n_out),
                 "linear: row stride smaller than the row (ldx ", a.ldx, ", ldy ", a.ldy, ")");
    const int ldx = a.ldx ? a.ldx : a.n_in, ldy = a.ldy ? a.ldy : a.n_out;
    const bool gemv_ok = a.n_tokens <= kGemvMaxTokens && a.n_in % 8 == 0 && ldx % 8 == 0 && aligned16(a.x) &&
                         aligned16(a.w);
    OSPREY_CHECK(a.path != LinearPath::gemv || gemv_ok, "linear: the GEMV path needs <= ", kGemvMaxTokens,
                 " tokens, K and ldx multiples of 8 and 16-byte aligned x, W (T=", a.n_tokens, ", K=", a.n_in, ")");
    if (a.path == LinearPath::gemv || (a.path == LinearPath::automatic && gemv_ok && a.n_tokens <= kGemvAutoTokens)) {
        const dim3 grid((a.n_out + kGemvWarps - 1) / kGemvWarps);
        const int t_case = a.n_tokens <= 1 ? 1 : a.n_tokens <= 2 ? 2 : a.n_tokens <= 4 ? 4 : 8;
        dispatch_int<1, 2, 4, 8>("gemv tokens", t_case, [&]<int kT>() {
            dispatch_bool(a.y_f32, [&]<bool kF32>() {
                gemv_kernel<kT, kF32><<<grid, kGemvWarps * kWarpSize, 0, stream>>>(a, ldx, ldy);
            });
        });
        CUDA_CHECK(cudaGetLastError());
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
