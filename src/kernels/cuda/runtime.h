// The CUDA runtime layer: error checking, RAII owners for device memory, pinned host memory,
// streams, events and CUDA graphs, and a bump-allocated workspace sized once for the largest batch.
// Everything the CUDA backend allocates goes through these types, so nothing leaks on an exception.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "core/check.h"

// Every CUDA runtime call. A CUDA error is not recoverable (the context may be corrupt), so this
// prints the error, the expression and file:line and aborts instead of throwing.
#define CUDA_CHECK(expr)                                                                              \
    do {                                                                                              \
        const cudaError_t osprey_cuda_err_ = (expr);                                                  \
        if (osprey_cuda_err_ != cudaSuccess) {                                                        \
            std::fprintf(stderr, "CUDA error %s (%s) in `%s` at %s:%d\n", cudaGetErrorName(osprey_cuda_err_), \
                         cudaGetErrorString(osprey_cuda_err_), #expr, __FILE__, __LINE__);            \
            std::abort();                                                                             \
        }                                                                                             \
    } while (0)

namespace osprey::cuda {

// Bytes of device memory free and total on the current device.
struct MemInfo {
    size_t free = 0;
    size_t total = 0;
};
MemInfo mem_info();
// Throws osprey::Error naming the reason when no CUDA device can be used (no GPU, no driver).
void require_device();
std::string device_name();  // "NVIDIA H200"
int sm_count();

// Owns n elements of T in device memory (cudaMalloc; never managed memory). Move-only.
template <typename T>
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t n) { resize(n); }
    ~DeviceBuffer() { reset(); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), n_(o.n_) { o.ptr_ = nullptr, o.n_ = 0; }
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            reset();
            ptr_ = o.ptr_, n_ = o.n_;
            o.ptr_ = nullptr, o.n_ = 0;
        }
        return *this;
    }

    // Frees the old storage and allocates n elements (contents undefined).
    void resize(size_t n) {
        reset();
        if (n == 0) return;
        void* p = nullptr;
        const cudaError_t err = cudaMalloc(&p, n * sizeof(T));
        if (err == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();  // clear the sticky-free allocation error
            OSPREY_FAIL("out of device memory allocating ", n * sizeof(T), " bytes (", mem_info().free,
                        " bytes free)");
        }
        CUDA_CHECK(err);
        ptr_ = static_cast<T*>(p), n_ = n;
    }
    void reset() {
        if (ptr_) CUDA_CHECK(cudaFree(ptr_));
        ptr_ = nullptr, n_ = 0;
    }

    T* get() const { return ptr_; }
    size_t size() const { return n_; }
    size_t bytes() const { return n_ * sizeof(T); }

    void upload(std::span<const T> src, cudaStream_t stream = nullptr) {
        OSPREY_CHECK(src.size() <= n_, "upload of ", src.size(), " elements into a buffer of ", n_);
        CUDA_CHECK(cudaMemcpyAsync(ptr_, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
        if (!stream) CUDA_CHECK(cudaStreamSynchronize(nullptr));
    }
    void upload(const std::vector<T>& src, cudaStream_t stream = nullptr) { upload(std::span<const T>(src), stream); }
    std::vector<T> download(size_t n = size_t(-1)) const {
        if (n == size_t(-1)) n = n_;
        OSPREY_CHECK(n <= n_, "download of ", n, " elements from a buffer of ", n_);
        std::vector<T> out(n);
        CUDA_CHECK(cudaMemcpy(out.data(), ptr_, n * sizeof(T), cudaMemcpyDeviceToHost));
        return out;
    }
    // Fills every byte with `byte` (0xFF makes NaN in f32 and bf16: used to poison outputs in tests).
    void fill_bytes(int byte, cudaStream_t stream = nullptr) {
        if (n_) CUDA_CHECK(cudaMemsetAsync(ptr_, byte, bytes(), stream));
    }

private:
    T* ptr_ = nullptr;
    size_t n_ = 0;
};

// Page-locked host memory (cudaMallocHost), for fast asynchronous copies. Move-only.
template <typename T>
class PinnedBuffer {
public:
    PinnedBuffer() = default;
    explicit PinnedBuffer(size_t n) { resize(n); }
    ~PinnedBuffer() { reset(); }
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;
    PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(o.ptr_), n_(o.n_) { o.ptr_ = nullptr, o.n_ = 0; }
    PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
        if (this != &o) {
            reset();
            ptr_ = o.ptr_, n_ = o.n_;
            o.ptr_ = nullptr, o.n_ = 0;
        }
        return *this;
    }
    void resize(size_t n) {
        reset();
        if (n == 0) return;
        void* p = nullptr;
        CUDA_CHECK(cudaMallocHost(&p, n * sizeof(T)));
        ptr_ = static_cast<T*>(p), n_ = n;
    }
    void reset() {
        if (ptr_) CUDA_CHECK(cudaFreeHost(ptr_));
        ptr_ = nullptr, n_ = 0;
    }
    T* get() const { return ptr_; }
    T& operator[](size_t i) const { return ptr_[i]; }
    size_t size() const { return n_; }

private:
    T* ptr_ = nullptr;
    size_t n_ = 0;
};

class Stream {
public:
    Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
    ~Stream() {
        if (s_) cudaStreamDestroy(s_);
    }
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    cudaStream_t get() const { return s_; }
    operator cudaStream_t() const { return s_; }
    void sync() const { CUDA_CHECK(cudaStreamSynchronize(s_)); }

private:
    cudaStream_t s_ = nullptr;
};

class Event {
public:
    explicit Event(bool timing = true) {
        CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
    }
    ~Event() {
        if (e_) cudaEventDestroy(e_);
    }
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;
    cudaEvent_t get() const { return e_; }
    void record(cudaStream_t s) { CUDA_CHECK(cudaEventRecord(e_, s)); }
    void sync() const { CUDA_CHECK(cudaEventSynchronize(e_)); }
    // Milliseconds between `start` and this event (both recorded and complete).
    float ms_since(const Event& start) const {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
        return ms;
    }

private:
    cudaEvent_t e_ = nullptr;
};

// One device allocation carved into aligned sub-buffers by a bump pointer. Sized once (for the
// largest batch) so a forward step never calls cudaMalloc; reset() starts carving again.
class Workspace {
public:
    static constexpr size_t kAlign = 256;
    Workspace() = default;
    explicit Workspace(size_t bytes) : buf_(bytes) {}
    void reset() { used_ = 0; }
    size_t capacity() const { return buf_.size(); }
    size_t used() const { return used_; }

    template <typename T>
    T* take(size_t n, const char* what) {
        const size_t bytes = (n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
        OSPREY_CHECK(used_ + bytes <= buf_.size(), "workspace too small for ", what, ": need ", used_ + bytes,
                     " bytes, have ", buf_.size());
        T* p = reinterpret_cast<T*>(buf_.get() + used_);
        used_ += bytes;
        return p;
    }
    // Bytes `take<T>(n)` consumes, for sizing a workspace before creating it.
    template <typename T>
    static size_t bytes_for(size_t n) {
        return (n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    }

private:
    DeviceBuffer<uint8_t> buf_;
    size_t used_ = 0;
};

// A captured CUDA graph: capture(stream, fn) records fn's launches once, replay(stream) runs them.
class Graph {
public:
    Graph() = default;
    ~Graph() { reset(); }
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    Graph(Graph&& o) noexcept : graph_(o.graph_), exec_(o.exec_) { o.graph_ = nullptr, o.exec_ = nullptr; }

    template <typename F>
    void capture(cudaStream_t stream, F&& fn) {
        reset();
        CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        try {
            fn();
        } catch (...) {
            cudaGraph_t g = nullptr;
            cudaStreamEndCapture(stream, &g);
            if (g) cudaGraphDestroy(g);
            throw;
        }
        CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
        CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
    }
    bool ready() const { return exec_ != nullptr; }
    void replay(cudaStream_t stream) const {
        OSPREY_CHECK(exec_, "replay of a CUDA graph that was never captured");
        CUDA_CHECK(cudaGraphLaunch(exec_, stream));
    }
    void reset() {
        if (exec_) cudaGraphExecDestroy(exec_);
        if (graph_) cudaGraphDestroy(graph_);
        exec_ = nullptr, graph_ = nullptr;
    }

private:
    cudaGraph_t graph_ = nullptr;
    cudaGraphExec_t exec_ = nullptr;
};

}  // namespace osprey::cuda
