#include "model/cuda/device_weights.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/thread_pool.h"

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

}  // namespace

DeviceWeights DeviceWeights::load(const Weights& w, bool progress) {
    cuda::require_device();
    const auto t0 = std::chrono::steady_clock::now();
    DeviceWeights d;
    d.config = w.config;
    const Config& c = w.config;
    Uploader up(w.total_bytes(), progress);

    check_bf16(w.embedding);
    up.upload(d.embedding, w.embedding);
    d.layers.resize(c.n_layers);
    for (int i = 0; i < c.n_layers; ++i) {
        const LayerWeights& l = w.layers[i];
        DeviceLayer& dl = d.layers[i];
        for (const TensorView* v : {&l.q_w, &l.k_w, &l.v_w, &l.q_b, &l.k_b, &l.v_b, &l.sinks, &l.out_w, &l.out_b,
                                    &l.router_w, &l.router_b, &l.mlp1_bias, &l.mlp2_bias})
            check_bf16(*v);
        upload_f32(dl.attn_norm, l.attn_norm);
        upload_f32(dl.mlp_norm, l.mlp_norm);
        // q, k, v rows back to back: one [Q + 2K, H] weight and one [Q + 2K] bias.
        dl.qkv_w.resize(size_t(c.q_dim() + 2 * c.kv_dim()) * c.d_model);
        dl.qkv_b.resize(size_t(c.q_dim() + 2 * c.kv_dim()));
        size_t row = 0;
        for (const auto* pair : {&l.q_w, &l.k_w, &l.v_w}) {
            up.copy(dl.qkv_w.get() + row * c.d_model, pair->data, pair->nbytes());
            row += size_t(pair->shape[0]);
        }
        OSPREY_CHECK(row == size_t(c.q_dim() + 2 * c.kv_dim()), "layer ", i, ": q/k/v rows ", row);
        row = 0;
        for (const auto* b : {&l.q_b, &l.k_b, &l.v_b}) {
            up.copy(dl.qkv_b.get() + row, b->data, b->nbytes());
            row += size_t(b->numel());
        }
        up.upload(dl.sinks, l.sinks);
        up.upload(dl.out_w, l.out_w);
        upload_f32(dl.out_b, l.out_b);
        up.upload(dl.router_w, l.router_w);
        upload_f32(dl.router_b, l.router_b);
        up.upload(dl.mlp1_blocks, l.mlp1_blocks);
        up.upload(dl.mlp1_scales, l.mlp1_scales);
        up.upload(dl.mlp1_bias, l.mlp1_bias);
        up.upload(dl.mlp2_blocks, l.mlp2_blocks);
        up.upload(dl.mlp2_scales, l.mlp2_scales);
        up.upload(dl.mlp2_bias, l.mlp2_bias);
    }
    upload_f32(d.final_norm, w.final_norm);
    check_bf16(w.unembedding);
    up.upload(d.unembedding, w.unembedding);
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
             l.mlp2_bias.bytes();
    }
    return n;
}

}  // namespace osprey::model
