// Sampling on the GPU: the CPU sampler (kernels/cpu/sampling.h) for a batch of logit rows that stay on
// the device. Same order of operations, same tie rules, same seeded draw (sample_uniform_hd), so the
// same token for the same logits and parameters; log-probabilities agree to rounding.
//
// One CTA per row. The row is read a few times from L2/HBM; nothing is fully sorted:
//   1. edits (rows with logit bias or penalties only): the row is copied to a scratch row, the bias
//      added in list order, then each distinct history token penalised once. Counts are built on the fly
//      in a per-row u32 scratch row (atomicAdd for output ids, a high bit for prompt ids); the one thread
//      whose atomicExch takes a nonzero count applies the penalty, which also leaves the counts zero.
//   2. argmax (lowest id on ties) of the edited logits, then x_max = x[best] / temperature;
//   3. one pass of exp(x/T - x_max) in double: the softmax normaliser (log-probabilities), the number of
//      min-p candidates, and per-thread sums over contiguous id ranges for the untruncated draw;
//   4. top_logprobs, top-k, top-p, min-p and the truncated draw all work on the order
//      "logit descending, id ascending", encoded as a unique 50-bit key (order-preserving float bits of
//      x/T above 18 id bits). The sorted prefix is produced in chunks of at most kSampleChunk keys: a
//      radix select (10-bit digits, shared-memory histogram, stopping at the first digit where the
//      chunk size lands in the wanted range) finds the chunk's lower bound, the chunk is gathered into
//      shared memory and bitonic-sorted, its weights prefix-summed. Real next-token distributions need
//      one chunk. When the decision lies past the first chunk (a broad distribution, a large top_k),
//      the walk first skips whole ranges of up to 65536, then 8192 keys by their count and mass (one
//      select and one pass each, no sort) and sorts only around the decision.
//   5. the draw: untruncated rows find the thread range holding u * sum and rescan it in id order (as
//      the CPU does); truncated rows find the first sorted position whose prefix mass exceeds u * kept.
// Summation order differs from the CPU's sequential loops (relative differences ~1e-16 in double), so
// a draw may differ only when u lands within that distance of a cumulative boundary.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "core/sampling.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/sampling_pack.h"

namespace osprey::cuda {

inline constexpr int kSampleThreads = 512;  // CTA size (one CTA per row)
inline constexpr int kSampleChunk = 2048;   // keys per sorted chunk (shared memory)

// Device pointers for one launch.
struct SampleRowsArgs {
    SampleRowResult* out = nullptr;          // [n_rows] device
    const float* logits = nullptr;           // [n_rows, ld] f32, not modified
    int n_rows = 0;
    int vocab_size = 0;
    int ld = 0;                              // 0: vocab_size
    const SampleRowParams* params = nullptr; // [n_rows] device
    const int32_t* bias_ids = nullptr;       // [n_bias total] device
    const float* bias_values = nullptr;      // [n_bias total] device
    const int32_t* history = nullptr;        // [n_history total] device
    float* work = nullptr;                   // [n_work_rows, vocab_size] edited logits (rows with edits)
    uint32_t* counts = nullptr;              // [n_work_rows, vocab_size] zero before and after the launch
};

// Launches the kernel (checked); results are in a.out once the stream reaches it.
void sample_rows(const SampleRowsArgs& a, cudaStream_t stream);

// Owns the device and pinned buffers of the sampler and runs one batch: packs and uploads the
// parameters, launches, copies back the small results and synchronises the stream.
class Sampler {
public:
    // logits: [n_rows, ld] f32 on the device (ld 0: vocab_size); params, state, out: [n_rows].
    void sample(const float* logits, int vocab_size, int ld, std::span<const SamplingParams> params,
                std::span<const SamplingState> state, std::span<SampleResult> out, cudaStream_t stream);

private:
    SamplePack pack_;
    DeviceBuffer<SampleRowParams> params_;
    DeviceBuffer<SampleRowResult> results_;
    PinnedBuffer<SampleRowResult> host_results_;
    DeviceBuffer<int32_t> bias_ids_;
    DeviceBuffer<float> bias_values_;
    DeviceBuffer<int32_t> history_;
    DeviceBuffer<float> work_;
    DeviceBuffer<uint32_t> counts_;  // kept all-zero between calls
};

}  // namespace osprey::cuda
