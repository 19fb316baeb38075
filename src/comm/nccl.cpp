// NCCL behind comm::Communicator (see nccl.h).
#include "comm/nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "comm/peer_allreduce.h"
#include "core/check.h"
#include "kernels/cuda/runtime.h"

// A failed NCCL call at a module boundary: an osprey::Error naming the call (an aborted peer or a
// broken link is reported this way rather than by aborting the process).
#define NCCL_CHECK(expr)                                                                                  \
    do {                                                                                                  \
        const ncclResult_t osprey_nccl_rc = (expr);                                                       \
        if (osprey_nccl_rc != ncclSuccess) OSPREY_FAIL("NCCL: ", #expr, ": ", ncclGetErrorString(osprey_nccl_rc)); \
    } while (0)

namespace osprey::comm {
namespace {

// Shared by a group and the groups split from it: one abort reaches them all.
struct Root {
    std::mutex mu;
    std::atomic<bool> aborted{false};
    std::vector<ncclComm_t> live;  // communicators not yet destroyed (aborted ones are freed by NCCL)
};

class Nccl final : public Communicator {
public:
    Nccl(ncclComm_t comm, std::shared_ptr<Root> root) : comm_(comm), root_(std::move(root)) {
        NCCL_CHECK(ncclCommCount(comm_, &size_));
        NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
        std::lock_guard lock(root_->mu);
        root_->live.push_back(comm_);
    }
    ~Nccl() override {
        if (barrier_buf_) cudaFree(barrier_buf_);
        peer_mine_.release();
        std::lock_guard lock(root_->mu);
        if (root_->aborted) return;  // ncclCommAbort freed it
        std::erase(root_->live, comm_);
        ncclCommDestroy(comm_);
    }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string kind() const override { return "nccl"; }
    bool on_device() const override { return true; }
    void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

    void all_reduce_sum(std::span<float> data) override {
        check_live();
        if (size_ == 1 || data.empty()) return;
        // Small messages: the one-shot peer-memory all-reduce when turned on (peer_allreduce.h; every
        // rank takes the same branch, the sizes being equal).
        if (peer_allreduce_enabled() && size_ <= kPeerMaxRanks && data.size_bytes() <= kPeerAllReduceMaxBytes) {
            if (!peer_ready_) setup_peer();
            peer_args_.data = data.data();
            peer_args_.n = data.size();
            peer_args_.call = ++peer_calls_;
            peer_allreduce(peer_args_, stream_);
            return;
        }
        NCCL_CHECK(ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclSum, comm_, stream_));
    }

    void all_gather_bytes(const void* in, void* out, std::span<const size_t> counts) override {
        check_live();
        OSPREY_CHECK(int(counts.size()) == size_, "all_gather: ", counts.size(), " counts for ", size_, " ranks");
        bool even = true;
        for (size_t c : counts) even = even && c == counts[0];
        if (even) {
            if (counts[0] > 0) NCCL_CHECK(ncclAllGather(in, out, counts[0], ncclUint8, comm_, stream_));
            return;
        }
        // Ragged: each rank broadcasts its part into its place, all in one group call.
        NCCL_CHECK(ncclGroupStart());
        size_t offset = 0;
        for (int r = 0; r < size_; ++r) {
            const size_t c = counts[size_t(r)];
            if (c > 0)
                NCCL_CHECK(ncclBroadcast(r == rank_ ? in : nullptr, static_cast<uint8_t*>(out) + offset, c,
                                         ncclUint8, r, comm_, stream_));
            offset += c;
        }
        NCCL_CHECK(ncclGroupEnd());
    }

    void broadcast_bytes(void* data, size_t bytes, int root) override {
        check_live();
        OSPREY_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " outside [0, ", size_, ")");
        if (size_ == 1 || bytes == 0) return;
        NCCL_CHECK(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_));
    }

    void barrier() override {
        check_live();
        if (!barrier_buf_) CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
        NCCL_CHECK(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat, ncclSum, comm_, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }

    std::unique_ptr<Communicator> split(int color, int key) override {
        check_live();
        ncclComm_t made = nullptr;
        NCCL_CHECK(ncclCommSplit(comm_, color, key, &made, nullptr));
        OSPREY_CHECK(made, "NCCL: ncclCommSplit gave no communicator for colour ", color);
        auto c = std::make_unique<Nccl>(made, root_);
        c->stream_ = stream_;
        return c;
    }

    void abort() override {
        std::lock_guard lock(root_->mu);
        if (root_->aborted.exchange(true)) return;
        for (ncclComm_t c : root_->live) ncclCommAbort(c);
        root_->live.clear();
    }

private:
    // Collective (the first small all-reduce of this group): allocates this rank's staging buffers and
    // flags, exchanges every rank's pointers and device over NCCL, and enables peer access to them.
    void setup_peer() {
        struct Posted {
            uint64_t staging0, staging1, flags;
            int32_t device, unused;
        };
        peer_mine_.allocate();
        const Posted mine{reinterpret_cast<uint64_t>(peer_mine_.staging[0]),
                          reinterpret_cast<uint64_t>(peer_mine_.staging[1]), reinterpret_cast<uint64_t>(peer_mine_.flags),
                          peer_mine_.device, 0};
        Posted* d = nullptr;
        CUDA_CHECK(cudaMalloc(&d, sizeof(Posted) * size_t(size_ + 1)));
        CUDA_CHECK(cudaMemcpyAsync(d + size_, &mine, sizeof(Posted), cudaMemcpyHostToDevice, stream_));
        NCCL_CHECK(ncclAllGather(d + size_, d, sizeof(Posted), ncclUint8, comm_, stream_));
        std::vector<Posted> all(static_cast<size_t>(size_));
        CUDA_CHECK(cudaMemcpyAsync(all.data(), d, sizeof(Posted) * size_t(size_), cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        CUDA_CHECK(cudaFree(d));
        peer_args_.n_ranks = size_;
        peer_args_.rank = rank_;
        for (int r = 0; r < size_; ++r) {
            const Posted& p = all[size_t(r)];
            peer_args_.ranks[r].staging[0] = reinterpret_cast<float*>(p.staging0);
            peer_args_.ranks[r].staging[1] = reinterpret_cast<float*>(p.staging1);
            peer_args_.ranks[r].flags = reinterpret_cast<uint64_t*>(p.flags);
            peer_args_.ranks[r].device = p.device;
            if (p.device == peer_mine_.device) continue;
            int can = 0;
            CUDA_CHECK(cudaDeviceCanAccessPeer(&can, peer_mine_.device, p.device));
            OSPREY_CHECK(can, "peer all-reduce: GPU ", peer_mine_.device, " cannot access GPU ", p.device,
                         " (unset OSPREY_PEER_ALLREDUCE)");
            const cudaError_t e = cudaDeviceEnablePeerAccess(p.device, 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled) {
                (void)cudaGetLastError();
            } else {
                CUDA_CHECK(e);
            }
        }
        peer_ready_ = true;
    }

    void check_live() const { OSPREY_CHECK(!root_->aborted, "communicator aborted: another rank failed"); }

    ncclComm_t comm_ = nullptr;
    std::shared_ptr<Root> root_;
    int rank_ = 0, size_ = 1;
    cudaStream_t stream_ = nullptr;
    float* barrier_buf_ = nullptr;
    // The one-shot peer all-reduce (peer_allreduce.h), set up on first use.
    bool peer_ready_ = false;
    PeerBuffers peer_mine_;
    PeerAllReduceArgs peer_args_;
    uint64_t peer_calls_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(std::span<const int> devices) {
    const int n = int(devices.size());
    OSPREY_CHECK(n >= 1, "NCCL group of no devices");
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    for (int d : devices)
        OSPREY_CHECK(d >= 0 && d < count, "NCCL group: device ", d, " outside the ", count, " visible devices");
    std::vector<ncclComm_t> comms(static_cast<size_t>(n));
    NCCL_CHECK(ncclCommInitAll(comms.data(), n, devices.data()));
    auto root = std::make_shared<Root>();
    std::vector<std::unique_ptr<Communicator>> out;
    for (ncclComm_t c : comms) out.push_back(std::make_unique<Nccl>(c, root));
    return out;
}

NcclId nccl_unique_id() {
    ncclUniqueId id;
    NCCL_CHECK(ncclGetUniqueId(&id));
    static_assert(sizeof(id) == sizeof(NcclId));
    NcclId out;
    std::memcpy(out.data(), &id, sizeof(id));
    return out;
}

std::unique_ptr<Communicator> make_nccl_rank(const NcclId& id, int n_ranks, int rank, int device) {
    CUDA_CHECK(cudaSetDevice(device));
    ncclUniqueId nid;
    std::memcpy(&nid, id.data(), sizeof(nid));
    ncclComm_t comm = nullptr;
    NCCL_CHECK(ncclCommInitRank(&comm, n_ranks, nid, rank));
    return std::make_unique<Nccl>(comm, std::make_shared<Root>());
}

int nccl_version() {
    int v = 0;
    NCCL_CHECK(ncclGetVersion(&v));
    return v;
}

}  // namespace osprey::comm
