// The common half of the kernel case tables, after ggml's test-backend-ops: every CUDA kernel has ONE
// table of cases (tests/kernels/cases/<kernel>_cases.h: gpt-oss's real shapes, tile edges, ragged
// batches), and one function runs a case in either mode from the same inputs:
//   Mode::check  outputs poisoned with NaN, the kernel run once, every output compared with the CPU
//                reference (kernels/cpu); run by the gtest binary tests/kernels/test_<kernel>.cu (label
//                gpu) and by `bench_<kernel> --check`;
//   Mode::perf   the kernel timed with CUDA events (median after warm-up, inputs rotated where one set
//                would sit in the 60 MB L2), reported in µs, GB/s and TFLOP/s as fractions of the H200
//                ceilings; run by bench/bench_<kernel>.cu.
// Inputs are made on the device by a counter-based generator (any size is fast: a 131k-token KV cache
// as well as a 4-row test), and copied to the host only when checking.
// Nothing here depends on GoogleTest, so the benchmarks build and run without it (gtest_cases.h adapts a
// table to parameterised tests).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <ostream>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "core/bf16.h"
#include "kernels/cuda/runtime.h"

namespace osprey::cases {

enum class Mode { check, perf };

// Which modes run a case. check_only: an edge shape whose timing tells nothing new (or a case kept
// from the tests before the tables); perf_only: too large for the CPU reference; the table says which
// smaller case checks the same shape class.
enum class Use { both, check_only, perf_only };

inline bool runs_in(Use use, Mode mode) {
    return use == Use::both || use == (mode == Mode::check ? Use::check_only : Use::perf_only);
}

// The routing kernels' grid: gpt-oss's expert counts (32, 128) at bench_moe's batch sizes (checked and
// timed), the tests' odd sizes and the tiny model's 8 experts (checked only): add(n_tokens, n_experts, use).
template <class Add>
void for_moe_token_grid(Add&& add) {
    for (int e : {8, 32, 128})
        for (int n : {1, 3, 8, 64, 128, 256, 333, 1024, 2048, 8192}) {
            const bool bench = e != 8 && n != 3 && n != 333 && n != 2048;
            const bool test = n == 1 || n == 3 || n == 8 || n == 64 || n == 333 || n == 2048;
            if (bench || test) add(n, e, bench ? Use::both : Use::check_only);
        }
}

// The H200 ceilings the perf mode compares with (settable from the bench command line).
struct Ceilings {
    double hbm_gbps = 4640.0;      // read-only streaming from HBM3e
    double bf16_tflops = 790.0;    // dense BF16 tensor-core GEMM
    double fp8_tflops = 1470.0;    // dense FP8 tensor-core GEMM
};
inline Ceilings& ceilings() {
    static Ceilings c;
    return c;
}
enum class Math { bf16, fp8 };  // which compute ceiling a case's FLOPs are held against

// One timed figure. bytes: what must move at least (0 when not a bandwidth figure); flops likewise.
struct Timing {
    std::string label;
    double us = 0.0;
    double bytes = 0.0;
    double flops = 0.0;
    Math math = Math::bf16;
    bool wall = false;  // a wall-clock time of a whole host call; printed as "<label>" after the time
};

template <typename... A>
std::string str(const A&... a) {
    std::ostringstream os;
    (os << ... << a);
    return os.str();
}

// What running a case produced: failures (check mode), timings (perf mode), notes for the log.
struct Result {
    uint32_t seed = 0;
    std::vector<std::string> failures;
    std::vector<std::string> notes;
    std::vector<Timing> timings;

    bool ok() const { return failures.empty(); }
    template <typename... A>
    void fail(const A&... a) {
        failures.push_back(str(a...));
    }
    template <typename... A>
    void note(const A&... a) {
        notes.push_back(str(a...));
    }
};

// |got - want| <= tol_max * max|want| + tol_rel * |want| over the listed values; NaN fails.
inline void expect_near_all(Result& r, const std::vector<float>& got, const std::vector<float>& want, double tol_max,
                            double tol_rel, const std::string& what) {
    if (got.size() != want.size()) {
        r.fail(what, ": ", got.size(), " values, expected ", want.size());
        return;
    }
    double max_want = 0.0;
    for (float w : want) max_want = std::max(max_want, double(std::fabs(w)));
    size_t bad = 0, worst_i = 0;
    double worst = -1e300;
    for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::fabs(double(got[i]) - want[i]) - (tol_max * max_want + tol_rel * std::fabs(want[i]));
        if (std::isnan(got[i]) || err > 0) ++bad;
        if (std::isnan(got[i]) || err > worst) worst = std::isnan(got[i]) ? 1e300 : err, worst_i = i;
    }
    if (bad)
        r.fail(what, ": ", bad, " of ", got.size(), " out of tolerance; worst at ", worst_i, " got ", got[worst_i],
               " want ", want[worst_i], " (max |want| ", max_want, ")");
}

// ||got - want|| / ||want|| over the listed values.
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
        num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
        den += double(want[i]) * want[i];
    }
    return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

// A table row with its kernel's run function bound: what the gtest binary and the bench iterate.
struct Entry {
    std::string name;  // unique within its table, [A-Za-z0-9_]: the gtest name, matched by --filter
    Use use = Use::both;
    std::function<Result(Mode)> run;
};
inline void PrintTo(const Entry& e, std::ostream* os) { *os << e.name; }

// "attn decode B=1 ctx=1024 new=1" -> "attn_decode_B_1_ctx_1024_new_1".
inline std::string identifier(const std::string& label) {
    std::string s;
    for (char ch : label) {
        const bool word = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        if (word) {
            s += ch;
        } else if (!s.empty() && s.back() != '_') {
            s += '_';
        }
    }
    while (!s.empty() && s.back() == '_') s.pop_back();
    return s;
}

// Binds each case of a table (with fields name, label, use) to its run function.
template <typename Case>
std::vector<Entry> entries(const std::vector<Case>& table, Result (*run)(const Case&, Mode)) {
    std::vector<Entry> out;
    for (const Case& c : table)
        out.push_back({c.name.empty() ? identifier(c.label) : c.name, c.use, [c, run](Mode m) { return run(c, m); }});
    return out;
}

// ---- seeds and inputs ---------------------------------------------------------------------------

inline constexpr uint32_t kPerfSeed = 20261129;  // perf mode: the same inputs every run

// Check mode: a new seed per case unless OSPREY_TEST_SEED is set (printed, so a failure can be
// replayed with OSPREY_TEST_SEED=<seed>). Perf mode: kPerfSeed.
inline uint32_t case_seed(Mode mode) {
    if (mode == Mode::perf) return kPerfSeed;
    static std::random_device rd;
    uint32_t seed = rd();
    if (const char* s = std::getenv("OSPREY_TEST_SEED")) seed = uint32_t(std::strtoul(s, nullptr, 10));
    std::printf("[seed %u]\n", seed);
    return seed;
}
// Independent streams of one case seed (one per input array).
inline uint64_t stream_seed(uint32_t seed, int stream) { return (uint64_t(seed) << 16) + uint64_t(stream); }

// splitmix64: a counter-based generator, the same on host and device.
__host__ __device__ inline uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
// Element i of stream `seed`, uniform in [0, 1) with 24 random bits.
__host__ __device__ inline float uniform01(uint64_t seed, uint64_t i) {
    return float(mix64(mix64(seed) ^ i) >> 40) * (1.0f / 16777216.0f);
}

template <typename T>
__global__ void fill_uniform_kernel(T* p, size_t n, uint64_t seed, float lo, float hi) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
        // Explicit roundings (no fused multiply-add), so that the host can reproduce the values.
        const float v = __fadd_rn(lo, __fmul_rn(hi - lo, uniform01(seed, i)));
        if constexpr (std::is_same_v<T, bf16>) {
            p[i].bits = __bfloat16_as_ushort(__float2bfloat16_rn(v));  // round to nearest even, as float_to_bf16
        } else {
            p[i] = T(v);
        }
    }
}

// p[0, n) = uniform in [lo, hi) from stream `seed` (bf16: rounded to nearest even).
template <typename T>
void fill_uniform(T* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t stream = nullptr) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>);
    if (n == 0) return;
    const size_t blocks = std::min<size_t>(8192, (n + 255) / 256);
    fill_uniform_kernel<T><<<unsigned(blocks), 256, 0, stream>>>(p, n, seed, lo, hi);
    CUDA_CHECK(cudaGetLastError());
}

// A device buffer of n (at least 1) elements; the first n uniform in [lo, hi).
template <typename T>
cuda::DeviceBuffer<T> device_uniform(size_t n, uint64_t seed, float lo, float hi) {
    cuda::DeviceBuffer<T> d(std::max<size_t>(1, n));
    fill_uniform(d.get(), n, seed, lo, hi);
    return d;
}

// A device copy of v (at least one element, so that empty inputs still have a valid pointer).
template <typename T>
cuda::DeviceBuffer<T> to_device(const std::vector<T>& v) {
    cuda::DeviceBuffer<T> d(std::max<size_t>(1, v.size()));
    if (!v.empty()) d.upload(v);
    return d;
}

// A device buffer of n (at least 1) elements filled with 0xFF bytes: NaN as f32 and bf16, -1 as int32,
// so that anything a kernel does not write shows.
template <typename T>
cuda::DeviceBuffer<T> poisoned(size_t n) {
    cuda::DeviceBuffer<T> d(std::max<size_t>(1, n));
    d.fill_bytes(0xFF);
    return d;
}

// A device-to-device copy of the first n elements of src.
template <typename T>
cuda::DeviceBuffer<T> clone(const cuda::DeviceBuffer<T>& src, size_t n) {
    cuda::DeviceBuffer<T> d(std::max<size_t>(1, n));
    if (n) CUDA_CHECK(cudaMemcpy(d.get(), src.get(), n * sizeof(T), cudaMemcpyDeviceToDevice));
    return d;
}

inline std::vector<float> to_float(const std::vector<bf16>& v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_float(v[i]);
    return f;
}
inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// ---- checks (record into a Result; return false on failure so that dependent checks can stop) ----

// |got - want| <= abs + rel * |want| everywhere; reports the worst element. NaN never passes.
inline bool expect_close(Result& r, std::span<const float> got, std::span<const double> want, double abs, double rel,
                         const std::string& what) {
    if (got.size() != want.size()) {
        r.fail(what, ": ", got.size(), " values, expected ", want.size());
        return false;
    }
    double worst = -1.0;
    size_t worst_i = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::abs(double(got[i]) - want[i]) - (abs + rel * std::abs(want[i]));
        if (std::isnan(got[i]) || std::isnan(err)) {
            r.fail(what, ": NaN at ", i, " (want ", want[i], ")");
            return false;
        }
        if (err > worst) worst = err, worst_i = i;
    }
    if (worst > 0.0) {
        r.fail(what, ": worst element ", worst_i, " got ", got[worst_i], " want ", want[worst_i],
               " (over the bound by ", worst, ")");
        return false;
    }
    return true;
}

// Element-wise equality; reports how many differ and the first one.
template <typename T>
bool expect_equal(Result& r, const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
    if (got.size() != want.size()) {
        r.fail(what, ": ", got.size(), " values, expected ", want.size());
        return false;
    }
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i)
        if (!(got[i] == want[i]) && bad++ == 0) first = i;
    if (bad)
        r.fail(what, ": ", bad, " of ", got.size(), " differ; first at ", first, ": got ", got[first], " want ",
               want[first]);
    return bad == 0;
}

// ---- timing -----------------------------------------------------------------------------------

struct PerfOptions {
    int iters = 0;  // timed runs per figure; 0: the case's default
    int warmup = 5;
};
inline PerfOptions& perf_options() {
    static PerfOptions o;
    return o;
}
inline int iters_or(int default_iters) { return perf_options().iters > 0 ? perf_options().iters : default_iters; }

// Median microseconds of fn(i) over `iters` runs (i = run index, for rotating inputs), each bracketed by
// CUDA events on the default stream, after perf_options().warmup runs.
inline double time_us(const std::function<void(int)>& fn, int iters) {
    for (int i = 0; i < perf_options().warmup; ++i) fn(i);
    CUDA_CHECK(cudaDeviceSynchronize());
    cuda::Event a, b;
    std::vector<double> us;
    for (int i = 0; i < iters; ++i) {
        a.record(nullptr);
        fn(i);
        b.record(nullptr);
        b.sync();
        us.push_back(1e3 * b.ms_since(a));
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
}

// How many copies of a `bytes`-sized input rotate so that consecutive runs never find it in L2.
inline int copies_beyond_l2(double bytes) {
    return std::max(1, int(double(size_t(256) << 20) / std::max(1.0, bytes)) + 1);
}

// The bench line: label, µs, GB/s and TFLOP/s with their fractions of the ceilings (the same columns as
// the benchmarks before the tables, whose labels the tables keep).
inline void print_timing(const Timing& t) {
    if (t.wall) {
        std::printf("%-48s %10.2f us %s\n", "", t.us, t.label.c_str());
        return;
    }
    const Ceilings& c = ceilings();
    const double gbps = t.bytes / (t.us * 1e3), tflops = t.flops / (t.us * 1e6);
    const double peak = t.math == Math::fp8 ? c.fp8_tflops : c.bf16_tflops;
    std::printf("%-48s %10.2f us %9.1f GB/s (%5.1f%%) %8.2f TFLOP/s (%5.1f%%)\n", t.label.c_str(), t.us, gbps,
                100.0 * gbps / c.hbm_gbps, tflops, 100.0 * tflops / peak);
}

}  // namespace osprey::cases
