// Proposers and the acceptance rule (see speculative.h).
#include "engine/speculative.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "engine/draft_model.h"

namespace osprey::engine {

const char* spec_method_name(SpecMethod m) {
    switch (m) {
        case SpecMethod::none:
            return "none";
        case SpecMethod::ngram:
            return "ngram";
        case SpecMethod::draft:
            return "draft";
        case SpecMethod::eagle3:
            return "eagle3";
    }
    return "?";
}

SpecMethod parse_spec_method(const std::string& name) {
    if (name.empty() || name == "none" || name == "off") return SpecMethod::none;
    if (name == "ngram") return SpecMethod::ngram;
    if (name == "draft") return SpecMethod::draft;
    if (name == "eagle3") return SpecMethod::eagle3;
    OSPREY_FAIL("unknown speculative method '", name, "' (none, ngram, draft or eagle3)");
}

void SpeculativeOptions::validate() const {
    if (!enabled()) return;
    OSPREY_CHECK(num_tokens >= 1 && num_tokens <= 16, "--num-speculative-tokens must be in [1, 16], got ", num_tokens);
    OSPREY_CHECK(ngram_min >= 1 && ngram_max >= ngram_min && ngram_max <= 64, "n-gram sizes must satisfy 1 <= min (",
                 ngram_min, ") <= max (", ngram_max, ") <= 64");
    OSPREY_CHECK(forced_accept_len <= num_tokens, "--forced-accept-len ", forced_accept_len, " exceeds k = ",
                 num_tokens);
    OSPREY_CHECK(forced_accept_fraction <= 1.0, "--forced-accept-fraction must be <= 1, got ", forced_accept_fraction);
    OSPREY_CHECK(verify_token_cost > 0.0 && probe_share >= 0.0 && probe_share < 1.0,
                 "speculative policy: verify_token_cost must be > 0 and probe_share in [0, 1), got ", verify_token_cost,
                 ", ", probe_share);
    OSPREY_CHECK(!(forced_accept_len >= 0 && forced_accept_fraction >= 0.0),
                 "--forced-accept-len and --forced-accept-fraction exclude each other");
    if (custom) return;
    OSPREY_CHECK(method != SpecMethod::draft || draft_runner != nullptr, "--speculative draft needs --draft-model");
    OSPREY_CHECK(method != SpecMethod::eagle3 || !eagle3_dir.empty(), "--speculative eagle3 needs --eagle3-model");
}

SpecPolicy::SpecPolicy(double verify_token_cost, double probe_share)
    : r_(verify_token_cost), epsilon_(probe_share), accepted_(4.0), proposed_(4.0) {
    OSPREY_CHECK(r_ > 0.0 && epsilon_ >= 0.0, "SpecPolicy: cost ", r_, ", probe share ", epsilon_);
}

double SpecPolicy::break_even(int n_decodes) const {
    const double br = double(std::max(n_decodes, 1)) * r_;
    return br / (1.0 + br);
}

int SpecPolicy::step_budget(int n_decodes, int k) {
    probing_ = !pays(n_decodes);
    if (!probing_) return INT_MAX;
    // Probe tokens worth epsilon of a step of B tokens: epsilon (1 + B r) / r. The allowance keeps
    // at most one step's growth beyond a whole proposal, so a long pause is not followed by a burst.
    const double per_step = epsilon_ * (1.0 + double(std::max(n_decodes, 1)) * r_) / r_;
    allowance_ = std::min(allowance_ + per_step, double(std::max(k, 1)) + per_step);
    return int(allowance_);
}

void SpecPolicy::spend(int n_tokens) {
    if (probing_) allowance_ = std::max(0.0, allowance_ - double(n_tokens));
}

void SpecPolicy::observe(int n_proposed, int n_accepted) {
    if (n_proposed <= 0) return;
    const double decay = std::pow(1.0 - 1.0 / kMemoryTokens, double(n_proposed));
    accepted_ = accepted_ * decay + double(n_accepted);
    proposed_ = proposed_ * decay + double(n_proposed);
}

std::vector<int32_t> ngram_propose(std::span<const int32_t> tokens, int ngram_min, int ngram_max, int max_tokens) {
    const int n_tok = int(tokens.size());
    for (int n = std::min(ngram_max, n_tok - 1); n >= ngram_min; --n) {
        const int32_t* suffix = tokens.data() + (n_tok - n);
        // The latest earlier occurrence whose continuation exists: start j, j + n <= n_tok - 1.
        for (int j = n_tok - n - 1; j >= 0; --j) {
            if (!std::equal(suffix, suffix + n, tokens.data() + j)) continue;
            const int from = j + n, to = std::min(n_tok, from + max_tokens);
            return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
        }
    }
    return {};
}

namespace {

class NgramProposer : public Proposer {
public:
    explicit NgramProposer(const SpeculativeOptions& o) : min_(o.ngram_min), max_(o.ngram_max) {}
    std::string name() const override { return "ngram"; }
    void propose(std::span<DraftRequest> requests) override {
        for (DraftRequest& r : requests) *r.out = ngram_propose(r.tokens, min_, max_, r.max_tokens);
    }

private:
    int min_, max_;
};

uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

}  // namespace

int spec_backoff_pause(uint64_t seq_uid, int misses) {
    constexpr int kMaxPauseLog2 = 6;  // 64 tokens
    const int p = 1 << std::clamp(misses - 2, 0, kMaxPauseLog2);
    const int jitter = int(mix64(seq_uid * 0x100000001B3ull + uint64_t(misses)) % uint64_t(p));
    return p - p / 2 + jitter;
}

std::shared_ptr<Proposer> make_proposer(const SpeculativeOptions& options) {
    options.validate();
    if (options.custom) return options.custom;
    switch (options.method) {
        case SpecMethod::none:
            return nullptr;
        case SpecMethod::ngram:
            return std::make_unique<NgramProposer>(options);
        case SpecMethod::draft:
            return make_draft_model_proposer(options);
        case SpecMethod::eagle3:
            OSPREY_FAIL("--speculative eagle3: the EAGLE-3 head is not implemented in the engine yet (docs/speculative.md)");
    }
    return nullptr;
}

int32_t accept_draft(std::span<const float> p, std::span<const float> q, int32_t d, double u_accept,
                     double u_resample, bool* accepted) {
    OSPREY_CHECK(p.size() == q.size() && d >= 0 && size_t(d) < p.size(), "accept_draft: bad distributions or token");
    const double pd = p[size_t(d)], qd = q[size_t(d)];
    // q(d) > 0 since d was drawn from q; p(d) >= q(d) accepts always.
    if (qd > 0.0 && u_accept * qd < pd) {
        *accepted = true;
        return d;
    }
    *accepted = false;
    double total = 0.0;
    for (size_t v = 0; v < p.size(); ++v) total += std::max(0.0, double(p[v]) - double(q[v]));
    if (total <= 0.0) {  // p == q: rejection has probability 0; fall back to a draw from p
        double c = 0.0, t = u_resample;
        for (size_t v = 0; v < p.size(); ++v)
            if ((c += p[v]) > t) return int32_t(v);
        return d;
    }
    const double target = u_resample * total;
    double c = 0.0;
    int32_t last = -1;
    for (size_t v = 0; v < p.size(); ++v) {
        const double m = std::max(0.0, double(p[v]) - double(q[v]));
        if (m <= 0.0) continue;
        last = int32_t(v);
        if ((c += m) > target) return int32_t(v);
    }
    return last;  // rounding: the last token with mass
}

bool forced_accept(const SpeculativeOptions& o, int i, uint64_t seed, uint64_t step) {
    if (o.forced_accept_len >= 0) return i < o.forced_accept_len;
    if (o.forced_accept_fraction >= 0.0) {
        const uint64_t h = mix64(seed ^ mix64(step * 0x100000001B3ull + uint64_t(i) + 0x5bd1e995ull));
        return double(h >> 11) * 0x1.0p-53 < o.forced_accept_fraction;
    }
    return false;
}

}  // namespace osprey::engine
