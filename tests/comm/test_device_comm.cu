// The device communicators (label gpu). Same-device (comm/same_device.h, several ranks on one GPU):
// the in-process communicator's contract on device buffers, with the same bits, so the all-reduce is
// compared bit for bit with a host rank-order sum (including more ranks than one reduce_sum launch
// takes); uneven all-gathers, broadcast, split, a mismatched size. NCCL (comm/nccl.h): the same
// collectives over the visible GPUs (skipped with fewer than 2): every rank gets the same bits, within
// an FP32 reordering bound of the rank-order sum.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "comm/nccl.h"
#include "comm/same_device.h"
#include "core/check.h"
#include "kernels/cuda/runtime.h"

namespace osprey::comm {
namespace {

// Runs fn(comm, stream) on one thread per rank (its device set, its own stream bound to the
// communicator); returns each rank's first exception message ("" if none).
std::vector<std::string> run_ranks(std::vector<std::unique_ptr<Communicator>>& comms, const std::vector<int>& devices,
                                   const std::function<void(Communicator&, cudaStream_t)>& fn) {
    const size_t n = comms.size();
    std::vector<std::string> errors(n);
    std::vector<std::thread> threads;
    for (size_t r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
            try {
                CUDA_CHECK(cudaSetDevice(devices[r]));
                cuda::Stream stream;
                comms[r]->set_stream(stream.get());
                fn(*comms[r], stream.get());
                CUDA_CHECK(cudaStreamSynchronize(stream.get()));
            } catch (const std::exception& e) {
                errors[r] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    return errors;
}

float value(int rank, size_t i) { return 1.0f / float(3 + rank * 7 + int(i % 13)) + float(i) * 1e-3f; }

std::vector<float> all_reduce_on_device(Communicator& c, cudaStream_t s, size_t len) {
    std::vector<float> x(len);
    for (size_t i = 0; i < len; ++i) x[i] = value(c.rank(), i);
    cuda::DeviceBuffer<float> d(len);
    for (int rep = 0; rep < 3; ++rep) {  // repeated: scratch and state are reused correctly
        d.upload(x, s);
        c.all_reduce_sum(std::span(d.get(), len));
    }
    CUDA_CHECK(cudaStreamSynchronize(s));
    return d.download();
}

std::vector<int> same_device(int n) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    return std::vector<int>(static_cast<size_t>(n), dev);
}

TEST(SameDevice, AllReduceSumsInRankOrderWithTheSameBitsEverywhere) {
    for (int n : {1, 2, 3, 8, 11}) {
        for (size_t len : {size_t(0), size_t(1), size_t(1000), size_t(100000)}) {
            auto comms = make_same_device_group(n);
            std::vector<std::vector<float>> got(static_cast<size_t>(n));
            const auto errors = run_ranks(comms, same_device(n), [&](Communicator& c, cudaStream_t s) {
                EXPECT_TRUE(c.on_device());
                got[size_t(c.rank())] = all_reduce_on_device(c, s, len);
            });
            for (const auto& e : errors) ASSERT_EQ(e, "");
            for (size_t i = 0; i < len; ++i) {
                float expect = value(0, i);
                for (int r = 1; r < n; ++r) expect += value(r, i);
                for (int r = 0; r < n; ++r)
                    ASSERT_EQ(std::memcmp(&got[size_t(r)][i], &expect, sizeof(float)), 0)
                        << "n " << n << " rank " << r << " element " << i;
            }
        }
    }
}

// Uneven all-gather (rank r sends r + 1 ints, one rank none), broadcast from every root, barrier.
void gather_and_broadcast(Communicator& c, cudaStream_t s) {
    const int n = c.size();
    std::vector<size_t> counts(static_cast<size_t>(n));
    size_t total = 0;
    for (int r = 0; r < n; ++r) total += (counts[size_t(r)] = r == 1 ? 0 : size_t(r + 1));
    std::vector<int32_t> mine(counts[size_t(c.rank())]);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = c.rank() * 100 + int(i);
    cuda::DeviceBuffer<int32_t> in(std::max<size_t>(1, mine.size())), out(std::max<size_t>(1, total));
    in.upload(mine, s);
    c.all_gather_v<int32_t>(std::span<const int32_t>(in.get(), mine.size()), std::span(out.get(), total), counts);
    CUDA_CHECK(cudaStreamSynchronize(s));
    const std::vector<int32_t> got = out.download(total);
    size_t at = 0;
    for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < counts[size_t(r)]; ++i) EXPECT_EQ(got[at++], r * 100 + int(i)) << "rank " << c.rank();
    for (int root = 0; root < n; ++root) {
        cuda::DeviceBuffer<int32_t> b(3);
        const std::vector<int32_t> v = {c.rank(), c.rank() + 1, c.rank() + 2};
        b.upload(v, s);
        c.broadcast<int32_t>(std::span(b.get(), 3), root);
        CUDA_CHECK(cudaStreamSynchronize(s));
        EXPECT_EQ(b.download(), (std::vector<int32_t>{root, root + 1, root + 2}));
    }
    c.barrier();
}

TEST(SameDevice, AllGatherBroadcastAndBarrier) {
    for (int n : {1, 2, 4}) {
        auto comms = make_same_device_group(n);
        for (const auto& e : run_ranks(comms, same_device(n), gather_and_broadcast)) EXPECT_EQ(e, "");
    }
}

// Split into TP-like groups of 2 (colour r / 2), reversed by key; sums stay inside each group.
void split_groups(Communicator& c, cudaStream_t s) {
    auto sub = c.split(c.rank() / 2, -c.rank());
    EXPECT_EQ(sub->size(), 2);
    EXPECT_EQ(sub->rank(), 1 - c.rank() % 2);
    cuda::DeviceBuffer<float> d(1);
    d.upload(std::vector<float>{float(c.rank())}, s);
    sub->all_reduce_sum(std::span(d.get(), 1));
    CUDA_CHECK(cudaStreamSynchronize(s));
    const int g = c.rank() / 2;
    EXPECT_EQ(d.download()[0], float(2 * g + 2 * g + 1));
}

TEST(SameDevice, SplitMakesSubGroups) {
    auto comms = make_same_device_group(4);
    for (const auto& e : run_ranks(comms, same_device(4), split_groups)) EXPECT_EQ(e, "");
}

TEST(SameDevice, MismatchedSizesThrowOnEveryRank) {
    auto comms = make_same_device_group(2);
    const auto errors = run_ranks(comms, same_device(2), [](Communicator& c, cudaStream_t) {
        cuda::DeviceBuffer<float> d(4);
        c.all_reduce_sum(std::span(d.get(), size_t(c.rank() == 0 ? 4 : 3)));
    });
    for (const auto& e : errors) EXPECT_NE(e.find("all_reduce_sum"), std::string::npos) << e;
}

std::vector<int> all_gpus() {
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    std::vector<int> d(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) d[size_t(i)] = i;
    return d;
}

TEST(Nccl, AllReduceGivesTheSameBitsOnEveryRank) {
    const std::vector<int> gpus = all_gpus();
    if (gpus.size() < 2) GTEST_SKIP() << "NCCL needs 2 GPUs, " << gpus.size() << " visible";
    const int n = int(gpus.size());
    std::printf("NCCL %d on %d GPUs\n", nccl_version(), n);
    for (size_t len : {size_t(1), size_t(1000), size_t(1) << 20}) {
        auto comms = make_nccl_group(gpus);
        std::vector<std::vector<float>> got(static_cast<size_t>(n));
        const auto errors = run_ranks(comms, gpus, [&](Communicator& c, cudaStream_t s) {
            got[size_t(c.rank())] = all_reduce_on_device(c, s, len);
        });
        for (const auto& e : errors) ASSERT_EQ(e, "");
        for (size_t i = 0; i < len; ++i) {
            double sum = 0, mag = 0;
            for (int r = 0; r < n; ++r) sum += value(r, i), mag += std::abs(value(r, i));
            EXPECT_NEAR(got[0][i], sum, 1e-6 * mag * n) << i;
            for (int r = 1; r < n; ++r) ASSERT_EQ(std::memcmp(&got[size_t(r)][i], &got[0][i], sizeof(float)), 0);
        }
    }
}

TEST(Nccl, AllGatherBroadcastSplit) {
    const std::vector<int> gpus = all_gpus();
    if (gpus.size() < 2) GTEST_SKIP() << "NCCL needs 2 GPUs, " << gpus.size() << " visible";
    auto comms = make_nccl_group(gpus);
    for (const auto& e : run_ranks(comms, gpus, gather_and_broadcast)) EXPECT_EQ(e, "");
    if (gpus.size() % 2 == 0) {
        auto again = make_nccl_group(gpus);
        for (const auto& e : run_ranks(again, gpus, split_groups)) EXPECT_EQ(e, "");
    }
}

}  // namespace
}  // namespace osprey::comm
