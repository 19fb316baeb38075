// GPU sampler (kernels/cuda/sampling.h) at the real vocabulary (201088) for batches 1..128: the kernel
// alone (CUDA events) and the whole Sampler::sample call (pack, upload, kernel, copy back, sync; wall
// clock). Bytes count one read of the logits (the kernel reads each row a few times, mostly from L2),
// so the bandwidth column is a lower bound on the traffic. Input sets rotate so that the logits read
// by consecutive runs total more than the 60 MB L2.
//   usage: bench_sampling [iters]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "kernels/cuda/sampling.h"

using namespace osprey;
using cuda::DeviceBuffer;

namespace {

constexpr int kVocab = 201088;

// Peaked rows (a next-token distribution: a few tokens 16-21 above a N(0, 2) background) or broad
// rows (N(0, 1): the worst case for top-p, whose nucleus then spans most of the vocabulary).
std::vector<float> make_logits(int n_rows, bool peaked, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, peaked ? 2.0f : 1.0f);
    std::vector<float> x(size_t(n_rows) * kVocab);
    for (auto& v : x) v = normal(rng);
    if (peaked)
        for (int r = 0; r < n_rows; ++r)
            for (int i = 0; i < 6; ++i) x[size_t(r) * kVocab + rng() % kVocab] += 16.0f + float(i);
    return x;
}

struct Config {
    const char* name;
    bool peaked;
    SamplingParams params;
    bool history;  // 2000 prompt + 200 output ids per row
};

std::vector<Config> configs() {
    std::vector<Config> c;
    SamplingParams p;
    p.temperature = 0.0f;
    c.push_back({"greedy", true, p, false});
    p = {}, p.temperature = 0.8f;
    c.push_back({"temperature 0.8", true, p, false});
    p = {}, p.temperature = 0.8f, p.top_k = 50;
    c.push_back({"top_k 50", true, p, false});
    p = {}, p.top_p = 0.9f;
    c.push_back({"top_p 0.9 (peaked)", true, p, false});
    p = {}, p.top_p = 0.9f, p.top_logprobs = 20, p.logprobs = true;
    c.push_back({"top_p 0.9 + top_logprobs 20", true, p, false});
    p = {}, p.top_p = 0.9f, p.repetition_penalty = 1.1f, p.frequency_penalty = 0.3f, p.presence_penalty = 0.3f;
    c.push_back({"top_p 0.9 + penalties (2200 ids)", true, p, true});
    p = {}, p.top_p = 0.9f;
    c.push_back({"top_p 0.9 (broad N(0,1), worst case)", false, p, false});
    return c;
}

}  // namespace

int main(int argc, char** argv) {
    const int iters = argc > 1 ? std::atoi(argv[1]) : 30;
    std::printf("GPU sampler, vocab %d, %s (median of %d runs)\n", kVocab, cuda::device_name().c_str(), iters);
    std::mt19937 rng(7);
    std::vector<int32_t> prompt(2000), output(200);
    for (auto& t : prompt) t = int(rng() % kVocab);
    for (auto& t : output) t = int(rng() % 5000);
    for (const int batch : {1, 8, 32, 64, 128}) {
        const size_t row_bytes = size_t(kVocab) * sizeof(float);
        const int n_sets = int(std::max<size_t>(2, (120u << 20) / (size_t(batch) * row_bytes) + 1));
        for (const Config& cfg : configs()) {
            // Input sets: the same host logits pattern per set is fine, the point is L2 eviction.
            const std::vector<float> host = make_logits(batch, cfg.peaked, rng);
            std::vector<DeviceBuffer<float>> sets;
            for (int s = 0; s < n_sets; ++s) {
                sets.emplace_back(host.size());
                sets.back().upload(host);
            }
            std::vector<SamplingParams> params(size_t(batch), cfg.params);
            std::vector<SamplingState> states(static_cast<size_t>(batch));
            for (int r = 0; r < batch; ++r) {
                params[size_t(r)].seed = uint64_t(r);
                if (cfg.history) states[size_t(r)] = {prompt.data(), 2000, output.data(), 200, 0};
            }
            std::vector<SampleResult> out(static_cast<size_t>(batch));
            cuda::Sampler sampler;

            // Whole call, wall clock (includes packing, uploads, the copy back and the sync).
            std::vector<double> wall;
            for (int i = 0; i < iters + 3; ++i) {
                for (auto& s : states) s.step = uint64_t(i);
                const auto t0 = std::chrono::steady_clock::now();
                sampler.sample(sets[size_t(i % n_sets)].get(), kVocab, 0, params, states, out, nullptr);
                const auto t1 = std::chrono::steady_clock::now();
                if (i >= 3) wall.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
            }
            std::sort(wall.begin(), wall.end());

            // Kernel alone on the packed parameters.
            cuda::SamplePack pack;
            cuda::pack_sample_rows(params, states, kVocab, pack);
            DeviceBuffer<cuda::SampleRowParams> d_params(pack.rows.size());
            d_params.upload(pack.rows);
            DeviceBuffer<cuda::SampleRowResult> d_out(static_cast<size_t>(batch));
            DeviceBuffer<int32_t> d_hist(std::max<size_t>(1, pack.history.size()));
            if (!pack.history.empty()) d_hist.upload(pack.history);
            const size_t work = std::max<size_t>(1, size_t(pack.n_work_rows) * kVocab);
            DeviceBuffer<float> d_work(work);
            DeviceBuffer<uint32_t> d_counts(work);
            d_counts.fill_bytes(0);
            const double us = bench::time_us(
                [&](int i) {
                    cuda::sample_rows({.out = d_out.get(), .logits = sets[size_t(i % n_sets)].get(), .n_rows = batch,
                                       .vocab_size = kVocab, .params = d_params.get(), .history = d_hist.get(),
                                       .work = d_work.get(), .counts = d_counts.get()},
                                      nullptr);
                },
                iters);
            const std::string what = "batch " + std::to_string(batch) + " " + cfg.name;
            bench::report(what.c_str(), us, double(batch) * double(row_bytes), 0.0);
            std::printf("%-48s %10.2f us whole Sampler::sample call (wall)\n", "", wall[wall.size() / 2]);
        }
    }
    return 0;
}
