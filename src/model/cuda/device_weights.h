// gpt-oss weights in device memory, loaded from a checkpoint folder (tiny, 20b, 120b; either layout).
// Experts stay MXFP4 blocks/scales exactly as shipped (never materialised as BF16), or, for a converted
// checkpoint or --weights fp8|bf16, the expert matrices as they are (E4M3 codes with their F32 block
// multipliers, or BF16; kernels/cuda/moe_mlp_matrix.h runs them); the attention projections and the
// unembedding are BF16, or FP8 E4M3 with their F32 block multipliers when the Weights hold them so (a
// converted folder, --weights fp8; docs/fp8.md); the router and embedding are BF16; norm gains are
// widened to FP32 (they may be stored BF16 or F32); q, k and v are concatenated into one
// [q_dim + 2 kv_dim, d_model] weight (and bias) so that one GEMM makes qkv.
// Loading streams the memory-mapped shards through pinned staging buffers in large sequential
// copies, with a progress bar on the terminal.
#pragma once

#include <cstdint>
#include <vector>

#include "core/bf16.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/runtime.h"
#include "model/parallel_layout.h"
#include "model/weights.h"

namespace osprey::model {

// A dense weight [N, K] on the device: BF16, or FP8 E4M3 codes with one F32 multiplier per block of
// block_rows x 128 (kernels/cuda/linear.h Fp8Weight). Stacked or sliced FP8 parts keep their own
// multipliers exactly: block_rows is 128 when every part starts on a 128-row boundary (20b, 120b),
// else the largest power of two dividing every boundary (the tiny model's 64-row k and v), the
// multipliers repeated on that grid. Pass it to a linear as `.w = l.bf16_weight(), .w8 = l.fp8_weight()`.
struct DeviceLinear {
    cuda::DeviceBuffer<bf16> w;         // [N, K] bf16 (empty when FP8)
    cuda::DeviceBuffer<uint8_t> codes;  // [N, K] e4m3 (empty when BF16)
    cuda::DeviceBuffer<float> scale;    // [ceil(N / block_rows), ceil(K / 128)] f32
    int block_rows = 128;

    bool is_fp8() const { return codes.size() > 0; }
    const bf16* bf16_weight() const { return is_fp8() ? nullptr : w.get(); }
    cuda::Fp8Weight fp8_weight() const {
        return is_fp8() ? cuda::Fp8Weight{.codes = codes.get(), .scale = scale.get(), .block_rows = block_rows}
                        : cuda::Fp8Weight{};
    }
    size_t bytes() const { return w.bytes() + codes.bytes() + scale.bytes(); }
};

struct DeviceLayer {
    cuda::DeviceBuffer<float> attn_norm;      // [H] f32
    DeviceLinear qkv_w;                       // [Q + 2K, H] bf16 or fp8: q rows, k rows, v rows
    cuda::DeviceBuffer<bf16> qkv_b;           // [Q + 2K]
    cuda::DeviceBuffer<bf16> sinks;           // [NH]
    DeviceLinear out_w;                       // [H, Q] bf16 or fp8
    cuda::DeviceBuffer<float> out_b;          // [H] f32 (f32-output GEMM epilogue)
    cuda::DeviceBuffer<float> mlp_norm;       // [H] f32
    cuda::DeviceBuffer<bf16> router_w;        // [E, H]
    cuda::DeviceBuffer<float> router_b;       // [E] f32 (f32-output GEMM epilogue)
    cuda::DeviceBuffer<uint8_t> mlp1_blocks;  // [E, 2I, H/32, 16] MXFP4 pairs (low nibble = even element)
    cuda::DeviceBuffer<uint8_t> mlp1_scales;  // [E, 2I, H/32] E8M0
    cuda::DeviceBuffer<bf16> mlp1_bias;       // [E, 2I] (gate/up interleaved)
    cuda::DeviceBuffer<uint8_t> mlp2_blocks;  // [E, H, I/32, 16]
    cuda::DeviceBuffer<uint8_t> mlp2_scales;  // [E, H, I/32]
    cuda::DeviceBuffer<bf16> mlp2_bias;       // [E, H]
    // The MXFP4 blocks again in moe_decode's decode layout (kernels/cuda/mxfp4_words.h), which the decode
    // MoE (batches of 1-8 tokens) reads instead of the ones above; empty unless add_decode_copies ran.
    cuda::DeviceBuffer<uint8_t> mlp1_blocks_decode;
    cuda::DeviceBuffer<uint8_t> mlp2_blocks_decode;
    // Matrix experts (LayerWeights::mlp1_w / mlp2_w; the MXFP4 buffers above are then empty). Bytes: E4M3
    // codes, or BF16 (2 bytes per element); a tensor-parallel piece holds its intermediate columns padded
    // with zero weights to d_ff_padded, as for MXFP4.
    WeightFormat experts = WeightFormat::mxfp4;
    cuda::DeviceBuffer<uint8_t> mlp1_w;       // [E, 2I, H]
    cuda::DeviceBuffer<float> mlp1_w_scale;   // FP8: [E, nb(2I), nb(H)] block multipliers (nb(n) = ceil(n / 128))
    cuda::DeviceBuffer<uint8_t> mlp2_w;       // [E, H, I]
    cuda::DeviceBuffer<float> mlp2_w_scale;   // FP8: [E, nb(H), nb(I)]
};

// Fills l's decode-layout copies (mlp1_blocks_decode, mlp2_blocks_decode) from its MXFP4 blocks, on the
// device on `stream` (no synchronisation): DeviceWeights::add_decode_copies per layer.
void add_decode_copy(DeviceLayer& l, cudaStream_t stream);

struct LoadStats {
    size_t bytes = 0;      // bytes copied to the device
    double seconds = 0.0;  // wall time of the load
    double gb_per_s() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0; }
};

class DeviceWeights {
public:
    // Copies every tensor of `w` to the current device. progress: draw a bar on stderr.
    // experts_to_fp8: MXFP4 experts are requantised on the device to FP8 blocks as they arrive
    // (kernels/cuda/fp8_quantize.h: the codes and multipliers of the host conversion, bit for bit), so
    // the host never holds the FP8 experts; `--weights fp8` on one GPU loads this way.
    static DeviceWeights load(const Weights& w, bool progress, bool experts_to_fp8 = false);
    // One rank's piece of a parallel layout (model/parallel_layout.h): q/k/v rows, sinks and the
    // out-projection's columns of its heads (out_b zero unless piece.out_bias), its experts with
    // intermediate columns [ff.first, ff.end()) padded with zero weights to d_ff_padded (a whole
    // number of the expert kernels' 64-column tiles; mlp2_bias zero unless piece.down_bias), its
    // unembedding rows. Embedding, norms and router whole. A whole piece is load(w, progress).
    // FP8 attention: the out-projection's column slice must start on a 128-column block (its
    // multipliers are per 128 inputs; a slice starting inside a block is refused by name). FP8 matrix
    // experts keep their 128 x 128 block-multiplier grid, so their columns must start at a multiple of
    // 128 (refused otherwise, naming the piece).
    static DeviceWeights load(const Weights& w, bool progress, const ModelShard& piece, int d_ff_padded);

    Config config;
    cuda::DeviceBuffer<bf16> embedding;    // [vocab, H]
    std::vector<DeviceLayer> layers;       // [n_layers]
    cuda::DeviceBuffer<float> final_norm;  // [H] f32
    DeviceLinear unembedding;              // [vocab, H] bf16 or fp8
    LoadStats stats;
    size_t device_bytes() const;
    // Adds every MXFP4 layer's decode-layout copy of its blocks (DeviceLayer::mlp1_blocks_decode), made
    // on the device from the loaded blocks: +0.5 byte per expert weight (20b 9.5 GB, 120b 57 GB).
    // Refuses, naming the sizes, when the device would keep less than keep_free bytes free after it.
    void add_decode_copies(size_t keep_free);
};

}  // namespace osprey::model
