// The CUDA sampler (see sampling.h for the method and kernels/cpu/sampling.h for the semantics it
// reproduces). All float arithmetic that the CPU sampler does in float uses the _rn intrinsics so nvcc
// cannot contract it into FMAs; weights, sums and log-probabilities are double, as on the CPU.
#include "kernels/cuda/sampling.h"

#include <climits>
#include <cmath>

#include "kernels/cuda/common.cuh"

namespace osprey::cuda {
namespace {

constexpr int kThreads = kSampleThreads;
constexpr int kWarps = kThreads / kWarpSize;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kDigitBits = 10;  // radix-select digit
constexpr int kBins = 1 << kDigitBits;
constexpr int kKeyBits = 32 + kSampleIdBits;             // value bits above id bits
constexpr uint64_t kAllKeys = uint64_t(1) << kKeyBits;   // a `below` bound that admits every key
constexpr int kChunk = kSampleChunk;
constexpr int kPerThread = kChunk / kThreads;  // chunk positions per thread in the prefix sum
constexpr int kSkipBig = 65536, kSkipMid = 8192;  // range sizes a walk skips by mass (broad distributions)
constexpr uint32_t kIdMask = uint32_t(kSampleMaxVocab - 1);
constexpr uint32_t kPromptBit = 0x80000000u;  // in the counts scratch: token occurs in the prompt
static_assert(kBins == 2 * kThreads, "each thread owns two histogram bins in the scan");
static_assert(kKeyBits % kDigitBits == 0, "the key is a whole number of digits");
static_assert(kChunk % kThreads == 0 && (kChunk & (kChunk - 1)) == 0, "chunk: a power of two, whole per thread");

struct Shared {
    uint64_t keys[kChunk];      // [kChunk] the current chunk of keys, sorted descending
    double pre[kChunk];         // [kChunk] inclusive prefix sums of the chunk's weights (sorted order)
    uint32_t hist[kBins];       // [kBins] radix-select histogram
    double seg_incl[kThreads];  // [kThreads] inclusive scan of the per-thread id-range sums
    double scan_d[kWarps];
    uint32_t scan_u[kWarps];
    float red_v[kWarps];
    int red_i[kWarps];
    int found;
    uint32_t found_count;
    int n_gathered;
    int error;
    int chosen;
};

__device__ __forceinline__ float load_logit(const float* x, int t) {
    const float v = x[t];
    return isnan(v) ? -INFINITY : v;  // NaN logits are -infinity (CPU sampler)
}

// Order-preserving map of a float to uint32 (-0 and +0 map together: the CPU compares values).
__device__ __forceinline__ uint32_t float_order(float f) {
    const uint32_t b = f == 0.0f ? 0u : __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float order_float(uint32_t o) {
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
// The unique sort key: larger key = earlier in "value descending, id ascending".
__device__ __forceinline__ uint64_t make_key(float v, int t) {
    return (uint64_t(float_order(v)) << kSampleIdBits) | uint64_t(kIdMask - uint32_t(t));
}
__device__ __forceinline__ int key_id(uint64_t k) { return int(kIdMask - uint32_t(k & kIdMask)); }
__device__ __forceinline__ float key_value(uint64_t k) { return order_float(uint32_t(k >> kSampleIdBits)); }

// One row as the passes see it.
struct Row {
    const float* x = nullptr;  // [vocab] logits after bias and penalties (NaN still possible)
    int vocab = 0;
    float inv = 1.0f;      // 1 / temperature (1 for greedy rows)
    double x_max = 0.0;    // largest scaled logit
    __device__ float value(int t) const { return __fmul_rn(load_logit(x, t), inv); }
    __device__ double weight(float v) const { return exp(double(v) - x_max); }
};

// Scan over the block, one value per thread: returns the inclusive prefix, sets `excl` (the sum of the
// threads before) and `total` (the block's sum). warp_tmp: [kWarps].
template <typename T>
__device__ T block_scan(T v, T* warp_tmp, T& excl, T& total) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
#pragma unroll
    for (int o = 1; o < kWarpSize; o <<= 1) {
        const T n = __shfl_up_sync(kFull, v, o);
        if (lane >= o) v += n;
    }
    if (lane == kWarpSize - 1) warp_tmp[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < kWarps ? warp_tmp[lane] : T(0);
#pragma unroll
        for (int o = 1; o < kWarpSize; o <<= 1) {
            const T n = __shfl_up_sync(kFull, w, o);
            if (lane >= o) w += n;
        }
        if (lane < kWarps) warp_tmp[lane] = w;
    }
    __syncthreads();
    const T offset = warp > 0 ? warp_tmp[warp - 1] : T(0);
    const T prev = __shfl_up_sync(kFull, v, 1);  // warp-inclusive value of the previous lane
    excl = lane == 0 ? offset : offset + prev;
    total = warp_tmp[kWarps - 1];
    __syncthreads();
    return offset + v;
}

template <typename T>
__device__ T block_sum(T v, T* warp_tmp) {
    T excl, total;
    block_scan(v, warp_tmp, excl, total);
    return total;
}

// The smallest i among threads with pred (INT_MAX when none); every thread receives it.
__device__ int block_first(bool pred, int i, Shared& sh) {
    if (threadIdx.x == 0) sh.found = INT_MAX;
    __syncthreads();
    if (pred) atomicMin(&sh.found, i);
    __syncthreads();
    const int r = sh.found;
    __syncthreads();
    return r;
}

__device__ int block_max_int(int v, Shared& sh) {
    if (threadIdx.x == 0) sh.found = INT_MIN;
    __syncthreads();
    atomicMax(&sh.found, v);
    __syncthreads();
    const int r = sh.found;
    __syncthreads();
    return r;
}

// Argmax over the block: largest value, lowest id on ties (id INT_MAX: no element).
__device__ void block_argmax(float& v, int& i, Shared& sh) {
    auto better = [](float a, int ai, float b, int bi) { return b > a || (b == a && bi < ai); };
#pragma unroll
    for (int o = kWarpSize / 2; o > 0; o /= 2) {
        const float ov = __shfl_xor_sync(kFull, v, o);
        const int oi = __shfl_xor_sync(kFull, i, o);
        if (better(v, i, ov, oi)) v = ov, i = oi;
    }
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    if (lane == 0) sh.red_v[warp] = v, sh.red_i[warp] = i;
    __syncthreads();
    v = sh.red_v[0], i = sh.red_i[0];
    for (int w = 1; w < kWarps; ++w)
        if (better(v, i, sh.red_v[w], sh.red_i[w])) v = sh.red_v[w], i = sh.red_i[w];
    __syncthreads();
}

// Radix select over the keys of one row: returns `lo` such that the number of keys in [lo, below) is
// in [want_min, want_max] (1 <= want_min <= want_max); when fewer than want_min keys lie below `below`,
// returns 0 (all of them). Digits of kDigitBits from the top; it stops at the first digit where the
// keys at or above a bin boundary fit the wanted range. Keys are unique, so the last digit always fits.
__device__ uint64_t select_chunk(const Row& row, Shared& sh, uint64_t below, int want_min, int want_max) {
    const int tid = threadIdx.x, lane = tid % kWarpSize;
    uint64_t prefix = 0;  // the digits fixed so far: key >> (shift + kDigitBits) == prefix
    uint32_t base = 0;    // keys below `below` in higher prefix ranges (already counted)
    for (int shift = kKeyBits - kDigitBits; shift >= 0; shift -= kDigitBits) {
        for (int b = tid; b < kBins; b += kThreads) sh.hist[b] = 0;
        __syncthreads();
        for (int t0 = 0; t0 < row.vocab; t0 += kThreads) {
            const int t = t0 + tid;
            uint64_t key = 0;
            bool in = false;
            if (t < row.vocab) {
                key = make_key(row.value(t), t);
                in = key < below && (key >> (shift + kDigitBits)) == prefix;
            }
            // One shared atomic per distinct bin in the warp (all lanes match; out-of-range lanes carry a
            // value no bin has).
            const uint32_t d = in ? uint32_t(key >> shift) & uint32_t(kBins - 1) : 0xffffffffu;
            const unsigned peers = __match_any_sync(kFull, d);
            if (in && lane == __ffs(peers) - 1) atomicAdd(&sh.hist[d], uint32_t(__popc(peers)));
        }
        __syncthreads();
        // Suffix counts: reversed bin r = kBins-1-d; thread tid owns r = 2 tid and 2 tid + 1.
        const uint32_t h0 = sh.hist[kBins - 1 - 2 * tid], h1 = sh.hist[kBins - 2 - 2 * tid];
        if (tid == 0) sh.found = -1;
        uint32_t before, total;
        block_scan(h0 + h1, sh.scan_u, before, total);  // block_scan synchronises after the init above
        const uint32_t need = uint32_t(want_min) - base;  // >= 1
        if (before < need && before + h0 >= need) {
            sh.found = 2 * tid, sh.found_count = base + before + h0;
        } else if (before + h0 < need && before + h0 + h1 >= need) {
            sh.found = 2 * tid + 1, sh.found_count = base + before + h0 + h1;
        }
        __syncthreads();
        const int r = sh.found;
        const uint32_t cum = sh.found_count;  // keys >= the boundary of bin d (and < below)
        if (r < 0) {
            __syncthreads();
            return 0;  // fewer than want_min keys in all (only at the first digit)
        }
        const uint32_t d = uint32_t(kBins - 1 - r);
        const uint32_t h_d = sh.hist[d];
        __syncthreads();
        const uint64_t bin = (prefix << kDigitBits) | d;
        if (cum <= uint32_t(want_max)) return bin << shift;
        base = cum - h_d;
        prefix = bin;
    }
    return prefix;  // not reached: a last-digit bin holds at most one key
}

// Gathers the keys in [lo, below) (at most kChunk) into sh.keys, sorts them descending (bitonic) and
// writes the inclusive prefix sums of their weights to sh.pre. Returns the number of keys.
__device__ int gather_chunk(const Row& row, Shared& sh, uint64_t lo, uint64_t below) {
    const int tid = threadIdx.x, lane = tid % kWarpSize;
    if (tid == 0) sh.n_gathered = 0;
    __syncthreads();
    for (int t0 = 0; t0 < row.vocab; t0 += kThreads) {
        const int t = t0 + tid;
        uint64_t key = 0;
        bool in = false;
        if (t < row.vocab) {
            key = make_key(row.value(t), t);
            in = key >= lo && key < below;
        }
        const unsigned ballot = __ballot_sync(kFull, in);
        if (ballot) {
            int slot0 = 0;
            if (lane == 0) slot0 = atomicAdd(&sh.n_gathered, __popc(ballot));
            slot0 = __shfl_sync(kFull, slot0, 0);
            const int slot = slot0 + __popc(ballot & ((1u << lane) - 1u));
            if (in && slot < kChunk) sh.keys[slot] = key;
        }
    }
    __syncthreads();
    if (tid == 0 && sh.n_gathered > kChunk) sh.error = 4;  // cannot happen: select_chunk bounds the count
    const int n = min(sh.n_gathered, kChunk);
    int m = 1;
    while (m < n) m <<= 1;
    for (int i = n + tid; i < m; i += kThreads) sh.keys[i] = 0;  // below every real key
    __syncthreads();
    for (int k = 2; k <= m; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = tid; i < m; i += kThreads) {
                const int ixj = i ^ j;
                if (ixj > i) {
                    const uint64_t a = sh.keys[i], b = sh.keys[ixj];
                    const bool descending = (i & k) == 0;
                    if (descending ? a < b : a > b) sh.keys[i] = b, sh.keys[ixj] = a;
                }
            }
            __syncthreads();
        }
    }
    // Weights in sorted order and their prefix sums: kPerThread consecutive positions per thread.
    double local[kPerThread];
    double run = 0.0;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
        const int p = tid * kPerThread + j;
        run += p < n ? row.weight(key_value(sh.keys[p])) : 0.0;
        local[j] = run;
    }
    double excl, total;
    block_scan(run, sh.scan_d, excl, total);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) sh.pre[tid * kPerThread + j] = excl + local[j];
    __syncthreads();
    return n;
}

// Walks the sorted order ("value descending, id ascending") chunk by chunk. Mode kKeep: finds keep
// (top-p: the first position where the prefix mass reaches `needed`, at most keep0) and the kept mass
// P(keep). Mode kDraw: the first position < keep whose prefix mass exceeds `target` (else keep - 1),
// written to sh.chosen. Returns true when everything was decided within the first chunk, whose keys
// and prefix sums are then still in shared memory.
enum class Walk { kKeep, kDraw };

// Keys in [lo, below) and the sum of their weights (the mass a walk skips without sorting).
__device__ void range_mass(const Row& row, Shared& sh, uint64_t lo, uint64_t below, int& count, double& mass) {
    int c = 0;
    double m = 0.0;
    for (int t = threadIdx.x; t < row.vocab; t += kThreads) {
        const float v = row.value(t);
        const uint64_t key = make_key(v, t);
        if (key >= lo && key < below) ++c, m += row.weight(v);
    }
    count = block_sum(c, sh.red_i);
    mass = block_sum(m, sh.scan_d);
}

__device__ bool walk(const Row& row, Shared& sh, Walk mode, bool top_p, double needed, int& keep, double& kept,
                     double target) {
    int pos = 0;
    double acc = 0.0;
    uint64_t below = kAllKeys;
    bool skipped = false;
    for (;;) {
        const int rem = keep - pos;  // >= 1
        const int want_min = rem <= kChunk ? rem : kChunk / 4;
        const uint64_t lo = select_chunk(row, sh, below, want_min, kChunk);
        const int n = gather_chunk(row, sh, lo, below);
        if (n <= 0) {  // cannot happen (keep <= the keys below `below`): keep what was walked
            if (threadIdx.x == 0) sh.error = 2;
            if (mode == Walk::kKeep) keep = max(pos, 1), kept = acc;
            if (mode == Walk::kDraw && threadIdx.x == 0) sh.chosen = -1;
            __syncthreads();
            return false;
        }
        const int lim = min(n, rem);
        if (mode == Walk::kKeep) {
            if (top_p) {
                bool hit = false;
                int first = INT_MAX;
                for (int i = threadIdx.x; i < lim; i += kThreads)
                    if (!hit && acc + sh.pre[i] >= needed) hit = true, first = i;
                const int i = block_first(hit, first, sh);
                if (i < lim) keep = pos + i + 1, top_p = false;
            }
            if (keep - pos <= n) {
                kept = acc + sh.pre[keep - pos - 1];
                __syncthreads();
                return pos == 0;
            }
        } else {
            bool hit = false;
            int first = INT_MAX;
            for (int i = threadIdx.x; i < lim; i += kThreads)
                if (!hit && acc + sh.pre[i] > target) hit = true, first = i;
            int i = block_first(hit, first, sh);
            if (i < lim || rem <= n) {
                if (i >= lim) i = rem - 1;  // rounding: the last kept token
                if (threadIdx.x == 0) sh.chosen = key_id(sh.keys[i]);
                __syncthreads();
                return pos == 0;
            }
        }
        acc += sh.pre[n - 1];
        pos += n;
        below = lo;
        __syncthreads();
        if (!skipped) {
            // The decision lies past the first chunk (a broad distribution): skip whole ranges of up to
            // kSkipBig, then kSkipMid keys by their count and mass, without sorting them, until the
            // range that holds the decision; the sorted walk continues from there.
            skipped = true;
            for (int level = 0; level < 2; ++level) {
                const int big = level == 0 ? kSkipBig : kSkipMid;
                while (keep - pos > big) {
                    const uint64_t lo_range = select_chunk(row, sh, below, big / 4, big);
                    int count = 0;
                    double mass = 0.0;
                    range_mass(row, sh, lo_range, below, count, mass);
                    const bool inside = count <= 0 || pos + count >= keep ||
                                        (mode == Walk::kKeep ? top_p && acc + mass >= needed : acc + mass > target);
                    if (inside) break;
                    acc += mass;
                    pos += count;
                    below = lo_range;
                }
            }
        }
    }
}

__global__ void __launch_bounds__(kThreads, 1) sample_rows_kernel(const SampleRowsArgs a, int ld) {
    __shared__ Shared sh;
    const int tid = threadIdx.x;
    const int r = blockIdx.x;
    const SampleRowParams p = a.params[r];
    const int vocab = a.vocab_size;
    if (tid == 0) sh.error = 0;

    Row row;
    row.x = a.logits + size_t(r) * size_t(ld);
    row.vocab = vocab;
    row.inv = p.inv_temperature;

    // 1. Logit bias, then penalties, on a scratch copy of the row.
    if (p.work_row >= 0) {
        float* w = a.work + size_t(p.work_row) * size_t(vocab);  // [vocab]
        for (int t = tid; t < vocab; t += kThreads) w[t] = load_logit(row.x, t);
        __syncthreads();
        if (tid == 0) {  // in list order, as the CPU adds repeated entries
            for (int i = 0; i < p.n_bias; ++i) {
                const int t = a.bias_ids[p.bias_begin + i];
                if (t >= 0 && t < vocab) w[t] = __fadd_rn(w[t], a.bias_values[p.bias_begin + i]);
                else sh.error = 1;
            }
        }
        __syncthreads();
        const bool repetition = p.flags & kSampleRepetition;
        if (repetition || (p.flags & kSampleCounted)) {
            uint32_t* count = a.counts + size_t(p.work_row) * size_t(vocab);  // [vocab], zero on entry
            const int32_t* out_ids = a.history + p.output_begin;  // [n_output]
            const int32_t* prompt_ids = a.history + p.prompt_begin;  // [n_prompt]
            for (int i = tid; i < p.n_output; i += kThreads) {
                const int t = out_ids[i];
                if (t >= 0 && t < vocab) atomicAdd(&count[t], 1u);
                else sh.error = 1;
            }
            if (repetition)
                for (int i = tid; i < p.n_prompt; i += kThreads) {
                    const int t = prompt_ids[i];
                    if (t >= 0 && t < vocab) atomicOr(&count[t], kPromptBit);
                    else sh.error = 1;
                }
            __syncthreads();
            // The thread that takes a nonzero count owns the token: it applies the penalties once and
            // leaves the count zero for the next call.
            auto apply = [&](int t) {
                if (t < 0 || t >= vocab) return;
                const uint32_t c = atomicExch(&count[t], 0u);
                if (c == 0) return;
                float v = w[t];
                if (repetition)
                    v = v > 0.0f ? __fdiv_rn(v, p.repetition_penalty) : __fmul_rn(v, p.repetition_penalty);
                const uint32_t n = c & ~kPromptBit;
                if (n > 0)
                    v = __fsub_rn(v, __fadd_rn(__fmul_rn(p.frequency_penalty, float(n)), p.presence_penalty));
                w[t] = v;
            };
            for (int i = tid; i < p.n_output; i += kThreads) apply(out_ids[i]);
            if (repetition)
                for (int i = tid; i < p.n_prompt; i += kThreads) apply(prompt_ids[i]);
            __syncthreads();
        }
        row.x = w;
    }

    // 2. Argmax of the edited logits (before temperature), lowest id on ties.
    float bx = -INFINITY;
    int best = INT_MAX;
    for (int t = tid; t < vocab; t += kThreads) {
        const float v = load_logit(row.x, t);
        if (v > bx || (v == bx && t < best)) bx = v, best = t;
    }
    block_argmax(bx, best, sh);
    const float x_max = __fmul_rn(bx, row.inv);
    row.x_max = double(x_max);
    const bool finite = isfinite(x_max);
    const bool greedy = p.flags & kSampleGreedy;

    // 3. Softmax normaliser, min-p candidates, per-thread id-range sums (contiguous ranges, summed in
    // id order like the CPU's untruncated draw).
    const int seg = (vocab + kThreads - 1) / kThreads;
    const int seg_begin = min(vocab, tid * seg), seg_end = min(vocab, seg_begin + seg);
    const float min_p_floor = (p.flags & kSampleMinP) ? __fadd_rn(x_max, p.log_min_p) : -INFINITY;
    double seg_sum = 0.0, seg_excl = 0.0, sum = 0.0;
    int n_cand = 0;
    if (finite) {
        int cand = 0;
#pragma unroll 4
        for (int t = seg_begin; t < seg_end; ++t) {  // the exps overlap, the additions stay in id order
            const float v = row.value(t);
            seg_sum += row.weight(v);
            cand += (v >= min_p_floor && v != -INFINITY) ? 1 : 0;
        }
        block_scan(seg_sum, sh.scan_d, seg_excl, sum);
        int c_excl, c_total;
        block_scan(cand, sh.red_i, c_excl, c_total);
        n_cand = c_total;
    }
    const double log_z = finite ? row.x_max + log(sum) : 0.0;
    auto logprob_of = [&](int t, float v) {
        return finite ? float(double(v) - log_z) : (t == best ? 0.0f : -INFINITY);
    };

    // 4. top_logprobs: the first chunk of the sorted order.
    if (p.top_logprobs > 0) {
        const uint64_t lo = select_chunk(row, sh, kAllKeys, p.top_logprobs, kChunk);
        const int n = gather_chunk(row, sh, lo, kAllKeys);
        if (tid < p.top_logprobs && tid < n) {
            const uint64_t k = sh.keys[tid];
            a.out[r].top_ids[tid] = key_id(k);
            a.out[r].top_logprobs[tid] = logprob_of(key_id(k), key_value(k));
        }
        if (tid == 0) a.out[r].n_top = min(n, p.top_logprobs);
        __syncthreads();
    } else if (tid == 0) {
        a.out[r].n_top = 0;
    }

    // 5. The token.
    int chosen = best;
    if (!greedy && finite) {
        const double u = sample_uniform_hd(p.seed, p.step);
        if (!(p.flags & kSampleTruncate)) {
            // The id-range whose running sum first exceeds u * sum, then a rescan of that range with
            // the same additions (so the crossing is found in it).
            const double target = u * sum;
            const int j = block_first(seg_sum > 0.0 && seg_excl + seg_sum > target, tid, sh);
            if (j == INT_MAX) {  // rounding put u * sum past every range: the last token of nonzero weight
                int last_nonzero = -1;
                for (int t = seg_begin; t < seg_end; ++t)
                    if (row.weight(row.value(t)) != 0.0) last_nonzero = t;
                const int last = block_max_int(last_nonzero, sh);
                if (tid == 0) sh.chosen = last;
            }
            __syncthreads();
            if (tid == j) {
                double acc = 0.0;
                int c = -1;
                for (int t = seg_begin; t < seg_end; ++t) {
                    const double w = row.weight(row.value(t));
                    if (w == 0.0) continue;
                    acc += w;
                    c = t;
                    if (seg_excl + acc > target) break;
                }
                sh.chosen = c;
            }
            __syncthreads();
            chosen = sh.chosen;
        } else {
            // Truncation: keep0 from min-p and top-k, then top-p on the top-k mass.
            int keep = n_cand;
            if (p.top_k > 0) keep = min(keep, p.top_k);
            const bool top_p = p.flags & kSampleTopP;
            double needed = 0.0;
            if (top_p) {
                double total = sum;
                if (p.flags & kSampleTopK) {
                    const uint64_t lo = select_chunk(row, sh, kAllKeys, p.top_k, p.top_k);
                    double part = 0.0;
                    for (int t = tid; t < vocab; t += kThreads) {
                        const float v = row.value(t);
                        if (make_key(v, t) >= lo) part += row.weight(v);
                    }
                    total = block_sum(part, sh.scan_d);
                }
                needed = double(p.top_p) * total;
            }
            keep = max(keep, 1);
            double kept = 0.0;
            const bool one_chunk = walk(row, sh, Walk::kKeep, top_p, needed, keep, kept, 0.0);
            const double target = u * kept;
            if (one_chunk) {
                bool hit = false;
                int first = INT_MAX;
                for (int i = tid; i < keep; i += kThreads)
                    if (!hit && sh.pre[i] > target) hit = true, first = i;
                int i = block_first(hit, first, sh);
                if (i >= keep) i = keep - 1;
                chosen = key_id(sh.keys[i]);
                __syncthreads();
            } else {
                walk(row, sh, Walk::kDraw, false, 0.0, keep, kept, target);
                chosen = sh.chosen;
            }
        }
    }
    if (tid == 0) {
        const bool ok = chosen >= 0 && chosen < vocab;
        a.out[r].token = ok ? chosen : -1;
        a.out[r].logprob = ok ? logprob_of(chosen, row.value(chosen)) : 0.0f;
        a.out[r].error = ok ? sh.error : (sh.error ? sh.error : 3);
    }
}

}  // namespace

void sample_rows(const SampleRowsArgs& a, cudaStream_t stream) {
    OSPREY_CHECK(a.n_rows > 0 && a.vocab_size > 0 && a.vocab_size <= kSampleMaxVocab, "sample_rows: shape ",
                 a.n_rows, "x", a.vocab_size, " (vocab at most ", kSampleMaxVocab, ")");
    OSPREY_CHECK(a.out && a.logits && a.params, "sample_rows: null output, logits or parameters");
    const int ld = a.ld ? a.ld : a.vocab_size;
    OSPREY_CHECK(ld >= a.vocab_size, "sample_rows: row stride ", ld, " < vocab ", a.vocab_size);
    sample_rows_kernel<<<a.n_rows, kThreads, 0, stream>>>(a, ld);
    CUDA_CHECK(cudaGetLastError());
}

void Sampler::sample(const float* logits, int vocab_size, int ld, std::span<const SamplingParams> params,
                     std::span<const SamplingState> state, std::span<SampleResult> out, cudaStream_t stream) {
    OSPREY_CHECK(out.size() == params.size(), "sample: ", params.size(), " parameter sets for ", out.size(),
                 " results");
    const size_t n_rows = params.size();
    if (n_rows == 0) return;
    OSPREY_CHECK(logits != nullptr, "sample: no logits");
    pack_sample_rows(params, state, vocab_size, pack_);

    if (params_.size() < n_rows) params_.resize(n_rows), results_.resize(n_rows);
    if (host_results_.size() < n_rows) host_results_.resize(n_rows);
    auto upload = [&](auto& buf, const auto& v) {
        if (v.empty()) return;
        if (buf.size() < v.size()) buf.resize(v.size());
        CUDA_CHECK(cudaMemcpyAsync(buf.get(), v.data(), v.size() * sizeof(v[0]), cudaMemcpyHostToDevice, stream));
    };
    upload(params_, pack_.rows);
    upload(bias_ids_, pack_.bias_ids);
    upload(bias_values_, pack_.bias_values);
    upload(history_, pack_.history);
    const size_t work = size_t(pack_.n_work_rows) * size_t(vocab_size);
    if (work > 0 && counts_.size() < work) {
        work_.resize(work);
        counts_.resize(work);
        counts_.fill_bytes(0, stream);  // the kernel leaves it zero afterwards
    }
    sample_rows({.out = results_.get(), .logits = logits, .n_rows = int(n_rows), .vocab_size = vocab_size, .ld = ld,
                 .params = params_.get(), .bias_ids = bias_ids_.get(), .bias_values = bias_values_.get(),
                 .history = history_.get(), .work = work_.get(), .counts = counts_.get()},
                stream);
    CUDA_CHECK(cudaMemcpyAsync(host_results_.get(), results_.get(), n_rows * sizeof(SampleRowResult),
                               cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (size_t r = 0; r < n_rows; ++r) unpack_sample_result(host_results_[r], r, out[r]);
}

}  // namespace osprey::cuda
