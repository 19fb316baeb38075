// cuBLASLt linears (kernels/cuda/linear.h) at gpt-oss's shapes: qkv [5120, 2880], out [2880, 4096]
// (+ residual), router [32|128, 2880], unembedding [201088, 2880] to f32; decode (1, 8, 64 tokens)
// and prefill (1024, 8192). Weights rotate over copies totalling > 4x the L2, so decode numbers are
// HBM-bound figures, not cache hits. Both paths are printed for T = 1, 2, 4, 8 (line labels unchanged:
// docs/performance.md quotes them), then the GEMV at each rows-per-CTA choice (LinearArgs::gemv_rows)
// for T = 1 and 8, to check the automatic one.
// Bandwidth percentages here are of 4.64 TB/s, the H200's measured read-only ceiling (the shared
// bench::kPeakGBps is 4.3 TB/s, a copy rate, which put the unembedding GEMV above 100%).
#include <cstdio>
#include <string>

#include "bench/cuda_bench_util.h"
#include "kernels/cuda/linear.h"

using namespace osprey;

namespace {

constexpr double kReadGBps = 4640.0;  // H200 read-only HBM ceiling (measured)

void report(const char* what, double us, double bytes, double flops) {
    const double gbps = bytes / (us * 1e3), tflops = flops / (us * 1e6);
    std::printf("%-48s %10.2f us %9.1f GB/s (%5.1f%%) %8.2f TFLOP/s (%5.1f%%)\n", what, us, gbps,
                100.0 * gbps / kReadGBps, tflops, 100.0 * tflops / bench::kPeakTflops);
}

}  // namespace

int main() {
    struct Shape {
        const char* name;
        int n, k;
        bool f32, acc, bias;
    };
    const Shape shapes[] = {{"qkv", 5120, 2880, false, false, true},  {"out+resid", 2880, 4096, true, true, true},
                            {"router20b", 32, 2880, true, false, true}, {"router120b", 128, 2880, true, false, true},
                            {"unembed", 201088, 2880, true, false, false}};
    cuda::Blas blas;
    for (const Shape& s : shapes) {
        const size_t w_elems = size_t(s.n) * s.k;
        const int copies = std::max<int>(1, int((size_t(256) << 20) / (w_elems * 2)) + 1);
        cuda::DeviceBuffer<bf16> w(w_elems * copies), x(size_t(8192) * s.k);
        cuda::DeviceBuffer<float> b(s.n);  // bias type follows the output type (bf16 uses its first half)
        w.fill_bytes(0x3c), x.fill_bytes(0x3c), b.fill_bytes(0);
        for (int t : {1, 2, 4, 8, 64, 1024, 8192}) {
            if (s.n == 201088 && t > 64) continue;  // logits are only computed for the last tokens
            cuda::DeviceBuffer<uint8_t> y(size_t(t) * s.n * (s.f32 ? 4 : 2));
            y.fill_bytes(0);
            const double bytes = 2.0 * w_elems + 2.0 * t * s.k + double(t) * s.n * (s.f32 ? 4 : 2) * (s.acc ? 2 : 1);
            auto time = [&](cuda::LinearPath path, int gemv_rows) {
                return bench::time_us([&](int i) {
                    blas.linear({.y = y.get(), .x = x.get(), .w = w.get() + (i % copies) * w_elems,
                                 .bias = s.bias ? b.get() : nullptr, .n_tokens = t, .n_out = s.n, .n_in = s.k,
                                 .y_f32 = s.f32, .accumulate = s.acc, .path = path, .gemv_rows = gemv_rows},
                                nullptr);
                });
            };
            for (const cuda::LinearPath path : {cuda::LinearPath::blas, cuda::LinearPath::gemv}) {
                if (path == cuda::LinearPath::gemv && t > cuda::kGemvMaxTokens) continue;
                const std::string what = std::string("linear ") + s.name + " T=" + std::to_string(t) +
                                         (path == cuda::LinearPath::gemv ? " gemv" : " cublasLt");
                report(what.c_str(), time(path, 0), bytes, 2.0 * t * double(w_elems));
            }
            if (t != 1 && t != cuda::kGemvMaxTokens) continue;
            for (const int rows : {8, 16, 32}) {
                const std::string what = std::string("linear ") + s.name + " T=" + std::to_string(t) +
                                         " gemv rows=" + std::to_string(rows);
                report(what.c_str(), time(cuda::LinearPath::gemv, rows), bytes, 2.0 * t * double(w_elems));
            }
        }
    }
    return 0;
}
