// Several ranks on one GPU (see same_device.h).
#include "comm/same_device.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "comm/in_process.h"
#include "core/check.h"
#include "kernels/cuda/reduce_sum.h"
#include "kernels/cuda/runtime.h"

namespace osprey::comm {
namespace {

class SameDevice final : public Communicator {
public:
    explicit SameDevice(std::unique_ptr<Communicator> host) : host_(std::move(host)) {}
    ~SameDevice() override {
        if (scratch_) cudaFree(scratch_);
    }

    int rank() const override { return host_->rank(); }
    int size() const override { return host_->size(); }
    std::string kind() const override { return "same-device"; }
    bool on_device() const override { return true; }
    void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

    void all_reduce_sum(std::span<float> data) override {
        const int n = size();
        if (n == 1) return;
        const std::vector<Posted> all = post(data.data(), data.size());
        for (int r = 0; r < n; ++r)
            OSPREY_CHECK(all[size_t(r)].count == data.size(), "all_reduce_sum: rank ", r, " sends ",
                         all[size_t(r)].count, " elements, rank ", rank(), " ", data.size());
        if (data.empty()) return;
        if (scratch_elems_ < data.size()) {
            if (scratch_) CUDA_CHECK(cudaFree(scratch_));
            CUDA_CHECK(cudaMalloc(&scratch_, data.size() * sizeof(float)));
            scratch_elems_ = data.size();
        }
        std::vector<const float*> in(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) in[size_t(r)] = static_cast<const float*>(all[size_t(r)].ptr);
        cuda::sum_f32(scratch_, in.data(), n, data.size(), stream_);
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        host_->barrier();  // every rank has read every input: they may be overwritten now
        CUDA_CHECK(cudaMemcpyAsync(data.data(), scratch_, data.size_bytes(), cudaMemcpyDeviceToDevice, stream_));
    }

    void all_gather_bytes(const void* in, void* out, std::span<const size_t> counts) override {
        const int n = size();
        OSPREY_CHECK(int(counts.size()) == n, "all_gather: ", counts.size(), " counts for ", n, " ranks");
        const std::vector<Posted> all = post(in, counts[size_t(rank())]);
        size_t offset = 0;
        for (int r = 0; r < n; ++r) {
            OSPREY_CHECK(all[size_t(r)].count == counts[size_t(r)], "all_gather: rank ", r, " sends ",
                         all[size_t(r)].count, " bytes, ", counts[size_t(r)], " expected");
            if (counts[size_t(r)] > 0)
                CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(out) + offset, all[size_t(r)].ptr, counts[size_t(r)],
                                           cudaMemcpyDeviceToDevice, stream_));
            offset += counts[size_t(r)];
        }
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        host_->barrier();
    }

    void broadcast_bytes(void* data, size_t bytes, int root) override {
        const int n = size();
        OSPREY_CHECK(root >= 0 && root < n, "broadcast: root ", root, " outside [0, ", n, ")");
        if (n == 1) return;
        const std::vector<Posted> all = post(data, bytes);
        OSPREY_CHECK(all[size_t(root)].count == bytes, "broadcast: root sends ", all[size_t(root)].count,
                     " bytes, rank ", rank(), " expects ", bytes);
        if (rank() != root && bytes > 0)
            CUDA_CHECK(cudaMemcpyAsync(data, all[size_t(root)].ptr, bytes, cudaMemcpyDeviceToDevice, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        host_->barrier();
    }

    void barrier() override {
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        host_->barrier();
    }

    std::unique_ptr<Communicator> split(int color, int key) override {
        auto made = std::make_unique<SameDevice>(host_->split(color, key));
        made->stream_ = stream_;
        return made;
    }

    void abort() override { host_->abort(); }

private:
    struct Posted {
        const void* ptr;
        size_t count;
    };
    // Waits for this rank's queued work (its buffer is ready), then exchanges every rank's buffer and
    // count; a meeting point, so no rank reads a buffer before its owner has written it.
    std::vector<Posted> post(const void* ptr, size_t count) {
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        const Posted mine{ptr, count};
        std::vector<Posted> all(static_cast<size_t>(size()));
        host_->all_gather<Posted>(std::span(&mine, 1), all);
        return all;
    }

    std::unique_ptr<Communicator> host_;
    cudaStream_t stream_ = nullptr;
    float* scratch_ = nullptr;  // [scratch_elems_] this rank's all-reduce result
    size_t scratch_elems_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_same_device_group(int n) {
    std::vector<std::unique_ptr<Communicator>> out;
    for (auto& host : make_in_process_group(n)) out.push_back(std::make_unique<SameDevice>(std::move(host)));
    return out;
}

}  // namespace osprey::comm
