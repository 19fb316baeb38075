// Format accuracy against a baseline runner (see format_accuracy.h).
#include "model/format_accuracy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>

#include "core/check.h"

namespace osprey::model {

namespace {

// One runner's single sequence: page table over the whole run, ring slot 0.
struct Run {
    ModelRunner& m;
    std::vector<int32_t> pages;
    int n_computed = 0;

    // Runs tokens[n_computed, n_computed + n) as one step with logits for the last `n_logits`.
    std::vector<float> step(const std::vector<int32_t>& tokens, int n, int n_logits) {
        ForwardBatch b;
        b.tokens.assign(tokens.begin() + n_computed, tokens.begin() + n_computed + n);
        SequenceSlice sl;
        sl.n_tokens = n;
        sl.start_pos = n_computed;
        sl.window_slot = 0;
        sl.window_first = 0;
        sl.pages = pages;
        sl.n_logits = n_logits;
        b.slices.push_back(sl);
        m.forward(b);
        n_computed += n;
        std::vector<float> logits;
        m.logits_to_host(logits);
        return logits;
    }
};

// Captured intermediates of one forward: (step, layer) -> values.
using Dumps = std::map<std::pair<std::string, int>, std::vector<float>>;

int argmax(const float* x, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return best;
}

// KL(p || q) of the softmaxes of two logit rows, in double.
double kl_divergence(const float* base, const float* cand, int n) {
    const double mb = *std::max_element(base, base + n), mc = *std::max_element(cand, cand + n);
    double zb = 0, zc = 0;
    for (int i = 0; i < n; ++i) zb += std::exp(double(base[i]) - mb), zc += std::exp(double(cand[i]) - mc);
    const double lzb = std::log(zb) + mb, lzc = std::log(zc) + mc;
    double kl = 0;
    for (int i = 0; i < n; ++i) {
        const double lp = double(base[i]) - lzb, lq = double(cand[i]) - lzc;
        kl += std::exp(lp) * (lp - lq);
    }
    return std::max(0.0, kl);
}

// The top-k expert set of each row of router logits [rows, n_experts], ids ascending.
std::vector<std::vector<int>> topk_sets(const std::vector<float>& logits, int n_experts, int k) {
    const int rows = int(logits.size()) / n_experts;
    std::vector<std::vector<int>> out(static_cast<size_t>(rows));
    std::vector<int> ids(static_cast<size_t>(n_experts));
    for (int r = 0; r < rows; ++r) {
        const float* x = logits.data() + size_t(r) * n_experts;
        std::iota(ids.begin(), ids.end(), 0);
        std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                          [&](int a, int b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
        out[size_t(r)].assign(ids.begin(), ids.begin() + k);
        std::sort(out[size_t(r)].begin(), out[size_t(r)].end());
    }
    return out;
}

}  // namespace

double AccuracyReport::max_step_error(const std::string& step) const {
    double m = 0;
    for (const StepError& e : steps)
        if (e.step == step) m = std::max(m, e.rel_l2);
    return m;
}

std::string AccuracyReport::table() const {
    std::string s;
    char line[160];
    if (!steps.empty()) {
        s += "per-layer relative L2 error (teacher-forced tokens, errors compound through the layers):\n";
        s += "  layer  step            rel_l2\n";
        for (const StepError& e : steps) {
            std::snprintf(line, sizeof line, "  %5d  %-14s  %.3e\n", e.layer, e.step.c_str(), e.rel_l2);
            s += line;
        }
        std::snprintf(line, sizeof line, "routing: %lld of %lld (position, layer) pairs picked another expert set\n",
                      (long long)routing_flips, (long long)routing_total);
        s += line;
    }
    std::snprintf(line, sizeof line,
                  "next token over %d positions: mean KL %.3e nats, max KL %.3e, top-1 agreement %.4f\n", positions,
                  mean_kl, max_kl, top1_agreement);
    s += line;
    std::snprintf(line, sizeof line, "greedy over %d tokens: %d equal before the first difference, agreement %.4f\n",
                  greedy_tokens, greedy_common_prefix, greedy_agreement);
    s += line;
    return s;
}

json::Value AccuracyReport::to_json() const {
    json::Value j{json::Object{}};
    json::Array st;
    for (const StepError& e : steps) {
        json::Value v{json::Object{}};
        v.set("layer", e.layer);
        v.set("step", e.step);
        v.set("rel_l2", e.rel_l2);
        st.push_back(v);
    }
    j.set("steps", st);
    j.set("positions", positions);
    j.set("mean_kl", mean_kl);
    j.set("max_kl", max_kl);
    j.set("top1_agreement", top1_agreement);
    j.set("routing_flips", routing_flips);
    j.set("routing_total", routing_total);
    j.set("greedy_tokens", greedy_tokens);
    j.set("greedy_common_prefix", greedy_common_prefix);
    j.set("greedy_agreement", greedy_agreement);
    return j;
}

AccuracyReport compare_formats(ModelRunner& base, ModelRunner& cand, const AccuracyOptions& o,
                               const DumpHook& hook_base, const DumpHook& hook_cand) {
    const Config& c = base.config();
    const int V = c.vocab_size;
    OSPREY_CHECK(cand.config().vocab_size == V && cand.config().n_layers == c.n_layers,
                 "accuracy: the two runners hold different models");
    OSPREY_CHECK(o.positions >= 1 && o.chunk >= 1 && o.prompt_tokens >= 1 && o.greedy_tokens >= 0 &&
                     o.prompt_tokens <= o.positions,
                 "accuracy: bad options (positions ", o.positions, ", chunk ", o.chunk, ", prompt ", o.prompt_tokens,
                 ", greedy ", o.greedy_tokens, ")");
    const int total = std::max(o.positions, o.prompt_tokens + o.greedy_tokens);
    const int n_pages = (total + o.page_size - 1) / o.page_size + 1;
    for (ModelRunner* m : {&base, &cand}) m->allocate_kv(kv_layout_for(*m, o.page_size, n_pages, 1));
    std::vector<int32_t> pages(static_cast<size_t>(n_pages));
    std::iota(pages.begin(), pages.end(), 0);

    // A seeded random prompt over the ordinary (non-special) ids.
    std::mt19937_64 rng(o.seed);
    std::uniform_int_distribution<int32_t> pick(0, std::min(V, 199998) - 1);
    std::vector<int32_t> tokens(size_t(o.positions));
    for (int32_t& t : tokens) t = pick(rng);

    AccuracyReport r;
    r.positions = o.positions;
    Dumps dumps[2];
    if (hook_base && hook_cand) {
        hook_base([&](std::string_view step, int layer, std::span<const float> v) {
            dumps[0][{std::string(step), layer}].assign(v.begin(), v.end());
        });
        hook_cand([&](std::string_view step, int layer, std::span<const float> v) {
            dumps[1][{std::string(step), layer}].assign(v.begin(), v.end());
        });
    }
    // Teacher-forced: both read `tokens` chunk by chunk, logits at every position.
    std::map<std::pair<std::string, int>, std::pair<double, double>> sums;  // (Σ diff², Σ base²)
    Run rb{base, pages}, rc{cand, pages};
    double kl_sum = 0;
    int agree = 0;
    for (int done = 0; done < o.positions;) {
        const int n = std::min(o.chunk, o.positions - done);
        const std::vector<float> lb = rb.step(tokens, n, n), lc = rc.step(tokens, n, n);
        OSPREY_CHECK(lb.size() == size_t(n) * V && lc.size() == lb.size(), "accuracy: logits of ", lb.size(), " and ",
                     lc.size(), " values for ", n, " rows");
        for (int i = 0; i < n; ++i) {
            const float* b = lb.data() + size_t(i) * V;
            const float* q = lc.data() + size_t(i) * V;
            const double kl = kl_divergence(b, q, V);
            kl_sum += kl;
            r.max_kl = std::max(r.max_kl, kl);
            agree += argmax(b, V) == argmax(q, V);
        }
        for (const auto& [key, vb] : dumps[0]) {
            auto it = dumps[1].find(key);
            if (it == dumps[1].end() || it->second.size() != vb.size()) continue;
            auto& [d2, b2] = sums[key];
            for (size_t i = 0; i < vb.size(); ++i) {
                const double d = double(it->second[i]) - double(vb[i]);
                d2 += d * d;
                b2 += double(vb[i]) * double(vb[i]);
            }
            if (key.first == "router_logits") {
                const auto sb = topk_sets(vb, c.n_experts, c.top_k), sc = topk_sets(it->second, c.n_experts, c.top_k);
                for (size_t t = 0; t < sb.size(); ++t) r.routing_flips += sb[t] != sc[t];
                r.routing_total += int64_t(sb.size());
            }
        }
        dumps[0].clear();
        dumps[1].clear();
        done += n;
    }
    if (hook_base && hook_cand) {
        hook_base(nullptr);
        hook_cand(nullptr);
    }
    r.mean_kl = kl_sum / o.positions;
    r.top1_agreement = double(agree) / o.positions;
    // Steps in model order: layers ascending, the embedding first and the logits last.
    for (const auto& [key, s] : sums)
        if (key.first != "embedding")
            r.steps.push_back({key.first, key.second, s.second > 0 ? std::sqrt(s.first / s.second) : 0.0});
    static const std::vector<std::string> order = {
        "attn_norm",     "q",   "k",         "v",          "attn",  "attn_out", "resid_attn", "mlp_norm",
        "router_logits", "moe", "resid_mlp", "final_norm", "logits"};
    auto rank = [](const StepError& e) {
        const auto it = std::find(order.begin(), order.end(), e.step);
        return std::pair{e.layer < 0 ? 1 << 20 : e.layer, int(it - order.begin())};
    };
    std::sort(r.steps.begin(), r.steps.end(),
              [&](const StepError& a, const StepError& b) { return rank(a) < rank(b); });

    // Greedy: each runner continues the first prompt_tokens tokens with its own argmax.
    r.greedy_tokens = o.greedy_tokens;
    for (int side = 0; side < 2 && o.greedy_tokens > 0; ++side) {
        Run run{side == 0 ? base : cand, pages};
        std::vector<int32_t> seq(tokens.begin(), tokens.begin() + o.prompt_tokens);
        std::vector<float> logits = run.step(seq, o.prompt_tokens, 1);
        std::vector<int32_t>& out = side == 0 ? r.base_tokens : r.cand_tokens;
        for (int i = 0; i < o.greedy_tokens; ++i) {
            const int32_t t = argmax(logits.data(), V);
            out.push_back(t);
            seq.push_back(t);
            if (i + 1 < o.greedy_tokens) logits = run.step(seq, 1, 1);
        }
    }
    int equal = 0;
    bool diverged = false;
    for (int i = 0; i < o.greedy_tokens; ++i) {
        const bool same = r.base_tokens[size_t(i)] == r.cand_tokens[size_t(i)];
        equal += same;
        if (!same) diverged = true;
        if (!diverged) ++r.greedy_common_prefix;
    }
    r.greedy_agreement = o.greedy_tokens > 0 ? double(equal) / o.greedy_tokens : 1.0;
    return r;
}

}  // namespace osprey::model
