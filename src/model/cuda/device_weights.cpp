#include "model/cuda/device_weights.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "core/fp8.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "kernels/cuda/fp8_quantize.h"
#include "kernels/cuda/moe_decode.h"
#include "model/weight_convert.h"

namespace osprey::model {
namespace {

// Streams host bytes to the device through two pinned staging buffers: while one chunk is being
// copied to the device, the next is gathered from the mapped file (by several threads, since page
// faults on the mapping are the slow part).
class Uploader {
public:
    static constexpr size_t kChunk = size_t(64) << 20;

    Uploader(size_t total, bool progress) : total_(total), progress_(progress && isatty(STDERR_FILENO)) {
        for (auto& s : stage_) s.resize(kChunk);
    }

    void copy(void* dst, const void* src, size_t bytes) {
        auto* d = static_cast<uint8_t*>(dst);
        const auto* s = static_cast<const uint8_t*>(src);
        while (bytes > 0) {
            const size_t n = std::min(bytes, kChunk);
            done_[cur_].sync();  // the staging buffer's previous copy has finished
            uint8_t* stage = stage_[cur_].get();
            constexpr int64_t kPart = 4 << 20;
            ThreadPool::global().parallel_for(int64_t((n + kPart - 1) / kPart), [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) {
                    const size_t off = size_t(i) * kPart;
                    std::memcpy(stage + off, s + off, std::min<size_t>(kPart, n - off));
                }
            });
            CUDA_CHECK(cudaMemcpyAsync(d, stage, n, cudaMemcpyHostToDevice, stream_));
            done_[cur_].record(stream_);
            cur_ ^= 1;
            d += n, s += n, bytes -= n, copied_ += n;
            draw();
        }
    }

    template <typename T>
    void upload(cuda::DeviceBuffer<T>& buf, const TensorView& v) {
        buf.resize(v.nbytes() / sizeof(T));
        copy(buf.get(), v.data, v.nbytes());
    }

    // The copies queued so far have finished (their host sources may be freed).
    void finish_pending() { stream_.sync(); }
    // The stream the copies run on: work enqueued here sees every copy queued before it.
    cudaStream_t stream() const { return stream_; }

    void finish() {
        stream_.sync();
        if (progress_) std::fprintf(stderr, "\n");
    }

private:
    void draw() {
        if (!progress_) return;
        const int width = 40;
        const double f = total_ ? double(copied_) / double(total_) : 1.0;
        const int fill = int(f * width);
        std::fprintf(stderr, "\rloading weights [%.*s%*s] %5.1f%% %6.2f / %.2f GB", fill,
                     "########################################", width - fill, "", 100.0 * f, copied_ / 1e9,
                     total_ / 1e9);
        std::fflush(stderr);
    }

    size_t total_ = 0, copied_ = 0;
    bool progress_;
    cuda::Stream stream_;
    cuda::PinnedBuffer<uint8_t> stage_[2];
    cuda::Event done_[2] = {cuda::Event(false), cuda::Event(false)};
    int cur_ = 0;
};

// Norm gains (BF16 or F32, spec §10.3) and the biases of f32-output GEMMs, widened to f32 on the
// host (they are tiny; BF16 -> F32 is exact).
void upload_f32(cuda::DeviceBuffer<float>& buf, const TensorView& v) {
    std::vector<float> f(size_t(v.numel()));
    if (v.dtype == DType::f32) {
        std::memcpy(f.data(), v.data, f.size() * sizeof(float));
    } else {
        OSPREY_CHECK(v.dtype == DType::bf16, v.name, ": expected BF16 or F32, got ", v.describe());
        for (size_t i = 0; i < f.size(); ++i) f[i] = bf16_to_float(v.as<bf16>()[i]);
    }
    buf.resize(f.size());
    buf.upload(f);
}

void check_bf16(const TensorView& v) {
    OSPREY_CHECK(v.dtype == DType::bf16, v.name, ": expected BF16, got ", v.describe());
}

// A window of a BF16 or FP8 [R, C] checkpoint matrix: rows [row0, row0 + rows), columns [col0, col0 + cols)
// (cols 0: all of them).
struct MatrixWindow {
    const TensorView* w = nullptr;
    const TensorView* scale = nullptr;  // FP8: [nb(R), nb(C)] F32 multipliers (Weights' *_scale)
    int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
};

// Copies rows x cols elements of `elem` bytes from the [R, C] matrix at src, window (row0, col0), to dst.
void upload_window(Uploader& up, uint8_t* dst, const void* src, int64_t C, const MatrixWindow& m, size_t elem) {
    const auto* base = static_cast<const uint8_t*>(src);
    if (m.col0 == 0 && m.cols == C) {
        up.copy(dst, base + size_t(m.row0) * C * elem, size_t(m.rows) * C * elem);
        return;
    }
    std::vector<uint8_t> rows(size_t(m.rows) * m.cols * elem);
    for (int64_t r = 0; r < m.rows; ++r)
        std::memcpy(rows.data() + size_t(r) * m.cols * elem, base + (size_t(m.row0 + r) * C + m.col0) * elem,
                    size_t(m.cols) * elem);
    up.copy(dst, rows.data(), rows.size());  // (copy() stages the bytes before it returns)
}

// The windows stacked row-wise into one device linear (q, k, v into qkv; a rank's rows or columns).
// BF16 windows stay BF16. FP8 windows keep their codes and their multipliers exactly, on a grid of
// block_rows = the largest power of two <= 128 dividing every window's first source row and its first
// stacked row (128 for 20b and 120b, whose q_dim and kv_dim are multiples of 128; 64 for the tiny
// model's k and v), each multiplier repeated over the grid rows of its 128-row block. A column window
// must start on a 128-column block (the multipliers are per 128 inputs and the kernels start a block
// at input 0): refused otherwise.
DeviceLinear upload_linear(Uploader& up, std::initializer_list<MatrixWindow> parts, const char* what) {
    DeviceLinear d;
    const TensorView& first = *parts.begin()->w;
    const bool fp8 = first.dtype == DType::fp8_e4m3;
    int64_t n = 0, k = -1;
    int g = fp8::kBlock;  // block_rows
    for (MatrixWindow m : parts) {
        const TensorView& w = *m.w;
        OSPREY_CHECK(w.shape.size() == 2 && (w.dtype == DType::bf16 || w.dtype == DType::fp8_e4m3) &&
                         w.dtype == first.dtype,
                     what, ": ", w.name, " is ", w.describe(), " (expected a BF16 or FP8 matrix, all parts alike)");
        if (m.cols == 0) m.cols = w.shape[1];
        OSPREY_CHECK(m.row0 >= 0 && m.row0 + m.rows <= w.shape[0] && m.col0 >= 0 && m.col0 + m.cols <= w.shape[1] &&
                         (k < 0 || k == m.cols),
                     what, ": window rows [", m.row0, ", ", m.row0 + m.rows, ") columns [", m.col0, ", ",
                     m.col0 + m.cols, ") of ", w.name, " ", w.describe());
        k = m.cols;
        if (fp8) {
            OSPREY_CHECK(m.col0 % fp8::kBlock == 0, what, ": ", w.name, " is FP8 and this piece's columns start at ",
                         m.col0, ", inside a 128-column block of multipliers: not supported on the GPU. Use a "
                         "tensor-parallel layout whose ranks hold a multiple of 2 heads (128 columns), or BF16 "
                         "attention (--weights bf16, or --convert without attention)");
            g = std::gcd(g, int(m.row0 % fp8::kBlock));
            g = std::gcd(g, int(n % fp8::kBlock));
        }
        n += m.rows;
    }
    if (!fp8) {
        d.w.resize(size_t(n) * k);
        int64_t row = 0;
        for (MatrixWindow m : parts) {
            if (m.cols == 0) m.cols = m.w->shape[1];
            upload_window(up, reinterpret_cast<uint8_t*>(d.w.get() + size_t(row) * k), m.w->data, m.w->shape[1], m,
                          sizeof(bf16));
            row += m.rows;
        }
        return d;
    }
    const int64_t nkb = fp8::n_blocks(k);
    d.block_rows = g;
    d.codes.resize(size_t(n) * k);
    std::vector<float> grid(size_t((n + g - 1) / g) * nkb);
    int64_t row = 0;
    for (MatrixWindow m : parts) {
        if (m.cols == 0) m.cols = m.w->shape[1];
        const TensorView& w = *m.w;
        const int64_t src_nkb = fp8::n_blocks(w.shape[1]);
        OSPREY_CHECK(m.scale && m.scale->dtype == DType::f32 && m.scale->shape.size() == 2 &&
                         m.scale->shape[0] == fp8::n_blocks(w.shape[0]) && m.scale->shape[1] == src_nkb,
                     what, ": ", w.name, " needs F32 multipliers [", fp8::n_blocks(w.shape[0]), ", ", src_nkb, "], got ",
                     m.scale ? m.scale->describe() : std::string("none"));
        upload_window(up, d.codes.get() + size_t(row) * k, w.data, w.shape[1], m, 1);
        const float* src = m.scale->as<float>();
        for (int64_t j = row / g; j * g < row + m.rows; ++j) {  // grid rows of this window
            const int64_t src_block = (m.row0 + j * g - row) / fp8::kBlock;
            for (int64_t kb = 0; kb < nkb; ++kb)
                grid[size_t(j) * nkb + kb] = src[size_t(src_block) * src_nkb + m.col0 / fp8::kBlock + kb];
        }
        row += m.rows;
    }
    d.scale.resize(grid.size());
    up.copy(d.scale.get(), grid.data(), grid.size() * sizeof(float));
    if (g != fp8::kBlock) log::debug(what, ": FP8 multipliers on a grid of ", g, " rows (parts not 128-aligned)");
    return d;
}

// Bytes per element of a layer's matrix experts (E4M3: 1, BF16: 2), their dtypes checked.
size_t matrix_expert_bytes(const LayerWeights& l) {
    if (l.experts_format() == WeightFormat::fp8) {
        OSPREY_CHECK(l.mlp1_w.dtype == DType::fp8_e4m3 && l.mlp2_w.dtype == DType::fp8_e4m3 &&
                         l.mlp1_scale.dtype == DType::f32 && l.mlp2_scale.dtype == DType::f32,
                     l.mlp1_w.name, ": FP8 experts need E4M3 matrices with F32 block scales, got ", l.mlp1_w.describe(),
                     ", ", l.mlp2_w.describe(), ", ", l.mlp1_scale.describe(), ", ", l.mlp2_scale.describe());
        return 1;
    }
    check_bf16(l.mlp1_w);
    check_bf16(l.mlp2_w);
    return 2;
}

// The bytes of every tensor the Weights hold, as they are (load-time conversions included: total_bytes()
// counts only the checkpoint's files).
size_t tensor_bytes(const Weights& w) {
    size_t n = 0;
    w.for_each([&](const TensorView& v) { n += v.nbytes(); });
    return n;
}

// The expert tensors' bytes (every layer, every expert), in whichever form they are held.
size_t expert_bytes(const Weights& w) {
    size_t n = 0;
    for (const LayerWeights& l : w.layers)
        for (const TensorView* v : {&l.mlp1_blocks, &l.mlp1_scales, &l.mlp1_bias, &l.mlp2_blocks, &l.mlp2_scales,
                                    &l.mlp2_bias, &l.mlp1_w, &l.mlp1_scale, &l.mlp2_w, &l.mlp2_scale})
            if (!v->shape.empty()) n += v->nbytes();  // (an absent view has no shape)
    return n;
}

// Refuses, before any upload, weights that cannot fit the device: `need` bytes (of which `experts` are
// the experts') against what is free now, naming both (120b with BF16 experts needs ~233 GB).
void check_device_memory(const Weights& w, size_t need, size_t experts) {
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    OSPREY_CHECK(need <= free_bytes, "cuda: out of device memory: the weights (", w.formats(), ") need ", need / 1e9,
                 " GB (experts ", experts / 1e9, " GB), the GPU has ", free_bytes / 1e9, " GB free of ", total_bytes / 1e9,
                 " GB. BF16 experts take 3.8x the bytes of the published MXFP4 ones and FP8 experts 1.9x: use the "
                 "published experts or --weights fp8, or spread the experts over GPUs (--ep / --tp)");
}

// One rank's matrix experts (E4M3 or BF16, model/weights.h): mlp1 [E, 2I, H] rows [2 f0, 2 (f0 + nf)) of
// each local expert then zero rows up to 2 nfp; mlp2 [E, H, I] columns [f0, f0 + nf) of every row then
// zero columns up to nfp. FP8: the block-multiplier grids cut the same way ([E, nb(2 nfp), nb(H)] and
// [E, nb(H), nb(nfp)]; padding blocks get multiplier 1 over their zero codes), which keeps every block
// whole only when f0 is a multiple of 128; otherwise the piece is refused.
template <class Up>
void upload_matrix_expert_piece(Up& up, DeviceLayer& dl, const LayerWeights& l, const ModelShard& p, const Config& c,
                                size_t nfp) {
    const size_t eb = matrix_expert_bytes(l);
    const bool fp8 = dl.experts == WeightFormat::fp8;
    const size_t H = size_t(c.d_model), I = size_t(c.d_ff);
    const size_t e0 = size_t(p.experts.first), ne = size_t(p.experts.count);
    const size_t f0 = size_t(p.ff.first), nf = size_t(p.ff.count);
    OSPREY_CHECK(!fp8 || f0 % 128 == 0, l.mlp1_w.name, ": this rank's expert columns start at ", f0,
                 ", not a multiple of 128, so its FP8 block scales would straddle two ranks; FP8 experts under "
                 "tensor parallelism need d_ff split in multiples of 128 (use expert parallelism, --ep, or BF16 experts)");
    const auto* w1 = static_cast<const uint8_t*>(l.mlp1_w.data);
    const auto* w2 = static_cast<const uint8_t*>(l.mlp2_w.data);
    std::vector<uint8_t> m1(ne * 2 * nfp * H * eb, 0), m2(ne * H * nfp * eb, 0);
    for (size_t le = 0; le < ne; ++le) {
        std::memcpy(m1.data() + le * 2 * nfp * H * eb, w1 + ((e0 + le) * 2 * I + 2 * f0) * H * eb, 2 * nf * H * eb);
        for (size_t r = 0; r < H; ++r)
            std::memcpy(m2.data() + (le * H + r) * nfp * eb, w2 + (((e0 + le) * H + r) * I + f0) * eb, nf * eb);
    }
    dl.mlp1_w.resize(m1.size());
    dl.mlp2_w.resize(m2.size());
    up.copy(dl.mlp1_w.get(), m1.data(), m1.size());
    up.copy(dl.mlp2_w.get(), m2.data(), m2.size());
    if (!fp8) return;
    auto nb = [](size_t n) { return (n + 127) / 128; };
    const float* s1 = l.mlp1_scale.as<float>();  // [E, nb(2I), nb(H)]
    const float* s2 = l.mlp2_scale.as<float>();  // [E, nb(H), nb(I)]
    std::vector<float> g1(ne * nb(2 * nfp) * nb(H), 1.0f), g2(ne * nb(H) * nb(nfp), 1.0f);
    for (size_t le = 0; le < ne; ++le) {
        for (size_t b = 0; b < nb(2 * nf); ++b)  // bands of the slice's rows: source band 2 f0 / 128 + b
            std::memcpy(g1.data() + (le * nb(2 * nfp) + b) * nb(H), s1 + ((e0 + le) * nb(2 * I) + 2 * f0 / 128 + b) * nb(H),
                        nb(H) * sizeof(float));
        for (size_t b = 0; b < nb(H); ++b)  // k-blocks of the slice's columns: source block f0 / 128 + k
            std::memcpy(g2.data() + (le * nb(H) + b) * nb(nfp), s2 + ((e0 + le) * nb(H) + b) * nb(I) + f0 / 128,
                        nb(nf) * sizeof(float));
    }
    dl.mlp1_w_scale.resize(g1.size());
    dl.mlp2_w_scale.resize(g2.size());
    up.copy(dl.mlp1_w_scale.get(), g1.data(), g1.size() * sizeof(float));
    up.copy(dl.mlp2_w_scale.get(), g2.data(), g2.size() * sizeof(float));
}

}  // namespace

namespace {

// Layer l's MXFP4 experts (blocks and scales of both projections), in bytes.
size_t mxfp4_layer_bytes(const LayerWeights& l) {
    return l.mlp1_blocks.nbytes() + l.mlp1_scales.nbytes() + l.mlp2_blocks.nbytes() + l.mlp2_scales.nbytes();
}

// One projection's MXFP4 experts ([E, rows, cols / 32, 16] blocks, [E, rows, cols / 32] scales) copied into
// the staging buffers and requantised on the GPU into `codes` / `scale` (kernels/cuda/fp8_quantize.h).
template <class Up>
void upload_mxfp4_as_fp8(Up& up, const TensorView& blocks, const TensorView& scales, cuda::DeviceBuffer<uint8_t>& stage_b,
                         cuda::DeviceBuffer<uint8_t>& stage_s, cuda::DeviceBuffer<uint8_t>& codes,
                         cuda::DeviceBuffer<float>& scale) {
    OSPREY_CHECK(blocks.shape.size() == 4 && blocks.shape[3] == 16 && scales.numel() * 16 == blocks.numel() &&
                     blocks.nbytes() <= stage_b.bytes() && scales.nbytes() <= stage_s.bytes(),
                 blocks.name, ": expected MXFP4 blocks [E, rows, groups, 16] with their scales, got ",
                 blocks.describe(), " and ", scales.describe());
    const int E = int(blocks.shape[0]), rows = int(blocks.shape[1]), cols = int(blocks.shape[2] * 32);
    up.copy(stage_b.get(), blocks.data, blocks.nbytes());
    up.copy(stage_s.get(), scales.data, scales.nbytes());
    codes.resize(size_t(E) * rows * cols);
    scale.resize(size_t(E) * ((rows + 127) / 128) * ((cols + 127) / 128));
    cuda::mxfp4_to_fp8_blocks({.blocks = stage_b.get(), .scales = stage_s.get(), .n_mats = E, .rows = rows, .cols = cols,
                               .codes = codes.get(), .scale_inv = scale.get()},
                              up.stream());
}

}  // namespace

DeviceWeights DeviceWeights::load(const Weights& w, bool progress, bool experts_to_fp8) {
    cuda::require_device();
    const auto t0 = std::chrono::steady_clock::now();
    DeviceWeights d;
    d.config = w.config;
    const Config& c = w.config;
    // MXFP4 experts requantised on the device: the staging buffers hold one projection of one layer.
    const bool convert = experts_to_fp8 && !w.layers.empty() && w.layers[0].experts_format() == WeightFormat::mxfp4;
    size_t stage_blocks = 0, stage_scales = 0;
    if (convert) {
        size_t mxfp4 = 0;
        for (const LayerWeights& l : w.layers) {
            OSPREY_CHECK(l.experts_format() == WeightFormat::mxfp4, l.mlp1_w.name, ": the layers' experts mix formats");
            mxfp4 += mxfp4_layer_bytes(l);
            stage_blocks = std::max({stage_blocks, l.mlp1_blocks.nbytes(), l.mlp2_blocks.nbytes()});
            stage_scales = std::max({stage_scales, l.mlp1_scales.nbytes(), l.mlp2_scales.nbytes()});
        }
        // what the host conversion of the experts would hold: E4M3 codes and their F32 multipliers
        const size_t fp8 = conversion_bytes(w, WeightFormat::fp8, {.attention = false, .experts = true, .unembedding = false});
        check_device_memory(w, tensor_bytes(w) - mxfp4 + fp8 + stage_blocks + stage_scales, fp8);
    } else {
        check_device_memory(w, tensor_bytes(w), expert_bytes(w));
    }
    Uploader up(w.total_bytes(), progress);
    cuda::DeviceBuffer<uint8_t> stage_b(stage_blocks), stage_s(stage_scales);

    check_bf16(w.embedding);
    up.upload(d.embedding, w.embedding);
    d.layers.resize(c.n_layers);
    for (int i = 0; i < c.n_layers; ++i) {
        const LayerWeights& l = w.layers[i];
        DeviceLayer& dl = d.layers[i];
        for (const TensorView* v : {&l.q_b, &l.k_b, &l.v_b, &l.sinks, &l.out_b, &l.router_w, &l.router_b,
                                    &l.mlp1_bias, &l.mlp2_bias})
            check_bf16(*v);
        upload_f32(dl.attn_norm, l.attn_norm);
        upload_f32(dl.mlp_norm, l.mlp_norm);
        // q, k, v rows back to back: one [Q + 2K, H] weight and one [Q + 2K] bias.
        dl.qkv_w = upload_linear(up,
                                 {{.w = &l.q_w, .scale = &l.q_scale, .rows = c.q_dim()},
                                  {.w = &l.k_w, .scale = &l.k_scale, .rows = c.kv_dim()},
                                  {.w = &l.v_w, .scale = &l.v_scale, .rows = c.kv_dim()}},
                                 "qkv");
        dl.qkv_b.resize(size_t(c.q_dim() + 2 * c.kv_dim()));
        size_t row = 0;
        for (const auto* b : {&l.q_b, &l.k_b, &l.v_b}) {
            up.copy(dl.qkv_b.get() + row, b->data, b->nbytes());
            row += size_t(b->numel());
        }
        up.upload(dl.sinks, l.sinks);
        dl.out_w = upload_linear(up, {{.w = &l.out_w, .scale = &l.out_scale, .rows = c.d_model}}, "out_proj");
        upload_f32(dl.out_b, l.out_b);
        up.upload(dl.router_w, l.router_w);
        upload_f32(dl.router_b, l.router_b);
        dl.experts = l.experts_format();
        if (convert) {  // each projection staged, then quantised on the uploader's stream (in order)
            upload_mxfp4_as_fp8(up, l.mlp1_blocks, l.mlp1_scales, stage_b, stage_s, dl.mlp1_w, dl.mlp1_w_scale);
            upload_mxfp4_as_fp8(up, l.mlp2_blocks, l.mlp2_scales, stage_b, stage_s, dl.mlp2_w, dl.mlp2_w_scale);
            dl.experts = WeightFormat::fp8;
        } else if (dl.experts == WeightFormat::mxfp4) {
            up.upload(dl.mlp1_blocks, l.mlp1_blocks);
            up.upload(dl.mlp1_scales, l.mlp1_scales);
            up.upload(dl.mlp2_blocks, l.mlp2_blocks);
            up.upload(dl.mlp2_scales, l.mlp2_scales);
        } else {  // matrices as stored: E4M3 codes + F32 block multipliers, or BF16
            matrix_expert_bytes(l);
            up.upload(dl.mlp1_w, l.mlp1_w);
            up.upload(dl.mlp2_w, l.mlp2_w);
            if (dl.experts == WeightFormat::fp8) {
                up.upload(dl.mlp1_w_scale, l.mlp1_scale);
                up.upload(dl.mlp2_w_scale, l.mlp2_scale);
            }
        }
        up.upload(dl.mlp1_bias, l.mlp1_bias);
        up.upload(dl.mlp2_bias, l.mlp2_bias);
    }
    upload_f32(d.final_norm, w.final_norm);
    d.unembedding = upload_linear(up, {{.w = &w.unembedding, .scale = &w.unembedding_scale, .rows = c.vocab_size}},
                                  "unembedding");
    up.finish();
    d.stats.bytes = d.device_bytes();
    d.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (convert) log::info("cuda: experts requantised to FP8 128 x 128 blocks on the device while loading");
    return d;
}

DeviceWeights DeviceWeights::load(const Weights& w, bool progress, const ModelShard& p, int d_ff_padded) {
    const Config& c = w.config;
    if (p.is_whole(c) && d_ff_padded == c.d_ff) return load(w, progress);
    cuda::require_device();
    OSPREY_CHECK(p.ff.first % 32 == 0 && p.ff.count % 32 == 0 && d_ff_padded % 32 == 0 && d_ff_padded >= p.ff.count,
                 "cuda shard: expert columns ", p.ff.first, "+", p.ff.count, " padded to ", d_ff_padded);
    const auto t0 = std::chrono::steady_clock::now();
    DeviceWeights d;
    d.config = c;
    {
        // At most the non-expert tensors whole plus this piece's experts (padded columns included).
        size_t piece_experts = 0;
        for (const LayerWeights& l : w.layers) {
            const size_t per_elem = l.experts_format() == WeightFormat::mxfp4 ? 0 : matrix_expert_bytes(l);
            const size_t elems = size_t(p.experts.count) * 3 * size_t(d_ff_padded) * size_t(c.d_model);
            piece_experts += per_elem ? elems * per_elem : elems * 17 / 32;  // MXFP4: 4.25 bits per weight
        }
        check_device_memory(w, tensor_bytes(w) - expert_bytes(w) + piece_experts, piece_experts);
    }
    Uploader up(w.total_bytes(), false);
    (void)progress;
    const size_t H = size_t(c.d_model), hd = size_t(c.head_dim), I = size_t(c.d_ff);
    const size_t h0 = size_t(p.heads.first) * hd, QL = size_t(p.heads.count) * hd;
    const size_t kv0 = size_t(p.kv_heads.first) * hd, KL = size_t(p.kv_heads.count) * hd;
    const size_t e0 = size_t(p.experts.first), ne = size_t(p.experts.count);
    const size_t f0 = size_t(p.ff.first), nf = size_t(p.ff.count), nfp = size_t(d_ff_padded);
    auto bytes_of = [](const TensorView& v) { return static_cast<const uint8_t*>(v.data); };

    check_bf16(w.embedding);
    up.upload(d.embedding, w.embedding);
    d.layers.resize(c.n_layers);
    for (int i = 0; i < c.n_layers; ++i) {
        const LayerWeights& l = w.layers[i];
        DeviceLayer& dl = d.layers[i];
        for (const TensorView* v : {&l.q_b, &l.k_b, &l.v_b, &l.sinks, &l.out_b, &l.router_w, &l.router_b,
                                    &l.mlp1_bias, &l.mlp2_bias})
            check_bf16(*v);
        upload_f32(dl.attn_norm, l.attn_norm);
        upload_f32(dl.mlp_norm, l.mlp_norm);
        // q, k, v rows of this rank's heads back to back: [QL + 2 KL, H] and [QL + 2 KL].
        dl.qkv_w = upload_linear(up,
                                 {{.w = &l.q_w, .scale = &l.q_scale, .row0 = int64_t(h0), .rows = int64_t(QL)},
                                  {.w = &l.k_w, .scale = &l.k_scale, .row0 = int64_t(kv0), .rows = int64_t(KL)},
                                  {.w = &l.v_w, .scale = &l.v_scale, .row0 = int64_t(kv0), .rows = int64_t(KL)}},
                                 "qkv");
        dl.qkv_b.resize(QL + 2 * KL);
        up.copy(dl.qkv_b.get(), bytes_of(l.q_b) + h0 * 2, QL * 2);
        up.copy(dl.qkv_b.get() + QL, bytes_of(l.k_b) + kv0 * 2, KL * 2);
        up.copy(dl.qkv_b.get() + QL + KL, bytes_of(l.v_b) + kv0 * 2, KL * 2);
        dl.sinks.resize(size_t(p.heads.count));
        up.copy(dl.sinks.get(), bytes_of(l.sinks) + size_t(p.heads.first) * 2, size_t(p.heads.count) * 2);
        // out_w [H, Q]: the columns of this rank's heads.
        dl.out_w = upload_linear(
            up, {{.w = &l.out_w, .scale = &l.out_scale, .rows = int64_t(H), .col0 = int64_t(h0), .cols = int64_t(QL)}},
            "out_proj");
        if (p.out_bias) {
            upload_f32(dl.out_b, l.out_b);
        } else {
            dl.out_b.resize(H);
            dl.out_b.fill_bytes(0);
        }
        up.upload(dl.router_w, l.router_w);
        upload_f32(dl.router_b, l.router_b);
        // mlp1 bias [E, 2I]: rows [2 f0, 2 (f0 + nf)) of each local expert, then zeros up to 2 nfp.
        std::vector<uint8_t> bias1(ne * 2 * nfp * 2, 0);
        for (size_t le = 0; le < ne; ++le)
            std::memcpy(bias1.data() + le * 2 * nfp * 2, bytes_of(l.mlp1_bias) + ((e0 + le) * 2 * I + 2 * f0) * 2,
                        2 * nf * 2);
        dl.mlp1_bias.resize(bias1.size() / 2);
        up.copy(dl.mlp1_bias.get(), bias1.data(), bias1.size());
        dl.experts = l.experts_format();
        if (dl.experts == WeightFormat::mxfp4) {
            // mlp1 [E, 2I, H/32, 16] (+ scales [E, 2I, H/32]): rows [2 f0, 2 (f0 + nf)) of each local
            // expert, then zero rows up to 2 nfp.
            const size_t row1 = H / 2, row1_scales = H / 32;
            std::vector<uint8_t> b1(ne * 2 * nfp * row1, 0), s1(ne * 2 * nfp * row1_scales, 0);
            for (size_t le = 0; le < ne; ++le) {
                const size_t src_row = (e0 + le) * 2 * I + 2 * f0;
                std::memcpy(b1.data() + le * 2 * nfp * row1, bytes_of(l.mlp1_blocks) + src_row * row1, 2 * nf * row1);
                std::memcpy(s1.data() + le * 2 * nfp * row1_scales, bytes_of(l.mlp1_scales) + src_row * row1_scales,
                            2 * nf * row1_scales);
            }
            dl.mlp1_blocks.resize(b1.size());
            dl.mlp1_scales.resize(s1.size());
            up.copy(dl.mlp1_blocks.get(), b1.data(), b1.size());
            up.copy(dl.mlp1_scales.get(), s1.data(), s1.size());
            // mlp2 [E, H, I/32, 16] (+ scales [E, H, I/32]): input groups [f0/32, (f0 + nf)/32) of every row,
            // then zero groups up to nfp/32.
            const size_t g_all = I / 32, g0 = f0 / 32, ng = nf / 32, ngp = nfp / 32;
            std::vector<uint8_t> b2(ne * H * ngp * 16, 0), s2(ne * H * ngp, 0);
            for (size_t le = 0; le < ne; ++le)
                for (size_t r = 0; r < H; ++r) {
                    const size_t src = (e0 + le) * H + r, dst = le * H + r;
                    std::memcpy(b2.data() + dst * ngp * 16, bytes_of(l.mlp2_blocks) + (src * g_all + g0) * 16, ng * 16);
                    std::memcpy(s2.data() + dst * ngp, bytes_of(l.mlp2_scales) + src * g_all + g0, ng);
                }
            dl.mlp2_blocks.resize(b2.size());
            dl.mlp2_scales.resize(s2.size());
            up.copy(dl.mlp2_blocks.get(), b2.data(), b2.size());
            up.copy(dl.mlp2_scales.get(), s2.data(), s2.size());
        } else {
            upload_matrix_expert_piece(up, dl, l, p, c, nfp);
        }
        // mlp2 bias [E, H] of the local experts, or zero.
        dl.mlp2_bias.resize(ne * H);
        if (p.down_bias) {
            up.copy(dl.mlp2_bias.get(), bytes_of(l.mlp2_bias) + e0 * H * 2, ne * H * 2);
        } else {
            dl.mlp2_bias.fill_bytes(0);
        }
        up.finish_pending();  // the host staging vectors above die at the end of this iteration
    }
    upload_f32(d.final_norm, w.final_norm);
    d.unembedding = upload_linear(
        up, {{.w = &w.unembedding, .scale = &w.unembedding_scale, .row0 = p.vocab.first, .rows = p.vocab.count}},
        "unembedding");
    up.finish();
    d.stats.bytes = d.device_bytes();
    d.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return d;
}

size_t DeviceWeights::device_bytes() const {
    size_t n = embedding.bytes() + final_norm.bytes() + unembedding.bytes();
    for (const DeviceLayer& l : layers) {
        n += l.attn_norm.bytes() + l.qkv_w.bytes() + l.qkv_b.bytes() + l.sinks.bytes() + l.out_w.bytes() +
             l.out_b.bytes() + l.mlp_norm.bytes() + l.router_w.bytes() + l.router_b.bytes() + l.mlp1_blocks.bytes() +
             l.mlp1_scales.bytes() + l.mlp1_bias.bytes() + l.mlp2_blocks.bytes() + l.mlp2_scales.bytes() +
             l.mlp2_bias.bytes() + l.mlp1_w.bytes() + l.mlp1_w_scale.bytes() + l.mlp2_w.bytes() +
             l.mlp2_w_scale.bytes() + l.mlp1_blocks_decode.bytes() + l.mlp2_blocks_decode.bytes();
    }
    return n;
}

void add_decode_copy(DeviceLayer& l, cudaStream_t stream) {
    l.mlp1_blocks_decode.resize(l.mlp1_blocks.size());
    l.mlp2_blocks_decode.resize(l.mlp2_blocks.size());
    cuda::mxfp4_to_decode_layout(l.mlp1_blocks.get(), l.mlp1_blocks_decode.get(), l.mlp1_blocks.bytes(), stream);
    cuda::mxfp4_to_decode_layout(l.mlp2_blocks.get(), l.mlp2_blocks_decode.get(), l.mlp2_blocks.bytes(), stream);
}

void DeviceWeights::add_decode_copies(size_t keep_free) {
    size_t need = 0;
    for (const DeviceLayer& l : layers)
        if (l.experts == WeightFormat::mxfp4 && l.mlp1_blocks_decode.size() == 0)
            need += l.mlp1_blocks.bytes() + l.mlp2_blocks.bytes();
    if (need == 0) return;
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    OSPREY_CHECK(need + keep_free <= free_bytes, "cuda: the decode-layout copy of the MXFP4 experts needs ",
                 need / 1e9, " GB and ", keep_free / 1e9, " GB must stay free, the GPU has ", free_bytes / 1e9,
                 " GB free of ", total_bytes / 1e9, " GB (leave OSPREY_MOE_DECODE_COPY unset)");
    for (DeviceLayer& l : layers)
        if (l.experts == WeightFormat::mxfp4 && l.mlp1_blocks_decode.size() == 0) add_decode_copy(l, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    log::info("cuda: ", need / 1e9, " GB of MXFP4 experts copied into the decode layout (moe_decode reads them)");
}

}  // namespace osprey::model
