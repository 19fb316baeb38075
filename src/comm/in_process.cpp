// The in-process communicator (see in_process.h).
#include "comm/in_process.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <utility>

#include "core/check.h"

namespace osprey::comm {

void Communicator::check_gather(size_t out_bytes, size_t needed) {
    OSPREY_CHECK(out_bytes == needed, "all_gather: output of ", out_bytes, " bytes for ", needed, " gathered");
}

namespace {

struct Group;

// Shared by a group and every group split from it, so that one abort reaches them all.
struct Root {
    std::atomic<bool> aborted{false};
    std::mutex mu;
    std::vector<std::weak_ptr<Group>> groups;
};

struct Group {
    Group(int n, std::shared_ptr<Root> r)
        : size(n), root(std::move(r)), ptrs(size_t(n)), sizes(size_t(n)), split_keys(size_t(n)), made(size_t(n)) {}

    const int size;
    const std::shared_ptr<Root> root;
    std::mutex mu;
    std::condition_variable cv;
    int arrived = 0;
    uint64_t generation = 0;

    // Posted by each rank before the first barrier of a collective, read by all after it.
    std::vector<void*> ptrs;                      // [size] the rank's buffer
    std::vector<size_t> sizes;                    // [size] its element or byte count
    std::vector<float> result;                    // all-reduce result, [elements]
    std::vector<std::pair<int, int>> split_keys;  // [size] (colour, key)
    std::vector<std::shared_ptr<Group>> made;     // [size] new groups, posted by their first rank

    // Every rank of the group meets here; throws when the group was aborted.
    void barrier() {
        std::unique_lock lock(mu);
        OSPREY_CHECK(!root->aborted, "communicator aborted: another rank failed");
        const uint64_t gen = generation;
        if (++arrived == size) {
            arrived = 0;
            ++generation;
            cv.notify_all();
            return;
        }
        cv.wait(lock, [&] { return generation != gen || root->aborted; });
        OSPREY_CHECK(generation != gen, "communicator aborted: another rank failed");
    }
};

std::shared_ptr<Group> new_group(int n, const std::shared_ptr<Root>& root) {
    auto g = std::make_shared<Group>(n, root);
    std::lock_guard lock(root->mu);
    std::erase_if(root->groups, [](const auto& w) { return w.expired(); });
    root->groups.push_back(g);
    return g;
}

class InProcess final : public Communicator {
public:
    InProcess(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}

    int rank() const override { return rank_; }
    int size() const override { return g_->size; }
    std::string kind() const override { return "in-process"; }

    void all_reduce_sum(std::span<float> data) override {
        const int n = g_->size;
        if (n == 1) return;
        g_->ptrs[size_t(rank_)] = data.data();
        g_->sizes[size_t(rank_)] = data.size();
        if (rank_ == 0) g_->result.resize(data.size());
        g_->barrier();
        for (int r = 0; r < n; ++r)
            OSPREY_CHECK(g_->sizes[size_t(r)] == data.size(), "all_reduce_sum: rank ", r, " sends ",
                         g_->sizes[size_t(r)], " elements, rank ", rank_, " ", data.size());
        // Two-shot: this rank sums its slice over all ranks, in rank order, into the shared result.
        const size_t len = data.size(), lo = len * size_t(rank_) / size_t(n), hi = len * size_t(rank_ + 1) / size_t(n);
        float* out = g_->result.data();
        const float* first = static_cast<const float*>(g_->ptrs[0]);
        for (size_t i = lo; i < hi; ++i) out[i] = first[i];
        for (int r = 1; r < n; ++r) {
            const float* x = static_cast<const float*>(g_->ptrs[size_t(r)]);
            for (size_t i = lo; i < hi; ++i) out[i] += x[i];
        }
        g_->barrier();
        std::copy_n(g_->result.data(), len, data.data());
        g_->barrier();  // the result and the posted pointers are free again
    }

    void all_gather_bytes(const void* in, void* out, std::span<const size_t> counts) override {
        const int n = g_->size;
        OSPREY_CHECK(int(counts.size()) == n, "all_gather: ", counts.size(), " counts for ", n, " ranks");
        g_->ptrs[size_t(rank_)] = const_cast<void*>(in);
        g_->barrier();
        size_t offset = 0;
        for (int r = 0; r < n; ++r) {
            if (counts[size_t(r)] > 0)
                std::memcpy(static_cast<uint8_t*>(out) + offset, g_->ptrs[size_t(r)], counts[size_t(r)]);
            offset += counts[size_t(r)];
        }
        g_->barrier();
    }

    void broadcast_bytes(void* data, size_t bytes, int root) override {
        const int n = g_->size;
        OSPREY_CHECK(root >= 0 && root < n, "broadcast: root ", root, " outside [0, ", n, ")");
        if (n == 1) return;
        g_->ptrs[size_t(rank_)] = data;
        g_->sizes[size_t(rank_)] = bytes;
        g_->barrier();
        OSPREY_CHECK(g_->sizes[size_t(root)] == bytes, "broadcast: root sends ", g_->sizes[size_t(root)],
                     " bytes, rank ", rank_, " expects ", bytes);
        if (rank_ != root && bytes > 0) std::memcpy(data, g_->ptrs[size_t(root)], bytes);
        g_->barrier();
    }

    void barrier() override { g_->barrier(); }

    std::unique_ptr<Communicator> split(int color, int key) override {
        g_->split_keys[size_t(rank_)] = {color, key};
        g_->barrier();
        std::vector<std::pair<int, int>> members;  // (key, rank) of this colour
        for (int r = 0; r < g_->size; ++r)
            if (g_->split_keys[size_t(r)].first == color) members.emplace_back(g_->split_keys[size_t(r)].second, r);
        std::sort(members.begin(), members.end());
        const int leader = members.front().second;
        int new_rank = 0;
        while (members[size_t(new_rank)].second != rank_) ++new_rank;
        if (rank_ == leader) g_->made[size_t(rank_)] = new_group(int(members.size()), g_->root);
        g_->barrier();
        std::shared_ptr<Group> group = g_->made[size_t(leader)];
        g_->barrier();  // every rank has its group before the leader's slot is reused
        if (rank_ == leader) g_->made[size_t(rank_)].reset();
        return std::make_unique<InProcess>(std::move(group), new_rank);
    }

    void abort() override {
        const std::shared_ptr<Root>& root = g_->root;
        root->aborted = true;
        std::vector<std::shared_ptr<Group>> live;
        {
            std::lock_guard lock(root->mu);
            for (const auto& w : root->groups)
                if (auto g = w.lock()) live.push_back(std::move(g));
        }
        for (const auto& g : live) {
            std::lock_guard lock(g->mu);  // a waiter between its check and its wait sees the flag
            g->cv.notify_all();
        }
    }

private:
    std::shared_ptr<Group> g_;
    int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int n) {
    OSPREY_CHECK(n >= 1 && n <= 4096, "in-process communicator: ", n, " ranks");
    auto root = std::make_shared<Root>();
    std::shared_ptr<Group> g = new_group(n, root);
    std::vector<std::unique_ptr<Communicator>> out;
    for (int r = 0; r < n; ++r) out.push_back(std::make_unique<InProcess>(g, r));
    return out;
}

std::unique_ptr<Communicator> make_single_rank() {
    return std::move(make_in_process_group(1).front());
}

}  // namespace osprey::comm
