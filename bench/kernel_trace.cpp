// CUPTI activity tracing of kernels (see kernel_trace.h).
#include "kernel_trace.h"

#include <cupti.h>
#include <cuda_runtime.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "core/check.h"
#include "kernels/cuda/runtime.h"

#define CUPTI_CHECK(expr)                                                                        \
    do {                                                                                         \
        const CUptiResult osprey_cupti_rc_ = (expr);                                             \
        if (osprey_cupti_rc_ != CUPTI_SUCCESS) {                                                 \
            const char* osprey_cupti_msg_ = nullptr;                                             \
            cuptiGetResultString(osprey_cupti_rc_, &osprey_cupti_msg_);                          \
            OSPREY_FAIL("CUPTI: ", #expr, ": ", osprey_cupti_msg_ ? osprey_cupti_msg_ : "error"); \
        }                                                                                        \
    } while (0)

namespace osprey::bench {

namespace {

constexpr size_t kBufferBytes = size_t(8) << 20;

std::mutex g_mu;
std::vector<TracedKernel> g_kernels;

std::string short_name(const char* mangled) {
    int status = 0;
    char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    std::string s = status == 0 && d ? d : mangled;
    std::free(d);
    // "void osprey::cuda::(anonymous namespace)::gemv_kernel<1, true>(...)" -> "gemv_kernel<1, true>"
    for (size_t at; (at = s.find("(anonymous namespace)")) != std::string::npos;) s.erase(at, 21);
    if (const size_t paren = s.find('('); paren != std::string::npos) s.resize(paren);
    size_t depth = 0, cut = 0;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '<') ++depth;
        if (s[i] == '>' && depth > 0) --depth;
        if (depth == 0 && (s[i] == ':' || s[i] == ' ')) cut = i + 1;
    }
    return s.substr(cut);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *size = kBufferBytes;
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    CUpti_Activity* record = nullptr;
    std::lock_guard lock(g_mu);
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        g_kernels.push_back({short_name(k->name), k->start, k->end});
    }
    std::free(buffer);
}

}  // namespace

KernelTrace::KernelTrace() { CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed)); }

void KernelTrace::start() {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUPTI_CHECK(cuptiActivityFlushAll(1));
    {
        std::lock_guard lock(g_mu);
        g_kernels.clear();
    }
    CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
}

std::vector<TracedKernel> KernelTrace::stop() {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUPTI_CHECK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CUPTI_CHECK(cuptiActivityFlushAll(1));
    std::lock_guard lock(g_mu);
    std::vector<TracedKernel> out = std::move(g_kernels);
    g_kernels.clear();
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
    return out;
}

KernelTraceSummary summarize_trace(const std::vector<TracedKernel>& kernels, int n_steps) {
    KernelTraceSummary s;
    if (kernels.empty() || n_steps <= 0) return s;
    std::map<std::string, KernelTraceRow> by_name;
    uint64_t busy = 0, cover_end = 0;
    for (const TracedKernel& k : kernels) {
        KernelTraceRow& r = by_name[k.name];
        r.name = k.name;
        r.calls_per_step += 1.0 / n_steps;
        r.us_per_step += double(k.end_ns - k.start_ns) * 1e-3 / n_steps;
        // Union of intervals (sorted by start): what the GPU was busy with at all.
        // The part a kernel adds to it is its own share of the step: kernels that overlap an earlier
        // one (PDL: launched early, waiting) count only past the earlier one's end.
        const uint64_t begin = std::max(k.start_ns, cover_end);
        if (k.end_ns > begin) busy += k.end_ns - begin, r.busy_us_per_step += double(k.end_ns - begin) * 1e-3 / n_steps;
        cover_end = std::max(cover_end, k.end_ns);
    }
    for (auto& [name, row] : by_name) s.rows.push_back(row);
    std::sort(s.rows.begin(), s.rows.end(), [](const auto& a, const auto& b) { return a.us_per_step > b.us_per_step; });
    uint64_t last_end = 0;
    for (const TracedKernel& k : kernels) last_end = std::max(last_end, k.end_ns);
    s.span_us_per_step = double(last_end - kernels.front().start_ns) * 1e-3 / n_steps;
    s.busy_us_per_step = double(busy) * 1e-3 / n_steps;
    s.kernels_per_step = double(kernels.size()) / n_steps;
    return s;
}

}  // namespace osprey::bench
