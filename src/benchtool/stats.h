// Summaries of repeated timings: median and tail percentiles (linear interpolation between order
// statistics, as numpy's default), mean, min and max.
#pragma once

#include <vector>

#include "core/json.h"

namespace osprey::benchtool {

struct Summary {
    int n = 0;
    double mean = 0, median = 0, p90 = 0, p99 = 0, min = 0, max = 0;
    json::Value to_json() const;  // {"n", "mean", "median", "p90", "p99", "min", "max"}
};

// q in [0, 1]; `sorted` ascending and non-empty.
double percentile(const std::vector<double>& sorted, double q);
Summary summarize(std::vector<double> values);  // all zero when empty

}  // namespace osprey::benchtool
