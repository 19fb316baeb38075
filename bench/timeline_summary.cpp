#include "timeline_summary.h"

#include <algorithm>
#include <map>
#include <utility>

namespace osprey::bench {
namespace {

std::string kernel_name(uint32_t tag) {
    switch (tag & 0xFF) {
        case cuda::kTlAttention: return "attention";
        case cuda::kTlMoeMlp1: return "moe mlp1";
        case cuda::kTlMoeMlp2: return "moe mlp2";
        default: return "gemv n_out " + std::to_string(tag >> 8);
    }
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Call {
    uint32_t tag = 0;
    std::vector<const cuda::TimelineRec*> r;
    double first_wait = 1e300, last_exit = 0;
};

}  // namespace

std::vector<TimelineRow> summarize_timeline(const std::vector<cuda::TimelineRec>& recs, int n_replays) {
    std::map<std::pair<uint32_t, const void*>, std::vector<const cuda::TimelineRec*>> groups;
    for (const auto& r : recs) groups[{r.tag, r.key}].push_back(&r);
    std::vector<Call> calls;
    for (auto& [k, v] : groups) {
        std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->enter < b->enter; });
        for (size_t i = 0; i < v.size(); ++i) {
            if (i == 0 || v[i]->enter > v[i - 1]->enter + 100000) calls.push_back(Call{k.first, {}});
            Call& c = calls.back();
            c.r.push_back(v[i]);
            c.first_wait = std::min(c.first_wait, double(v[i]->wait));
            c.last_exit = std::max(c.last_exit, double(v[i]->exit));
        }
    }
    if (calls.empty()) return {};
    std::sort(calls.begin(), calls.end(), [](const Call& a, const Call& b) { return a.first_wait < b.first_wait; });
    // The middle replays: a replay is about (last - first) / (n_replays - 1) long.
    const double t_first = calls.front().first_wait, t_last = calls.back().first_wait;
    const double replay = n_replays > 1 ? (t_last - t_first) / (n_replays - 1) : 0.0;
    struct Acc {
        std::vector<double> col[7], ctas, sms;
        std::map<std::string, int> after;
    };
    std::map<std::string, Acc> acc;
    for (size_t i = 1; i < calls.size(); ++i) {
        const Call& c = calls[i];
        if (n_replays > 2 && (c.first_wait < t_first + 0.9 * replay || c.first_wait > t_last - 0.9 * replay)) continue;
        const double e0 = calls[i - 1].last_exit;
        std::vector<double> enter, wait, exit;
        std::map<uint32_t, int> blocks, sms;
        for (auto* r : c.r) {
            enter.push_back((double(r->enter) - e0) / 1e3);
            wait.push_back((double(r->wait) - e0) / 1e3);
            exit.push_back((double(r->exit) - e0) / 1e3);
            blocks[r->block]++, sms[r->smid]++;
        }
        std::sort(enter.begin(), enter.end()), std::sort(wait.begin(), wait.end()), std::sort(exit.begin(), exit.end());
        Acc& a = acc[kernel_name(c.tag)];
        const double v[7] = {enter.front(), enter[enter.size() / 2], enter.back(), wait.front(), wait.back(),
                             exit[exit.size() / 2], exit.back()};
        for (int j = 0; j < 7; ++j) a.col[j].push_back(v[j]);
        a.ctas.push_back(double(blocks.size())), a.sms.push_back(double(sms.size()));
        a.after[kernel_name(calls[i - 1].tag)]++;
    }
    std::vector<TimelineRow> rows;
    for (auto& [name, a] : acc) {
        TimelineRow r;
        r.kernel = name;
        r.calls = int(a.col[0].size());
        r.ctas = median(a.ctas), r.sms = median(a.sms);
        r.enter0 = median(a.col[0]), r.enter50 = median(a.col[1]), r.enter1 = median(a.col[2]);
        r.wait0 = median(a.col[3]), r.wait1 = median(a.col[4]);
        r.exit50 = median(a.col[5]), r.exit1 = median(a.col[6]);
        for (auto& [n, k] : a.after) r.after += (r.after.empty() ? "" : ", ") + n + " x" + std::to_string(k);
        rows.push_back(std::move(r));
    }
    return rows;
}

}  // namespace osprey::bench
