#include "kernels/cpu/rmsnorm.h"

#include <cmath>

#include "core/check.h"

namespace osprey::cpu {

void rmsnorm(std::span<float> y, std::span<const float> x, std::span<const float> gain, int n_rows, int n,
             float eps, ThreadPool& pool) {
    OSPREY_CHECK(n_rows >= 0 && n > 0, "rmsnorm: bad shape ", n_rows, "x", n);
    OSPREY_CHECK(x.size() == size_t(n_rows) * n && y.size() == x.size(), "rmsnorm: x has ", x.size(),
                 " and y ", y.size(), " elements, expected ", size_t(n_rows) * n);
    OSPREY_CHECK(gain.size() == size_t(n), "rmsnorm: gain has ", gain.size(), " elements, expected ", n);
    pool.parallel_for(n_rows, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const float* xr = x.data() + r * n;  // [n]
            float* yr = y.data() + r * n;        // [n]
            double sum_sq = 0.0;
            for (int i = 0; i < n; ++i) sum_sq += double(xr[i]) * xr[i];
            const float inv_rms = float(1.0 / std::sqrt(sum_sq / n + double(eps)));
            for (int i = 0; i < n; ++i) yr[i] = (xr[i] * inv_rms) * gain[i];
        }
    });
}

}  // namespace osprey::cpu
