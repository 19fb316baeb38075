// Collectives between the ranks of a parallel layout (tensor, expert and data parallelism; see
// model/parallel_runner.h and docs/architecture.md "Parallelism").
//
// A Communicator is one rank's handle on a group of `size()` ranks. Every collective is called by
// every rank of the group, in the same order, with matching sizes; it returns when this rank's part
// is done. The shape follows NCCL (all-reduce, all-gather, broadcast, split by colour and key, abort)
// so that a NCCL implementation slots in behind it; the in-process one (comm/in_process.h) runs the
// ranks as threads of one process, for the CPU backend and for CI.
//
// Host or device memory. The in-process communicator moves host memory and returns when this rank's
// part is done. A device communicator (comm/nccl.h: NCCL, one GPU per rank; comm/same_device.h: several
// ranks on one GPU, for tests) moves device memory, stream-ordered on the stream set by set_stream():
// a collective reads its input after the work queued before it on that stream, and work queued
// after it sees the result; it may return before then. Buffers are then device pointers.
//
// Determinism: all_reduce_sum adds the ranks' values in rank order, ((x0 + x1) + x2) + ..., for every
// element, and every rank receives the same bits. A rerun of the same inputs gives the same result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace osprey::comm {

class Communicator {
public:
    virtual ~Communicator() = default;

    virtual int rank() const = 0;  // in [0, size())
    virtual int size() const = 0;
    virtual std::string kind() const = 0;  // "in-process", "nccl", "same-device"
    // True when the buffers are device memory (see above); such a communicator needs set_stream().
    virtual bool on_device() const { return false; }
    // The CUDA stream (a cudaStream_t) a device communicator orders its work on; host ones ignore it.
    virtual void set_stream(void* stream) {}

    // data = Σ over ranks of data, element by element in rank order; every rank gets the same bits.
    virtual void all_reduce_sum(std::span<float> data) = 0;
    // out = the ranks' inputs concatenated in rank order; rank r sends counts[r] bytes (ranks may
    // send different amounts; `counts` is the same on every rank and out holds their sum).
    virtual void all_gather_bytes(const void* in, void* out, std::span<const size_t> counts) = 0;
    // data (bytes) = root's data on every rank.
    virtual void broadcast_bytes(void* data, size_t bytes, int root) = 0;
    virtual void barrier() = 0;

    // Collective over this group: ranks passing the same colour form a new group, ranked by (key,
    // rank here). Every rank gets its handle on its new group (NCCL: ncclCommSplit).
    virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

    // Marks this group, and every group split from the same root group, failed: collectives that
    // are blocked or called later throw osprey::Error instead of waiting for a rank that will not
    // come (one rank threw mid-step). Callable from any thread.
    virtual void abort() = 0;

    // Typed helpers.
    template <typename T>
    void all_gather(std::span<const T> in, std::span<T> out) {  // every rank sends in.size() elements
        static_assert(std::is_trivially_copyable_v<T>);
        const std::vector<size_t> counts(size_t(size()), in.size_bytes());
        check_gather(out.size_bytes(), in.size_bytes() * size_t(size()));
        all_gather_bytes(in.data(), out.data(), counts);
    }
    template <typename T>
    void all_gather_v(std::span<const T> in, std::span<T> out, std::span<const size_t> counts) {  // counts: elements
        static_assert(std::is_trivially_copyable_v<T>);
        std::vector<size_t> bytes(counts.size());
        size_t total = 0;
        for (size_t r = 0; r < counts.size(); ++r) total += (bytes[r] = counts[r] * sizeof(T));
        check_gather(out.size_bytes(), total);
        all_gather_bytes(in.data(), out.data(), bytes);
    }
    template <typename T>
    void broadcast(std::span<T> data, int root) {
        static_assert(std::is_trivially_copyable_v<T>);
        broadcast_bytes(data.data(), data.size_bytes(), root);
    }

private:
    static void check_gather(size_t out_bytes, size_t needed);
};

// A group of one rank: every collective is the identity (TP=EP=DP=1 without any threads).
std::unique_ptr<Communicator> make_single_rank();

}  // namespace osprey::comm
