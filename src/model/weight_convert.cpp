// Load-time and ahead-of-time weight conversion (see weight_convert.h, docs/fp8.md).
#include "model/weight_convert.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#include "core/bf16.h"
#include "core/check.h"
#include "core/file.h"
#include "core/fp8.h"
#include "core/json.h"
#include "core/log.h"
#include "core/mxfp4.h"
#include "io/safetensors_writer.h"

namespace osprey::model {

namespace fs = std::filesystem;

Fp8Parts parse_fp8_parts(std::string_view list, std::string_view flag) {
    Fp8Parts p{false, false, false};
    size_t begin = 0;
    OSPREY_CHECK(!list.empty(), flag, " needs a list of attention, experts, unembedding");
    while (begin <= list.size()) {
        const size_t end = std::min(list.find(',', begin), list.size());
        const std::string_view item = list.substr(begin, end - begin);
        if (item == "attention")
            p.attention = true;
        else if (item == "experts")
            p.experts = true;
        else if (item == "unembedding")
            p.unembedding = true;
        else
            OSPREY_FAIL(flag, ": unknown part '", item, "' (parts: attention, experts, unembedding)");
        begin = end + 1;
    }
    return p;
}

std::string fp8_parts_name(const Fp8Parts& p) {
    std::vector<std::string_view> names;
    if (p.attention) names.push_back("attention");
    if (p.experts) names.push_back("experts");
    if (p.unembedding) names.push_back("unembedding");
    std::string s;
    for (std::string_view n : names) {
        if (!s.empty()) s.push_back(',');
        s.append(n);
    }
    return s.empty() ? std::string("none") : s;
}

WeightFormat parse_weight_format(std::string_view name, std::string_view flag) {
    if (name == "fp8") return WeightFormat::fp8;
    if (name == "mxfp4") return WeightFormat::mxfp4;
    if (name == "bf16") return WeightFormat::bf16;
    OSPREY_FAIL(flag, " must be fp8, mxfp4 or bf16, got '", name, "'");
}

// ---- matrix sources ---------------------------------------------------------------------------

int64_t MatrixSource::bands_per_mat() const {
    return fp8::n_blocks(rows);
}

MatrixSource linear_source(const TensorView& w, const TensorView& scale) {
    OSPREY_CHECK(w.shape.size() == 2 || w.shape.size() == 3, w.name, ": expected a matrix, got ", w.describe());
    MatrixSource s;
    s.n_mats = w.shape.size() == 3 ? w.shape[0] : 1;
    s.rows = w.shape[w.shape.size() - 2];
    s.cols = w.shape.back();
    const int64_t rows = s.rows, cols = s.cols;
    if (w.dtype == DType::bf16) {
        const bf16* data = w.as<bf16>();
        s.read = [=](int64_t mat, int64_t row, float* out) {
            const bf16* r = data + (mat * rows + row) * cols;
            for (int64_t c = 0; c < cols; ++c) out[c] = bf16_to_float(r[c]);
        };
        return s;
    }
    OSPREY_CHECK(w.dtype == DType::fp8_e4m3, w.name, ": expected bf16 or fp8, got ", w.describe());
    const int64_t rb = fp8::n_blocks(rows), cb = fp8::n_blocks(cols);
    OSPREY_CHECK(scale.dtype == DType::f32 && scale.numel() == s.n_mats * rb * cb, w.name,
                 ": FP8 weights need F32 block scales of ", s.n_mats * rb * cb, " elements, got ", scale.describe());
    const uint8_t* data = w.as<uint8_t>();
    const float* sc = scale.as<float>();
    s.read = [=](int64_t mat, int64_t row, float* out) {
        const auto& table = fp8::e4m3_table();
        const uint8_t* r = data + (mat * rows + row) * cols;
        const float* srow = sc + (mat * rb + row / fp8::kBlock) * cb;
        for (int64_t c = 0; c < cols; ++c) out[c] = table[r[c]] * srow[c / fp8::kBlock];
    };
    return s;
}

MatrixSource mxfp4_source(const TensorView& blocks, const TensorView& scales) {
    OSPREY_CHECK(blocks.shape.size() == 4 && blocks.dtype == DType::u8 && scales.dtype == DType::u8 &&
                     scales.numel() * mxfp4::kBlockBytes == blocks.numel(),
                 blocks.name, ": expected MXFP4 blocks [E, rows, groups, 16] with scales, got ", blocks.describe(),
                 " and ", scales.describe());
    MatrixSource s;
    s.n_mats = blocks.shape[0];
    s.rows = blocks.shape[1];
    s.cols = blocks.shape[2] * mxfp4::kBlockElements;
    const int64_t rows = s.rows, groups = blocks.shape[2];
    const uint8_t* b = blocks.as<uint8_t>();
    const uint8_t* sc = scales.as<uint8_t>();
    s.read = [=](int64_t mat, int64_t row, float* out) {
        const int64_t r = mat * rows + row;
        mxfp4::decode_row(b + r * groups * mxfp4::kBlockBytes, sc + r * groups, int(groups * mxfp4::kBlockElements),
                          out);
    };
    return s;
}

int quantize_band(const MatrixSource& src, int64_t band, uint8_t* q, float* scale_inv, std::vector<float>& scratch) {
    const int64_t per = src.bands_per_mat();
    const int64_t mat = band / per, row0 = (band % per) * fp8::kBlock;
    const int n = int(std::min<int64_t>(fp8::kBlock, src.rows - row0));
    scratch.resize(size_t(n) * src.cols);
    for (int r = 0; r < n; ++r) src.read(mat, row0 + r, scratch.data() + size_t(r) * src.cols);
    fp8::quantize_band(scratch.data(), n, src.cols, q, scale_inv);
    return n;
}

namespace {

// ---- load-time conversion ---------------------------------------------------------------------

// A buffer owned by `w` and a view of it named after `like`.
TensorView own(Weights& w, std::vector<uint8_t> bytes, const std::string& name, DType dtype,
               std::vector<int64_t> shape) {
    auto buf = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
    TensorView v{.name = name, .dtype = dtype, .shape = std::move(shape), .data = buf->data()};
    OSPREY_CHECK(v.nbytes() == buf->size(), name, ": ", buf->size(), " bytes for ", v.describe());
    w.owned.push_back(std::move(buf));
    return v;
}

std::vector<int64_t> stack_shape(const MatrixSource& s, int64_t rows, int64_t cols, bool stacked) {
    return stacked ? std::vector<int64_t>{s.n_mats, rows, cols} : std::vector<int64_t>{rows, cols};
}

// `src` as FP8: sets `view` (codes) and `scale` (multipliers), named after `name`.
void to_fp8(Weights& w, const MatrixSource& src, bool stacked, const std::string& name, TensorView& view,
            TensorView& scale, ThreadPool& pool) {
    const int64_t cb = fp8::n_blocks(src.cols);
    std::vector<uint8_t> q(size_t(src.n_mats * src.rows * src.cols));
    std::vector<uint8_t> s(size_t(src.n_bands() * cb) * sizeof(float));
    pool.parallel_for(src.n_bands(), [&](int64_t begin, int64_t end) {
        std::vector<float> scratch;
        for (int64_t band = begin; band < end; ++band) {
            const int64_t mat = band / src.bands_per_mat(), row0 = (band % src.bands_per_mat()) * fp8::kBlock;
            quantize_band(src, band, q.data() + size_t((mat * src.rows + row0) * src.cols),
                          reinterpret_cast<float*>(s.data()) + band * cb, scratch);
        }
    });
    view =
        own(w, std::move(q), name + " (fp8 at load)", DType::fp8_e4m3, stack_shape(src, src.rows, src.cols, stacked));
    scale = own(w, std::move(s), name + " (fp8 block scales at load)", DType::f32,
                stack_shape(src, src.bands_per_mat(), cb, stacked));
}

// `src` as BF16 (rounded to nearest even; exact for MXFP4).
TensorView to_bf16(Weights& w, const MatrixSource& src, bool stacked, const std::string& name, ThreadPool& pool) {
    std::vector<uint8_t> out(size_t(src.n_mats * src.rows * src.cols) * sizeof(bf16));
    bf16* o = reinterpret_cast<bf16*>(out.data());
    pool.parallel_for(src.n_mats * src.rows, [&](int64_t begin, int64_t end) {
        std::vector<float> row(size_t(src.cols));
        for (int64_t r = begin; r < end; ++r) {
            src.read(r / src.rows, r % src.rows, row.data());
            for (int64_t c = 0; c < src.cols; ++c) o[r * src.cols + c] = float_to_bf16(row[size_t(c)]);
        }
    });
    return own(w, std::move(out), name + " (bf16 at load)", DType::bf16, stack_shape(src, src.rows, src.cols, stacked));
}

// The source a dense linear weight (q/k/v/o, unembedding) converts from for `format`, or none when it stays:
// FP8 from BF16 where the part is asked for, BF16 from FP8 always. (convert_linear and conversion_bytes.)
std::optional<MatrixSource> linear_conversion(const TensorView& view, const TensorView& scale, WeightFormat format,
                                              bool part) {
    const bool is_fp8 = view.dtype == DType::fp8_e4m3;
    if (format == WeightFormat::fp8 && part && !is_fp8) return linear_source(view);
    if (format == WeightFormat::bf16 && is_fp8) return linear_source(view, scale);
    return std::nullopt;
}

void convert_linear(Weights& w, TensorView& view, TensorView& scale, WeightFormat format, bool part, ThreadPool& pool) {
    const std::optional<MatrixSource> src = linear_conversion(view, scale, format, part);
    if (!src) return;
    if (format == WeightFormat::fp8) {
        to_fp8(w, *src, false, view.name, view, scale, pool);
    } else {
        view = to_bf16(w, *src, false, view.name, pool);
        scale = {};
    }
}

// The sources a layer's experts (mlp1, mlp2) convert from for `format`, or none when they stay: nothing
// leaves MXFP4 for MXFP4, nor the format they are in, nor FP8 when the experts part is not asked for.
std::optional<std::pair<MatrixSource, MatrixSource>> expert_conversion(const LayerWeights& L, WeightFormat format,
                                                                        bool part) {
    const WeightFormat now = L.experts_format();
    if (format == WeightFormat::mxfp4 || now == format || (format == WeightFormat::fp8 && !part)) return std::nullopt;
    if (now == WeightFormat::mxfp4)
        return std::pair{mxfp4_source(L.mlp1_blocks, L.mlp1_scales), mxfp4_source(L.mlp2_blocks, L.mlp2_scales)};
    return std::pair{linear_source(L.mlp1_w, L.mlp1_scale), linear_source(L.mlp2_w, L.mlp2_scale)};
}

void convert_experts(Weights& w, LayerWeights& L, WeightFormat format, bool part, ThreadPool& pool) {
    const auto src = expert_conversion(L, format, part);
    if (!src) return;
    const auto& [s1, s2] = *src;
    const bool mxfp4 = L.experts_format() == WeightFormat::mxfp4;
    const std::string n1 = mxfp4 ? L.mlp1_blocks.name : L.mlp1_w.name;
    const std::string n2 = mxfp4 ? L.mlp2_blocks.name : L.mlp2_w.name;
    TensorView w1, sc1, w2, sc2;
    if (format == WeightFormat::fp8) {
        to_fp8(w, s1, true, n1, w1, sc1, pool);
        to_fp8(w, s2, true, n2, w2, sc2, pool);
    } else {
        w1 = to_bf16(w, s1, true, n1, pool);
        w2 = to_bf16(w, s2, true, n2, pool);
    }
    L.mlp1_blocks = L.mlp1_scales = L.mlp2_blocks = L.mlp2_scales = {};
    L.mlp1_w = w1, L.mlp1_scale = sc1, L.mlp2_w = w2, L.mlp2_scale = sc2;
}

// Bytes of one matrix (or stack) held in `format` after conversion: FP8 codes plus their multipliers, or BF16.
size_t converted_bytes(const MatrixSource& src, WeightFormat format) {
    const size_t elems = size_t(src.n_mats * src.rows * src.cols);
    return format == WeightFormat::fp8 ? elems + size_t(src.n_bands() * fp8::n_blocks(src.cols)) * sizeof(float)
                                       : elems * sizeof(bf16);
}

// MemAvailable of /proc/meminfo in bytes, or 0 where it cannot be read (no check then).
size_t host_memory_available() {
    std::FILE* f = std::fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    std::fclose(f);
    return kb * 1024;
}

}  // namespace

size_t conversion_bytes(const Weights& w, WeightFormat format, const Fp8Parts& parts) {
    size_t n = 0;
    auto linear = [&](const TensorView& view, const TensorView& scale, bool part) {
        if (const auto src = linear_conversion(view, scale, format, part)) n += converted_bytes(*src, format);
    };
    for (const LayerWeights& L : w.layers) {
        for (const auto& [v, sc] : {std::pair{&L.q_w, &L.q_scale}, {&L.k_w, &L.k_scale}, {&L.v_w, &L.v_scale},
                                    {&L.out_w, &L.out_scale}})
            linear(*v, *sc, parts.attention);
        if (const auto src = expert_conversion(L, format, parts.experts))
            n += converted_bytes(src->first, format) + converted_bytes(src->second, format);
    }
    linear(w.unembedding, w.unembedding_scale, parts.unembedding);
    return n;
}

void check_conversion_memory(size_t need, size_t available, WeightFormat format) {
    OSPREY_CHECK(available == 0 || need <= available, "--weights ", weight_format_name(format),
                 ": converting at load needs ", double(need) / 1e9, " GB of host memory for the converted tensors, ",
                 "and ", double(available) / 1e9, " GB is available (MemAvailable). On one GPU the CUDA backend ",
                 "converts the experts on the device instead; otherwise convert fewer parts (--convert), or ahead of ",
                 "time with `osprey convert --to fp8` into a folder on a disk with room, and load that");
}

Weights convert_weights(Weights w, WeightFormat format, const Fp8Parts& parts, ThreadPool& pool) {
    if (format == WeightFormat::mxfp4) {
        for (const LayerWeights& L : w.layers)
            OSPREY_CHECK(L.experts_format() == WeightFormat::mxfp4 && L.attention_format() == WeightFormat::bf16,
                         "--weights mxfp4: ", w.dir.string(), " holds ", w.formats(),
                         "; MXFP4 cannot be recovered from converted weights (load the published checkpoint, or "
                         "use --weights fp8|bf16)");
        OSPREY_CHECK(w.unembedding_format() == WeightFormat::bf16, "--weights mxfp4: ", w.dir.string(), " holds ",
                     w.formats(), " (load the published checkpoint, or use --weights fp8|bf16)");
        return w;
    }
    // Refused up front, naming the need, rather than dying half way for lack of memory (120b --weights fp8
    // holds 115 GB of FP8 experts).
    check_conversion_memory(conversion_bytes(w, format, parts), host_memory_available(), format);
    const auto t0 = std::chrono::steady_clock::now();
    for (LayerWeights& L : w.layers) {
        convert_linear(w, L.q_w, L.q_scale, format, parts.attention, pool);
        convert_linear(w, L.k_w, L.k_scale, format, parts.attention, pool);
        convert_linear(w, L.v_w, L.v_scale, format, parts.attention, pool);
        convert_linear(w, L.out_w, L.out_scale, format, parts.attention, pool);
        convert_experts(w, L, format, parts.experts, pool);
    }
    convert_linear(w, w.unembedding, w.unembedding_scale, format, parts.unembedding, pool);
    log::info("weights: ", weight_format_name(format), " at load (", w.formats(), ") in ",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s");
    return w;
}

// ---- ahead-of-time conversion -----------------------------------------------------------------

namespace {

// One output tensor and how to produce its bytes.
struct Planned {
    io::TensorSpec spec;
    enum class Kind { copy, fp8_codes, fp8_scales } kind = Kind::copy;
    TensorView view;   // copy: the input tensor
    MatrixSource src;  // fp8_*: the matrix to quantise
};

// Bytes [offset, offset + n) of a quantised tensor: the bands they fall in are quantised again (a
// band that straddles two fill chunks is computed twice; the results are identical).
void fill_fp8(const Planned& p, uint64_t offset, uint8_t* out, size_t n) {
    const MatrixSource& s = p.src;
    const int64_t cb = fp8::n_blocks(s.cols);
    const bool codes = p.kind == Planned::Kind::fp8_codes;
    // Bytes per band in this tensor: a band's codes, or its row of multipliers.
    const auto band_of = [&](uint64_t byte) -> int64_t {
        if (!codes) return int64_t(byte / (uint64_t(cb) * sizeof(float)));
        const int64_t row = int64_t(byte / uint64_t(s.cols));  // row of the stacked [n_mats * rows, cols]
        return (row / s.rows) * s.bands_per_mat() + (row % s.rows) / fp8::kBlock;
    };
    const auto band_begin = [&](int64_t band) -> uint64_t {
        if (!codes) return uint64_t(band) * cb * sizeof(float);
        const int64_t mat = band / s.bands_per_mat(), row0 = (band % s.bands_per_mat()) * fp8::kBlock;
        return uint64_t(mat * s.rows + row0) * uint64_t(s.cols);
    };
    std::vector<uint8_t> q;
    std::vector<float> scales(static_cast<size_t>(cb)), scratch;
    for (int64_t band = band_of(offset); band < s.n_bands() && band_begin(band) < offset + n; ++band) {
        q.resize(size_t(fp8::kBlock * s.cols));
        const int rows = quantize_band(s, band, q.data(), scales.data(), scratch);
        const uint8_t* bytes = codes ? q.data() : reinterpret_cast<const uint8_t*>(scales.data());
        const uint64_t size = codes ? uint64_t(rows) * s.cols : uint64_t(cb) * sizeof(float);
        const uint64_t b0 = band_begin(band), lo = std::max(b0, offset), hi = std::min(b0 + size, offset + n);
        if (hi > lo) std::memcpy(out + (lo - offset), bytes + (lo - b0), hi - lo);
    }
}

class Planner {
public:
    explicit Planner(std::vector<Planned>& out) : out_(out) {}

    void copy(const std::string& name, const TensorView& v) {
        OSPREY_CHECK(v.data != nullptr, name, ": no data to copy");
        out_.push_back({.spec = {name, v.dtype, v.shape}, .kind = Planned::Kind::copy, .view = v, .src = {}});
    }
    // `src` quantised: `name` (codes) and `scale_name` (multipliers).
    void fp8(const std::string& name, const std::string& scale_name, const MatrixSource& src, bool stacked) {
        const int64_t rb = src.bands_per_mat(), cb = fp8::n_blocks(src.cols);
        std::vector<int64_t> shape =
            stacked ? std::vector<int64_t>{src.n_mats, src.rows, src.cols} : std::vector<int64_t>{src.rows, src.cols};
        std::vector<int64_t> sshape = stacked ? std::vector<int64_t>{src.n_mats, rb, cb} : std::vector<int64_t>{rb, cb};
        out_.push_back(
            {.spec = {name, DType::fp8_e4m3, shape}, .kind = Planned::Kind::fp8_codes, .view = {}, .src = src});
        out_.push_back(
            {.spec = {scale_name, DType::f32, sshape}, .kind = Planned::Kind::fp8_scales, .view = {}, .src = src});
    }
    // A dense linear: FP8 when converted (or already FP8), else as stored.
    void linear(const std::string& prefix, const TensorView& w, const TensorView& scale, bool convert) {
        if (w.dtype == DType::fp8_e4m3) {
            copy(prefix + ".weight", w);
            copy(prefix + ".weight_scale_inv", scale);
        } else if (convert) {
            fp8(prefix + ".weight", prefix + ".weight_scale_inv", linear_source(w), false);
        } else {
            copy(prefix + ".weight", w);
        }
    }

private:
    std::vector<Planned>& out_;
};

std::vector<Planned> plan_fp8(const Weights& w, const Fp8Parts& parts) {
    std::vector<Planned> plan;
    Planner p(plan);
    p.copy("model.embed_tokens.weight", w.embedding);
    for (size_t i = 0; i < w.layers.size(); ++i) {
        const LayerWeights& L = w.layers[i];
        const std::string l = str("model.layers.", i, ".");
        p.copy(l + "input_layernorm.weight", L.attn_norm);
        p.linear(l + "self_attn.q_proj", L.q_w, L.q_scale, parts.attention);
        p.copy(l + "self_attn.q_proj.bias", L.q_b);
        p.linear(l + "self_attn.k_proj", L.k_w, L.k_scale, parts.attention);
        p.copy(l + "self_attn.k_proj.bias", L.k_b);
        p.linear(l + "self_attn.v_proj", L.v_w, L.v_scale, parts.attention);
        p.copy(l + "self_attn.v_proj.bias", L.v_b);
        p.linear(l + "self_attn.o_proj", L.out_w, L.out_scale, parts.attention);
        p.copy(l + "self_attn.o_proj.bias", L.out_b);
        p.copy(l + "self_attn.sinks", L.sinks);
        p.copy(l + "post_attention_layernorm.weight", L.mlp_norm);
        p.copy(l + "mlp.router.weight", L.router_w);
        p.copy(l + "mlp.router.bias", L.router_b);
        const std::string e = l + "mlp.experts.";
        switch (L.experts_format()) {
            case WeightFormat::mxfp4:
                if (parts.experts) {
                    p.fp8(e + "gate_up_proj", e + "gate_up_proj_scales_inv", mxfp4_source(L.mlp1_blocks, L.mlp1_scales),
                          true);
                    p.fp8(e + "down_proj", e + "down_proj_scales_inv", mxfp4_source(L.mlp2_blocks, L.mlp2_scales),
                          true);
                } else {
                    p.copy(e + "gate_up_proj_blocks", L.mlp1_blocks);
                    p.copy(e + "gate_up_proj_scales", L.mlp1_scales);
                    p.copy(e + "down_proj_blocks", L.mlp2_blocks);
                    p.copy(e + "down_proj_scales", L.mlp2_scales);
                }
                break;
            case WeightFormat::fp8:
                p.copy(e + "gate_up_proj", L.mlp1_w);
                p.copy(e + "gate_up_proj_scales_inv", L.mlp1_scale);
                p.copy(e + "down_proj", L.mlp2_w);
                p.copy(e + "down_proj_scales_inv", L.mlp2_scale);
                break;
            case WeightFormat::bf16:
                if (parts.experts) {
                    p.fp8(e + "gate_up_proj", e + "gate_up_proj_scales_inv", linear_source(L.mlp1_w), true);
                    p.fp8(e + "down_proj", e + "down_proj_scales_inv", linear_source(L.mlp2_w), true);
                } else {
                    p.copy(e + "gate_up_proj", L.mlp1_w);
                    p.copy(e + "down_proj", L.mlp2_w);
                }
                break;
        }
        p.copy(e + "gate_up_proj_bias", L.mlp1_bias);
        p.copy(e + "down_proj_bias", L.mlp2_bias);
    }
    p.copy("model.norm.weight", w.final_norm);
    p.linear("lm_head", w.unembedding, w.unembedding_scale, parts.unembedding);
    return plan;
}

// config.json of the output: the input's HF config (or one made from the original config) with the
// FP8 quantization_config in place of the MXFP4 one.
json::Value fp8_config(const Weights& w, const Fp8Parts& parts) {
    json::Value c = w.config.to_hf_json();
    const fs::path hf_config = w.dir / "config.json";
    if (w.layout == Layout::hf && fs::is_regular_file(hf_config)) c = json::parse(read_file(hf_config));
    json::Array not_converted{json::Value("model.embed_tokens"), json::Value("model.layers.*.mlp.router")};
    const bool attention =
        parts.attention || (!w.layers.empty() && w.layers[0].attention_format() == WeightFormat::fp8);
    const bool experts = parts.experts || (!w.layers.empty() && w.layers[0].experts_format() == WeightFormat::fp8);
    const bool unembedding = parts.unembedding || w.unembedding_format() == WeightFormat::fp8;
    if (!attention) not_converted.emplace_back("model.layers.*.self_attn");
    if (!experts) not_converted.emplace_back("model.layers.*.mlp.experts");
    if (!unembedding) not_converted.emplace_back("lm_head");
    json::Value q{json::Object{}};
    q.set("quant_method", "fp8");
    q.set("fmt", "e4m3");
    q.set("activation_scheme", "dynamic");
    q.set("weight_block_size", json::Array{json::Value(fp8::kBlock), json::Value(fp8::kBlock)});
    q.set("modules_to_not_convert", std::move(not_converted));
    c.set("quantization_config", std::move(q));
    return c;
}

}  // namespace

ConvertResult write_fp8_checkpoint(const ConvertOptions& o) {
    OSPREY_CHECK(!o.out.empty(), "convert: no output folder given (--out)");
    OSPREY_CHECK(o.parts.attention || o.parts.experts || o.parts.unembedding, "convert: nothing to convert");
    const Weights w = Weights::load(o.model);
    std::error_code ec;
    OSPREY_CHECK(!fs::exists(o.out) || !fs::equivalent(o.out, o.model, ec), "convert: --out must differ from --model");
    OSPREY_CHECK(!fs::exists(o.out) || !fs::equivalent(o.out, w.dir, ec), "convert: --out must differ from --model");
    fs::create_directories(o.out);
    const std::vector<Planned> plan = plan_fp8(w, o.parts);
    const auto t0 = std::chrono::steady_clock::now();

    std::vector<uint64_t> sizes;
    for (const Planned& p : plan) sizes.push_back(p.spec.nbytes());
    const std::vector<std::vector<size_t>> shards = io::group_into_shards(sizes, o.max_shard_bytes);
    ConvertResult result;
    std::vector<std::pair<std::string, std::string>> entries;
    uint64_t total = 0;
    for (size_t s = 0; s < shards.size(); ++s) {
        const std::string file = io::shard_file_name(s, shards.size() - 1);
        std::vector<io::TensorSpec> specs;
        for (size_t i : shards[s]) {
            specs.push_back(plan[i].spec);
            entries.emplace_back(plan[i].spec.name, file);
            total += plan[i].spec.nbytes();
        }
        const std::vector<size_t>& members = shards[s];
        log::info("convert: writing ", (o.out / file).string(), " (", specs.size(), " tensors)");
        result.bytes +=
            io::write_safetensors(o.out / file, specs, {{"format", "pt"}},
                                  [&](size_t index, uint64_t offset, uint8_t* out, size_t n) {
                                      const Planned& p = plan[members[index]];
                                      if (p.kind == Planned::Kind::copy)
                                          std::memcpy(out, static_cast<const uint8_t*>(p.view.data) + offset, n);
                                      else
                                          fill_fp8(p, offset, out, n);
                                  },
                                  {.threads = o.threads});
        result.files.push_back(o.out / file);
    }
    // Shards of an earlier run with another shard count would be picked up by globbing loaders.
    for (const auto& f : fs::directory_iterator(o.out)) {
        const std::string n = f.path().filename().string();
        const bool ours = std::find(result.files.begin(), result.files.end(), f.path()) != result.files.end();
        if (!ours && f.path().extension() == ".safetensors") fs::remove(f.path());
    }
    std::sort(entries.begin(), entries.end());
    json::Value weight_map{json::Object{}};
    for (const auto& [name, file] : entries) weight_map.set(name, file);
    json::Value meta{json::Object{}};
    meta.set("total_size", total);
    json::Value index{json::Object{}};
    index.set("metadata", meta);
    index.set("weight_map", weight_map);
    write_file(o.out / "model.safetensors.index.json", index.dump(2) + "\n");
    write_file(o.out / "config.json", fp8_config(w, o.parts).dump(2) + "\n");
    result.files.push_back(o.out / "model.safetensors.index.json");
    result.files.push_back(o.out / "config.json");
    // Everything else at the top of the input folder (tokenizer, generation config, chat template).
    for (const auto& f : fs::directory_iterator(o.model)) {
        const std::string n = f.path().filename().string();
        if (!f.is_regular_file() || f.path().extension() == ".safetensors" || n == "model.safetensors.index.json" ||
            n == "config.json")
            continue;
        fs::copy_file(f.path(), o.out / n, fs::copy_options::overwrite_existing);
        result.files.push_back(o.out / n);
    }
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return result;
}

}  // namespace osprey::model
