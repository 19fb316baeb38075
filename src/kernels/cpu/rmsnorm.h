// RMSNorm over the last axis: y = x / sqrt(mean(x^2) + eps) * gain (spec §3.2), FP32 in and out.
#pragma once

#include <span>

#include "core/thread_pool.h"

namespace osprey::cpu {

// y, x: [n_rows, n]; gain: [n]. y may alias x. The mean of squares is accumulated in double.
void rmsnorm(std::span<float> y, std::span<const float> x, std::span<const float> gain, int n_rows, int n,
             float eps, ThreadPool& pool = ThreadPool::global());

}  // namespace osprey::cpu
