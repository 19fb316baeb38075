// Runs the sampling kernel's device code (extracted from src/kernels/cuda/sampling.cu into
// sampling_emulated.h by scripts/emulate_sampling_kernel.sh) on the CPU emulation (cuda_emulation.h) and
// compares every row with the CPU sampler: random parameters over small vocabularies around the tile
// constants, flat and broad rows that take the walk's skip path, degenerate rows.
//   usage: emulate_sampling [seed]
#include "sampling_emulated.h"
#include "kernels/cpu/sampling.h"
#include <cstdio>
#include <cstdlib>
#include <random>
#include <random>
using namespace osprey;
constexpr float kInf = INFINITY;
int fails = 0, total = 0;
void run(const std::vector<float>& logits, int vocab, const std::vector<SamplingParams>& params, const std::vector<SamplingState>& states, const char* tag) {
    cuda::SamplePack pack; cuda::pack_sample_rows(params, states, vocab, pack);
    const int n = int(params.size());
    std::vector<cuda::SampleRowResult> out(n);
    for (auto& o : out) { o.token = -7; o.n_top = -7; }
    std::vector<int32_t> bi = pack.bias_ids, hi = pack.history; std::vector<float> bv = pack.bias_values;
    if (bi.empty()) bi.push_back(0), bv.push_back(0); if (hi.empty()) hi.push_back(0);
    size_t work = std::max<size_t>(1, size_t(pack.n_work_rows) * vocab);
    std::vector<float> w(work, NAN); std::vector<uint32_t> c(work, 0);
    cuda::SampleRowsArgs a{.out = out.data(), .logits = logits.data(), .n_rows = n, .vocab_size = vocab, .ld = 0, .params = pack.rows.data(), .bias_ids = bi.data(), .bias_values = bv.data(), .history = hi.data(), .work = w.data(), .counts = c.data()};
    cuda::emu_launch(a);
    for (auto x : c) if (x) { std::printf("%s: counts not zero\n", tag); ++fails; break; }
    std::vector<SampleResult> want(n);
    cpu::sample_rows(logits, vocab, params, states, want);
    for (int r = 0; r < n; ++r) {
        ++total;
        const auto& g = out[r]; const auto& p = params[r];
        bool bad = g.error != 0 || g.token != want[r].token || !(std::abs(g.logprob - want[r].logprob) <= 1e-4 || g.logprob == want[r].logprob);
        if (g.n_top != int(want[r].top.size())) bad = true;
        else for (int i = 0; i < g.n_top; ++i) if (g.top_ids[i] != want[r].top[i].first || !(std::abs(g.top_logprobs[i] - want[r].top[i].second) <= 1e-4 || g.top_logprobs[i] == want[r].top[i].second)) bad = true;
        if (bad) { ++fails; std::printf("%s row %d vocab %d: got tok %d lp %g ntop %d err %d; want tok %d lp %g ntop %zu | T %g k %d p %g minp %g rep %g f %g pr %g nb %zu\n", tag, r, vocab, g.token, g.logprob, g.n_top, g.error, want[r].token, want[r].logprob, want[r].top.size(), p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.frequency_penalty, p.presence_penalty, p.logit_bias.size()); }
    }
}
int main(int argc, char** argv) {
    std::mt19937 rng(argc > 1 ? std::atoi(argv[1]) : 1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int vocab : {5, 511, 512, 513, 2047, 2048, 2049, 5000}) {
        for (int rep = 0; rep < 2; ++rep) {
        const int n = 12;
        std::vector<std::vector<int32_t>> pr(n), ou(n);
        std::vector<SamplingParams> params(n); std::vector<SamplingState> states(n);
        auto pick = [&](auto... v) { const std::vector<std::common_type_t<decltype(v)...>> xs{v...}; return xs[rng() % xs.size()]; };
        std::vector<float> x(size_t(n) * vocab);
        for (int r = 0; r < n; ++r) {
            SamplingParams& p = params[r];
            p.temperature = pick(0.0f, 0.6f, 1.0f, 1.0f, 1.3f);
            p.top_k = pick(0, 0, 1, 5, 50, 2047, 2048, 3000);
            p.top_p = pick(1.0f, 1.0f, 0.95f, 0.7f, 0.3f);
            p.min_p = pick(0.0f, 0.0f, 0.05f, 0.3f);
            p.repetition_penalty = pick(1.0f, 1.0f, 1.2f, 0.8f);
            p.frequency_penalty = pick(0.0f, 0.0f, 0.5f, -0.3f);
            p.presence_penalty = pick(0.0f, 0.0f, 0.7f);
            p.top_logprobs = pick(0, 0, 1, 5, 20);
            p.seed = rng();
            int nb = pick(0, 0, 1, 4);
            for (int i = 0; i < nb; ++i) p.logit_bias.emplace_back(int(rng() % vocab), pick(-100.0f, -2.0f, 1.5f, 5.0f));
            if (nb > 1) p.logit_bias.push_back(p.logit_bias[0]);
            int np = pick(0, 3, 40, 700), no = pick(0, 1, 30, 600);
            for (int i = 0; i < np; ++i) pr[r].push_back(int(rng() % std::min(vocab, 64)));
            for (int i = 0; i < no; ++i) ou[r].push_back(int(rng() % std::min(vocab, 64)));
            states[r] = {pr[r].data(), np, ou[r].data(), no, rng() % 1000};
            float* row = x.data() + size_t(r) * vocab;
            int kind = rng() % 5;
            for (int t = 0; t < vocab; ++t) row[t] = (kind == 0 ? 3.0f : 1.0f) * normal(rng);
            if (kind == 0) for (int i = 0; i < 8; ++i) row[rng() % vocab] += 12.0f + i;
            if (kind == 2) for (int t = 0; t < vocab; ++t) row[t] = std::round(row[t] * 2) / 2;
            if (kind == 3) { row[rng() % vocab] = NAN; row[rng() % vocab] = -kInf; row[rng() % vocab] = -0.0f; }
            if (kind == 4) for (int t = 0; t < vocab; ++t) row[t] = 0.25f;
        }
        run(x, vocab, params, states, "random");
        }
    }
    {  // flat and broad rows: multi-chunk walks and the skip path (vocab 20000 > kSkipMid)
        const int vocab = 20000;
        std::vector<SamplingParams> params(7);
        std::vector<SamplingState> states(7);
        params[0].top_p = 0.5f;
        params[1].top_k = 15000;
        params[2].top_k = 15000, params[2].top_p = 0.3f;
        params[3].min_p = 0.5f, params[3].top_logprobs = 20;
        params[4].top_p = 0.999f, params[4].temperature = 0.5f;
        params[5].top_k = 3, params[5].top_logprobs = 20;
        params[6].top_p = 0.95f, params[6].temperature = 1.5f;
        for (size_t r = 0; r < params.size(); ++r) params[r].seed = rng(), states[r].step = r;
        std::vector<float> logits(params.size() * vocab, 0.25f);
        for (int t = 0; t < vocab; t += 7) logits[size_t(4) * vocab + size_t(t)] = 0.0f;
        for (int t = 0; t < vocab; ++t) logits[size_t(6) * vocab + t] = normal(rng);
        run(logits, vocab, params, states, "flat");
    }
    { // degenerate
        const int vocab = 3000;
        std::vector<float> logits(4 * size_t(vocab), 0.0f);
        std::fill(logits.begin(), logits.begin() + vocab, NAN);
        for (int t = 0; t < vocab; ++t) logits[size_t(vocab) + t] = -kInf;
        logits[size_t(vocab) + 17] = 1.0f;
        logits[2 * size_t(vocab) + 5] = kInf, logits[2 * size_t(vocab) + 9] = kInf;
        std::vector<SamplingParams> params(4); std::vector<SamplingState> states(4);
        for (auto& p : params) p.top_logprobs = 3, p.top_p = 0.9f;
        params[1].logit_bias = {{17, -kInf}};
        params[3].logit_bias = {{2999, kInf}};
        params[3].temperature = 0.0f;
        run(logits, vocab, params, states, "degenerate");
    }
    std::printf("%d rows, %d failures\n", total, fails);
    return fails != 0;
}
