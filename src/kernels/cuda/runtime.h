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
#include <utility>
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
int device_attribute(cudaDeviceAttr attr);  // of the current device

// Where an OwnedBuffer's storage comes from.
struct DeviceMemory {  // cudaMalloc (never managed memory)
    static void* allocate(size_t bytes) {
        void* p = nullptr;
        const cudaError_t err = cudaMalloc(&p, bytes);
        if (err == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();  // clear the sticky-free allocation error
            OSPREY_FAIL("out of device memory allocating ", bytes, " bytes (", mem_info().free, " bytes free)");
        }
        CUDA_CHECK(err);
        return p;
    }
    static void release(void* p) { CUDA_CHECK(cudaFree(p)); }
};
struct PinnedMemory {  // page-locked host memory (cudaMallocHost), for fast asynchronous copies
    static void* allocate(size_t bytes) {
        void* p = nullptr;
        CUDA_CHECK(cudaMallocHost(&p, bytes));
        return p;
    }
    static void release(void* p) { CUDA_CHECK(cudaFreeHost(p)); }
};

// Owns n elements of T allocated by Memory. Move-only.
template <typename T, class Memory>
class OwnedBuffer {
public:
    OwnedBuffer() = default;
    explicit OwnedBuffer(size_t n) { resize(n); }
    ~OwnedBuffer() { reset(); }
    OwnedBuffer(const OwnedBuffer&) = delete;
    OwnedBuffer& operator=(const OwnedBuffer&) = delete;
    OwnedBuffer(OwnedBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), n_(std::exchange(o.n_, 0)) {}
    OwnedBuffer& operator=(OwnedBuffer&& o) noexcept {
        if (this != &o) {
            reset();
            ptr_ = std::exchange(o.ptr_, nullptr);
            n_ = std::exchange(o.n_, 0);
        }
        return *this;
    }

    // Frees the old storage and allocates n elements (contents undefined).
    void resize(size_t n) {
        reset();
        if (n == 0) return;
        ptr_ = static_cast<T*>(Memory::allocate(n * sizeof(T)));
        n_ = n;
    }
    void reset() {
        if (ptr_) Memory::release(ptr_);
        ptr_ = nullptr, n_ = 0;
    }

    T* get() const { return ptr_; }
    size_t size() const { return n_; }
    size_t bytes() const { return n_ * sizeof(T); }

protected:
    T* ptr_ = nullptr;
    size_t n_ = 0;
};

// n elements of T in device memory, with synchronous-or-stream copies to and from the host.
template <typename T>
class DeviceBuffer : public OwnedBuffer<T, DeviceMemory> {
    using Base = OwnedBuffer<T, DeviceMemory>;

public:
    using Base::Base;

    void upload(std::span<const T> src, cudaStream_t stream = nullptr) {
        OSPREY_CHECK(src.size() <= this->n_, "upload of ", src.size(), " elements into a buffer of ", this->n_);
        CUDA_CHECK(cudaMemcpyAsync(this->ptr_, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
        if (!stream) CUDA_CHECK(cudaStreamSynchronize(nullptr));
    }
    void upload(const std::vector<T>& src, cudaStream_t stream = nullptr) { upload(std::span<const T>(src), stream); }
    std::vector<T> download(size_t n = size_t(-1)) const {
        if (n == size_t(-1)) n = this->n_;
        OSPREY_CHECK(n <= this->n_, "download of ", n, " elements from a buffer of ", this->n_);
        std::vector<T> out(n);
        CUDA_CHECK(cudaMemcpy(out.data(), this->ptr_, n * sizeof(T), cudaMemcpyDeviceToHost));
        return out;
    }
    // Fills every byte with `byte` (0xFF makes NaN in f32 and bf16: used to poison outputs in tests).
    void fill_bytes(int byte, cudaStream_t stream = nullptr) {
        if (this->n_) CUDA_CHECK(cudaMemsetAsync(this->ptr_, byte, this->bytes(), stream));
    }
};

// n elements of T in page-locked host memory, indexable on the host.
template <typename T>
class PinnedBuffer : public OwnedBuffer<T, PinnedMemory> {
    using Base = OwnedBuffer<T, PinnedMemory>;

public:
    using Base::Base;
    T& operator[](size_t i) const { return this->ptr_[i]; }
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
