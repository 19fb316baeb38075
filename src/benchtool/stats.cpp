#include "benchtool/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace osprey::benchtool {

double percentile(const std::vector<double>& sorted, double q) {
    OSPREY_CHECK(!sorted.empty(), "percentile of an empty list");
    OSPREY_CHECK(q >= 0.0 && q <= 1.0, "percentile: q must be in [0, 1], got ", q);
    const double pos = q * double(sorted.size() - 1);
    const size_t lo = size_t(std::floor(pos));
    const size_t hi = std::min(lo + 1, sorted.size() - 1);
    const double frac = pos - double(lo);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Summary summarize(std::vector<double> values) {
    Summary s;
    if (values.empty()) return s;
    std::sort(values.begin(), values.end());
    s.n = int(values.size());
    s.mean = std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
    s.median = percentile(values, 0.5);
    s.p90 = percentile(values, 0.9);
    s.p99 = percentile(values, 0.99);
    s.min = values.front();
    s.max = values.back();
    return s;
}

json::Value Summary::to_json() const {
    json::Value v = json::Object{};
    v.set("n", n);
    v.set("mean", mean);
    v.set("median", median);
    v.set("p90", p90);
    v.set("p99", p99);
    v.set("min", min);
    v.set("max", max);
    return v;
}

}  // namespace osprey::benchtool
