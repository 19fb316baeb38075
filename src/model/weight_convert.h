// Weight formats beyond the published one (docs/fp8.md):
//   - load-time conversion (--weights fp8|mxfp4|bf16 on serve, generate, bench): convert_weights()
//     turns loaded Weights into the asked format, in buffers the Weights own;
//   - ahead of time (`osprey convert --to fp8`): write_fp8_checkpoint() writes a Hugging Face layout
//     folder whose chosen linear weights are FP8 E4M3 with one F32 multiplier per 128 x 128 block.
// Both quantise the same way (core/fp8.h): every matrix is read row by row as exact FP32 (BF16
// widened, MXFP4 decoded), cut into bands of 128 rows, and each block's multiplier is amax / 448 over
// the elements it really holds (a partial last block of 2880 = 22.5 x 128 included).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/thread_pool.h"
#include "model/weights.h"

namespace osprey::model {

// Which linear weights an FP8 conversion touches (--convert attention,experts,unembedding). The
// router and the embedding always stay BF16 (a lookup table, and the tiny, tie-sensitive router).
struct Fp8Parts {
    bool attention = true;    // q, k, v and o projections
    bool experts = true;      // gate_up and down projections of every expert (from MXFP4)
    bool unembedding = true;  // lm_head
};
// "attention,experts,unembedding" (any non-empty subset, comma separated). Throws naming `flag`.
Fp8Parts parse_fp8_parts(std::string_view list, std::string_view flag = "--convert");
std::string fp8_parts_name(const Fp8Parts& parts);

// "fp8" | "mxfp4" | "bf16". Throws naming `flag`.
WeightFormat parse_weight_format(std::string_view name, std::string_view flag = "--weights");

// `weights` in `format`:
//   mxfp4  the published form (MXFP4 experts, BF16 dense); an error for a folder holding FP8 or BF16
//          experts, since MXFP4 cannot be recovered from them;
//   fp8    the `parts` chosen are FP8 with 128 x 128 block scales (experts decoded from MXFP4
//          exactly, then requantised per expert matrix); tensors already FP8 stay as they are;
//   bf16   experts and any FP8 tensor as BF16 (MXFP4 decodes to BF16 exactly; FP8 blocks are
//          dequantised and rounded to BF16).
Weights convert_weights(Weights weights, WeightFormat format, const Fp8Parts& parts = {},
                        ThreadPool& pool = ThreadPool::global());
// The host bytes convert_weights(w, format, parts) allocates for what it converts (codes and multipliers,
// or BF16 elements). convert_weights refuses up front (check_conversion_memory) when that exceeds the
// host's MemAvailable, naming both, instead of running out of memory half way.
size_t conversion_bytes(const Weights& w, WeightFormat format, const Fp8Parts& parts = {});
// Throws, naming the figures and the ways out, when need > available (available 0: unknown, no check).
void check_conversion_memory(size_t need, size_t available, WeightFormat format);

// A stack of n_mats [rows, cols] matrices readable row by row as exact FP32 values.
struct MatrixSource {
    int64_t n_mats = 1, rows = 0, cols = 0;
    std::function<void(int64_t mat, int64_t row, float* out /* [cols] */)> read;
    int64_t bands_per_mat() const;  // ceil(rows / 128)
    int64_t n_bands() const { return n_mats * bands_per_mat(); }
};
// A BF16 or FP8 (with its [.., nb(rows), nb(cols)] multipliers) matrix or stack of matrices.
MatrixSource linear_source(const TensorView& w, const TensorView& scale = {});
// MXFP4 experts: blocks [E, rows, cols/32, 16], scales [E, rows, cols/32].
MatrixSource mxfp4_source(const TensorView& blocks, const TensorView& scales);

// Quantises band `band` (matrix band / bands_per_mat, rows 128·(band % bands_per_mat) ...) of `src`:
// q [band rows, cols] codes and scale_inv [nb(cols)] multipliers, with the band's rows read into
// `scratch`. Returns the band's row count (128, or fewer for a matrix's last band).
int quantize_band(const MatrixSource& src, int64_t band, uint8_t* q, float* scale_inv, std::vector<float>& scratch);

struct ConvertOptions {
    std::filesystem::path model;  // input folder (either published layout, or an earlier conversion)
    std::filesystem::path out;    // output folder (Hugging Face layout)
    Fp8Parts parts;
    uint64_t max_shard_bytes = 4'800'000'000ull;
    int threads = 0;  // 0: all cores
};
struct ConvertResult {
    std::vector<std::filesystem::path> files;  // every file written or copied
    uint64_t bytes = 0;                        // safetensors bytes written
    double seconds = 0;
};
// Writes the FP8 checkpoint: shards + model.safetensors.index.json + config.json with
// quantization_config {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
// "weight_block_size": [128, 128], "modules_to_not_convert": [...]}; every other regular file of
// the input folder (tokenizer, generation config, chat template, ...) is copied.
ConvertResult write_fp8_checkpoint(const ConvertOptions& options);

}  // namespace osprey::model
