// FP8 formats on the CPU backend (docs/fp8.md): the converter's layout and exactness (partial
// 128 x 128 blocks included), the loader taking a converted folder as it is, load-time conversion
// agreeing byte for byte with the converter, the three --weights modes and the FP8 KV cache through
// the CPU reference (prefill, decode, pages and rings, tensor parallel windows), and the accuracy
// comparison with bounds set per architecture.md "Comparing implementations on random weights".
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/check.h"
#include "core/file.h"
#include "core/fp8.h"
#include "core/json.h"
#include "core/mxfp4.h"
#include "io/checkpoint.h"
#include "model/format_accuracy.h"
#include "model/parallel_runner.h"
#include "model/weight_convert.h"
#include "test_reference_util.h"

namespace osprey::model {
namespace {

namespace fs = std::filesystem;
using test::Seq;

// gpt-oss's partial blocks in miniature (test::partial_blocks_config), a window of 16 and pages of 8 so
// that short runs cross both.
fs::path published() {
    return test::synthetic_checkpoint("fp8-published", test::partial_blocks_config(), 11);
}

fs::path converted(const std::string& name = "all", const Fp8Parts& parts = {}) {
    static std::map<std::string, fs::path> made;
    auto it = made.find(name);
    if (it != made.end()) return it->second;
    const fs::path out = published().string() + "-fp8-" + name;
    // Removed with the published folder's siblings at exit is not guaranteed: clean up here.
    static struct Cleanup {
        std::vector<fs::path> dirs;
        ~Cleanup() {
            for (const auto& d : dirs) {
                std::error_code ec;
                fs::remove_all(d, ec);
            }
        }
    } cleanup;
    std::ofstream(published() / "tokenizer_config.json") << "{}\n";  // a non-weight file to be copied
    write_fp8_checkpoint({.model = published(), .out = out, .parts = parts, .threads = 2});
    cleanup.dirs.push_back(out);
    made[name] = out;
    return out;
}

std::vector<int32_t> prompt(int n, int salt = 0) {
    std::vector<int32_t> t(n);
    for (int i = 0; i < n; ++i) t[i] = int32_t((37 * i + 11 + salt * 101) % 290 + 2);
    return t;
}

std::unique_ptr<CpuReference> reference(Weights w, KvDtype kv = KvDtype::f32) {
    auto ref = std::make_unique<CpuReference>(std::move(w), CpuReferenceOptions{.n_threads = 2, .kv_dtype = kv});
    ref->allocate_kv(kv_layout_for(*ref, 8, 32, 4));
    return ref;
}

std::vector<float> run(ModelRunner& m, const std::vector<int32_t>& tokens, const std::vector<int>& chunks) {
    Seq s{.tokens = tokens, .pages = test::pages_from(0, 16), .window_slot = 1};
    std::vector<float> logits;
    for (int n : chunks) logits = test::step(m, s, n);
    return logits;
}

std::vector<uint8_t> bytes(const TensorView& v) {
    const auto* p = static_cast<const uint8_t*>(v.data);
    return {p, p + v.nbytes()};
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i)
        num = std::max(num, double(std::fabs(a[i] - b[i]))), den = std::max(den, double(std::fabs(a[i])));
    return num / den;
}

TEST(fp8_codec, every_code_round_trips_and_rounding_is_to_nearest_even) {
    for (int code = 0; code < 256; ++code) {
        const float v = fp8::e4m3_to_float(uint8_t(code));
        if ((code & 0x7F) == 0x7F) {
            EXPECT_TRUE(std::isnan(v)) << code;
            continue;
        }
        EXPECT_EQ(fp8::float_to_e4m3(v), uint8_t(code)) << "value " << v;
    }
    EXPECT_EQ(fp8::e4m3_to_float(0x7E), 448.0f);
    EXPECT_EQ(fp8::e4m3_to_float(0x01), 0x1p-9f);  // smallest subnormal
    EXPECT_EQ(fp8::e4m3_to_float(0x38), 1.0f);
    EXPECT_EQ(fp8::float_to_e4m3(1.0625f), 0x38);  // tie between 1 and 1.125: even mantissa
    EXPECT_EQ(fp8::float_to_e4m3(1.1875f), 0x3A);  // tie between 1.125 and 1.25: even mantissa
    EXPECT_EQ(fp8::float_to_e4m3(1000.0f), 0x7E);  // saturates
    EXPECT_EQ(fp8::float_to_e4m3(-1000.0f), 0xFE);
    EXPECT_EQ(fp8::float_to_e4m3(0x1p-11f), 0x00);  // below half the smallest subnormal
    EXPECT_EQ(fp8::float_to_e4m3(0.0155f), 0x08);   // rounds up out of the subnormals to 2^-6
    EXPECT_EQ(fp8::float_to_e4m3(NAN), 0x7F);
}

// fp8::float_to_e4m3 works on the float's bits; this is the same rule written with frexp / ldexp /
// nearbyint (its first form), compared over every 257th float (16.7 M values: every exponent, both
// signs, both special ranges) and around every code's rounding midpoint. (Compared once over all 2^32
// floats when it was written: no difference.)
uint8_t float_to_e4m3_by_frexp(float x) {
    if (std::isnan(x)) return fp8::kE4m3NanCode;
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    const float a = std::fabs(x);
    if (a >= fp8::kE4m3Max) return uint8_t(sign | fp8::kE4m3MaxCode);
    if (a < 0x1p-6f) return uint8_t(sign | int(std::nearbyint(a * 0x1p9f)));
    int e2 = 0;
    std::frexp(a, &e2);
    int e = e2 - 1;
    int m = int(std::nearbyint((std::ldexp(a, -e) - 1.0f) * 8.0f));
    if (m == 8) m = 0, ++e;
    const int code = ((e + 7) << 3) | m;
    return uint8_t(sign | (code > fp8::kE4m3MaxCode ? fp8::kE4m3MaxCode : code));
}

TEST(fp8_codec, bit_rounding_equals_the_frexp_form) {
    size_t bad = 0;
    for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 257) {
        float x;
        const uint32_t v = uint32_t(u);
        std::memcpy(&x, &v, sizeof x);
        if (fp8::float_to_e4m3(x) != float_to_e4m3_by_frexp(x) && bad++ < 5)
            ADD_FAILURE() << "bits " << std::hex << v << ": " << int(fp8::float_to_e4m3(x)) << " vs "
                          << int(float_to_e4m3_by_frexp(x));
    }
    for (int code = 0; code < 0x7E; ++code) {  // each midpoint between neighbouring codes, and either side
        const float mid = 0.5f * (fp8::e4m3_to_float(uint8_t(code)) + fp8::e4m3_to_float(uint8_t(code + 1)));
        for (const float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid})
            EXPECT_EQ(fp8::float_to_e4m3(x), float_to_e4m3_by_frexp(x)) << x;
    }
    EXPECT_EQ(bad, 0u);
}

TEST(fp8_checkpoint, layout_names_shapes_and_config) {
    const fs::path out = converted();
    const Weights w = Weights::load(out);
    const Config c = test::partial_blocks_config();
    EXPECT_EQ(w.formats(), "experts fp8, attention fp8, unembedding fp8");
    const LayerWeights& L = w.layers[1];
    EXPECT_EQ(L.q_w.describe(), "F8_E4M3 [1024, 160]");
    EXPECT_EQ(L.q_scale.describe(), "F32 [8, 2]");
    EXPECT_EQ(L.k_scale.describe(), "F32 [4, 2]");
    EXPECT_EQ(L.out_scale.describe(), "F32 [2, 8]");
    EXPECT_EQ(L.mlp1_w.describe(), "F8_E4M3 [8, 384, 160]");
    EXPECT_EQ(L.mlp1_scale.describe(), "F32 [8, 3, 2]");
    EXPECT_EQ(L.mlp2_w.describe(), "F8_E4M3 [8, 160, 192]");
    EXPECT_EQ(L.mlp2_scale.describe(), "F32 [8, 2, 2]");
    EXPECT_EQ(w.unembedding_scale.describe(), "F32 [3, 2]");
    EXPECT_EQ(L.router_w.dtype, DType::bf16);
    EXPECT_EQ(w.embedding.dtype, DType::bf16);
    ASSERT_NE(w.checkpoint->find("model.layers.1.self_attn.q_proj.weight_scale_inv"), nullptr);
    ASSERT_NE(w.checkpoint->find("model.layers.1.mlp.experts.gate_up_proj_scales_inv"), nullptr);
    const json::Value cfg = json::parse(read_file(out / "config.json"));
    const json::Value& q = cfg.at("quantization_config");
    EXPECT_EQ(q.at("quant_method").as_string(), "fp8");
    EXPECT_EQ(q.at("fmt").as_string(), "e4m3");
    EXPECT_EQ(q.at("activation_scheme").as_string(), "dynamic");
    EXPECT_EQ(q.at("weight_block_size").dump(), "[128,128]");
    EXPECT_EQ(q.at("modules_to_not_convert").dump(), R"(["model.embed_tokens","model.layers.*.mlp.router"])");
    EXPECT_EQ(Config::load(out / "config.json").d_model, c.d_model);
    EXPECT_TRUE(fs::is_regular_file(out / "generation_config.json"));
    EXPECT_TRUE(fs::is_regular_file(out / "tokenizer_config.json"));
}

TEST(fp8_checkpoint, partial_blocks_scale_over_their_real_elements_and_round_to_nearest) {
    // down_proj of expert 5, layer 2: [160, 192] from MXFP4. Block (1, 1) holds rows 128..159 and
    // columns 128..191 only: its multiplier is their amax / 448, and every element is the nearest
    // E4M3 value of w / multiplier.
    const Weights in = Weights::load(published()), w = Weights::load(converted());
    const Config c = test::partial_blocks_config();
    const LayerWeights &L = w.layers[2], &M = in.layers[2];
    const int H = c.d_model, I = c.d_ff, e = 5;
    std::vector<float> row(static_cast<size_t>(I));
    const int64_t rb = fp8::n_blocks(H), cb = fp8::n_blocks(I);
    std::vector<float> amax(size_t(rb * cb), 0.0f);
    std::vector<std::vector<float>> dense(static_cast<size_t>(H));
    for (int r = 0; r < H; ++r) {
        const int64_t g = I / 32, at = (int64_t(e) * H + r) * g;
        mxfp4::decode_row(M.mlp2_blocks.as<uint8_t>() + at * 16, M.mlp2_scales.as<uint8_t>() + at, I, row.data());
        dense[size_t(r)] = row;
        for (int col = 0; col < I; ++col)
            amax[size_t((r / 128) * cb + col / 128)] =
                std::fmax(amax[size_t((r / 128) * cb + col / 128)], std::fabs(row[size_t(col)]));
    }
    const float* scale = L.mlp2_scale.as<float>() + e * rb * cb;
    const uint8_t* q = L.mlp2_w.as<uint8_t>() + int64_t(e) * H * I;
    for (int64_t b = 0; b < rb * cb; ++b) EXPECT_EQ(scale[b], amax[size_t(b)] / 448.0f) << "block " << b;
    for (int r = 0; r < H; ++r)
        for (int col = 0; col < I; ++col) {
            const float s = scale[(r / 128) * cb + col / 128];
            ASSERT_EQ(q[int64_t(r) * I + col], fp8::float_to_e4m3(dense[size_t(r)][size_t(col)] / s))
                << r << "," << col;
        }
}

TEST(fp8_checkpoint, load_time_conversion_equals_the_converter_byte_for_byte) {
    const Weights file = Weights::load(converted());
    const Weights mem = convert_weights(Weights::load(published()), WeightFormat::fp8);
    EXPECT_EQ(mem.formats(), file.formats());
    std::vector<TensorView> a, b;
    file.for_each([&](const TensorView& v) { a.push_back(v); });
    mem.for_each([&](const TensorView& v) { b.push_back(v); });
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a[i].describe(), b[i].describe()) << a[i].name << " vs " << b[i].name;
        EXPECT_TRUE(bytes(a[i]) == bytes(b[i])) << a[i].name;
    }
}

// convert_weights checks the host memory it is about to take: conversion_bytes is exactly what the
// converted tensors hold, for each format and choice of parts, and a need beyond what is available is
// refused by name.
TEST(fp8_checkpoint, conversion_bytes_are_what_the_conversion_allocates) {
    const Weights pub = Weights::load(published());
    auto held = [](const Weights& w) {
        size_t n = 0;
        w.for_each([&](const TensorView& v) {
            if (v.name.find(" at load)") != std::string::npos) n += v.nbytes();
        });
        return n;
    };
    for (const char* parts : {"attention,experts,unembedding", "attention", "experts", "unembedding"}) {
        const Fp8Parts p = parse_fp8_parts(parts);
        EXPECT_EQ(conversion_bytes(pub, WeightFormat::fp8, p), held(convert_weights(Weights::load(published()),
                                                                                   WeightFormat::fp8, p)))
            << parts;
    }
    EXPECT_EQ(conversion_bytes(pub, WeightFormat::bf16), held(convert_weights(Weights::load(published()), WeightFormat::bf16)));
    EXPECT_EQ(conversion_bytes(pub, WeightFormat::mxfp4), 0u);
    const Weights fp8 = Weights::load(converted());  // already FP8: nothing more to hold for fp8
    EXPECT_EQ(conversion_bytes(fp8, WeightFormat::fp8), 0u);
    EXPECT_EQ(conversion_bytes(fp8, WeightFormat::bf16), held(convert_weights(Weights::load(converted()), WeightFormat::bf16)));
    EXPECT_NO_THROW(check_conversion_memory(100, 200, WeightFormat::fp8));
    EXPECT_NO_THROW(check_conversion_memory(100, 0, WeightFormat::fp8));  // unknown: no check
    try {
        check_conversion_memory(size_t(115e9), size_t(60e9), WeightFormat::fp8);
        ADD_FAILURE() << "no refusal";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("115 GB of host memory"), std::string::npos) << m;
        EXPECT_NE(m.find("60 GB is available"), std::string::npos) << m;
    }
}

TEST(fp8_checkpoint, chosen_parts_only_and_mxfp4_cannot_come_back) {
    const fs::path out = converted("attention", parse_fp8_parts("attention"));
    const Weights w = Weights::load(out);
    EXPECT_EQ(w.formats(), "experts mxfp4, attention fp8, unembedding bf16");
    const json::Value cfg = json::parse(read_file(out / "config.json"));
    EXPECT_EQ(cfg.at("quantization_config").at("modules_to_not_convert").dump(),
              R"(["model.embed_tokens","model.layers.*.mlp.router","model.layers.*.mlp.experts","lm_head"])");
    EXPECT_THROW(convert_weights(Weights::load(converted()), WeightFormat::mxfp4), Error);
    EXPECT_THROW(parse_fp8_parts("attention,router"), Error);
    EXPECT_THROW(parse_weight_format("int4"), Error);
    // The partly converted folder runs exactly as the same parts converted at load.
    const auto tokens = prompt(20);
    EXPECT_EQ(
        run(*reference(Weights::load(out)), tokens, {20}),
        run(*reference(convert_weights(Weights::load(published()), WeightFormat::fp8, parse_fp8_parts("attention"))),
            tokens, {20}));
}

TEST(fp8_forward, three_weight_modes_run_and_agree_where_they_must) {
    const auto tokens = prompt(30);
    const std::vector<float> mxfp4 = run(*reference(Weights::load(published())), tokens, {30});
    // MXFP4 decodes to BF16 exactly, and both matmuls accumulate in the same order: identical logits.
    const std::vector<float> bf16 =
        run(*reference(convert_weights(Weights::load(published()), WeightFormat::bf16)), tokens, {30});
    EXPECT_EQ(bf16, mxfp4);
    // A converted folder runs exactly as load-time conversion, and FP8 is close to the baseline.
    const std::vector<float> fp8_file = run(*reference(Weights::load(converted())), tokens, {30});
    const std::vector<float> fp8_load =
        run(*reference(convert_weights(Weights::load(published()), WeightFormat::fp8)), tokens, {30});
    EXPECT_EQ(fp8_file, fp8_load);
    const double err = max_rel(mxfp4, fp8_file);
    EXPECT_GT(err, 0.0);
    EXPECT_LT(err, 0.05) << "FP8 weights moved the logits by " << err;
    // bf16 from the FP8 folder: the FP8 values rounded to BF16 (close to FP8, not bit-equal).
    EXPECT_LT(max_rel(fp8_file,
                      run(*reference(convert_weights(Weights::load(converted()), WeightFormat::bf16)), tokens, {30})),
              0.02);
}

TEST(fp8_forward, decode_steps_and_chunks_equal_one_prefill) {
    const auto tokens = prompt(45);  // window 16, pages of 8: rings wrap and pages fill
    std::vector<int> steps = {20, 17};
    steps.insert(steps.end(), 8, 1);
    for (KvDtype kv : {KvDtype::f32, KvDtype::fp8_e4m3}) {
        const std::vector<float> one = run(*reference(Weights::load(converted()), kv), tokens, {45});
        EXPECT_EQ(one, run(*reference(Weights::load(converted()), kv), tokens, steps)) << kv_dtype_name(kv);
    }
}

TEST(fp8_forward, tensor_and_expert_parallel_windows_match_one_rank) {
    // TP 2 cuts q/k/v rows and out columns at head boundaries, the experts' d_ff (192) at 96: FP8
    // windows start inside a 128 block. The sums only change order, so the logits agree closely.
    const auto tokens = prompt(24);
    const std::vector<float> one = run(*reference(Weights::load(converted())), tokens, {24});
    for (const ParallelLayout& layout : {ParallelLayout{.tp = 2}, ParallelLayout{.ep = 2}, ParallelLayout{.tp = 4}}) {
        ParallelRunner par(Weights::load(converted()),
                           {.layout = layout, .n_threads = 2, .kv_dtype = KvDtype::fp8_e4m3});
        par.allocate_kv(kv_layout_for(par, 8, 32, 4));
        CpuReference ref1(Weights::load(converted()), {.n_threads = 2, .kv_dtype = KvDtype::fp8_e4m3});
        ref1.allocate_kv(kv_layout_for(ref1, 8, 32, 4));
        EXPECT_LT(max_rel(run(ref1, tokens, {16, 8}), run(par, tokens, {16, 8})), 1e-4)
            << layout.tp << "x" << layout.ep;
    }
    EXPECT_FALSE(one.empty());
}

TEST(fp8_kv, spec_counts_the_scales_and_the_cache_halves_bytes_against_bf16) {
    const Config c = test::partial_blocks_config();
    const KvSpec f8(c, KvDtype::fp8_e4m3, 16), b16(c, KvDtype::bf16, 16);
    EXPECT_EQ(f8.tensor_row_bytes(), size_t(c.kv_dim() + 4 * c.n_kv_heads));
    EXPECT_EQ(b16.tensor_row_bytes(), size_t(2 * c.kv_dim()));
    EXPECT_EQ(KvSpec(c, KvDtype::fp8_e4m3, 16, 2).tensor_row_bytes(), size_t(c.kv_dim() / 2 + 4 * c.n_kv_heads / 2));
    EXPECT_EQ(parse_kv_dtype("fp8"), KvDtype::fp8_e4m3);
    EXPECT_EQ(parse_kv_dtype("auto"), std::nullopt);
    EXPECT_THROW(parse_kv_dtype("int8"), Error);
    EXPECT_THROW(CpuReference(Weights::load(published()), {.kv_dtype = KvDtype::bf16}), Error);
}

TEST(fp8_kv, copied_rows_continue_exactly_and_stay_close_to_f32) {
    const auto tokens = prompt(42, 5);
    auto ref = reference(Weights::load(published()), KvDtype::fp8_e4m3);
    const std::vector<float> want =
        run(*reference(Weights::load(published()), KvDtype::fp8_e4m3), tokens, {37, 1, 1, 1, 1, 1});
    Seq a{.tokens = tokens, .pages = test::pages_from(0, 6), .window_slot = 0};
    test::step(*ref, a, 37);
    Seq b{.tokens = tokens, .pages = {20, 21, 12, 13, 14, 25}, .window_slot = 3, .n_computed = 37};
    ref->copy_kv(plan_kv_copy(
        {.src_pages = test::pages_from(0, 5), .dst_pages = {20, 21, 12, 13, 14}, .src_slot = 0, .dst_slot = 3},
        kv_layout_for(*ref, 8, 32, 4)));
    std::vector<float> got;
    for (int i = 0; i < 5; ++i) got = test::step(*ref, b, 1);
    EXPECT_EQ(got, want);
    const double err = max_rel(run(*reference(Weights::load(published())), tokens, {37, 1, 1, 1, 1, 1}), want);
    EXPECT_GT(err, 0.0);
    EXPECT_LT(err, 0.05) << "the FP8 KV cache moved the logits by " << err;
}

// Bounds (architecture.md, "Comparing implementations on random weights"): the synthetic model is
// well-conditioned on purpose, so FP8's few-percent error per weight must stay a small, smooth
// perturbation end to end. Measured here: resid_mlp errors growing from ~1.5e-3 (layer 0) to
// ~3.5e-3 (layer 3), logits ~3e-3, mean KL <= 5e-11 nats, no routing flip, full top-1 and greedy
// agreement. The bounds leave ~4x on the errors (KL grows with their square: 1e-8), and routing
// flips are counted and bounded on their own (a near-tie may flip) instead of loosening the rest.
TEST(fp8_accuracy, fp8_weights_and_kv_against_the_published_formats) {
    for (const auto& [format, kv] : {std::pair{std::optional<WeightFormat>(WeightFormat::fp8), KvDtype::f32},
                                     std::pair{std::optional<WeightFormat>(), KvDtype::fp8_e4m3},
                                     std::pair{std::optional<WeightFormat>(WeightFormat::fp8), KvDtype::fp8_e4m3}}) {
        CpuReference base(Weights::load(published()), {.n_threads = 2});
        Weights w = Weights::load(published());
        if (format) w = convert_weights(std::move(w), *format);
        CpuReference cand(std::move(w), {.n_threads = 2, .kv_dtype = kv});
        const AccuracyReport r = compare_formats(
            base, cand,
            {.positions = 96, .chunk = 32, .prompt_tokens = 8, .greedy_tokens = 24, .page_size = 8, .seed = 3},
            [&](DumpFn f) { base.set_dump(std::move(f)); }, [&](DumpFn f) { cand.set_dump(std::move(f)); });
        std::printf("weights %s, KV %s:\n%s", format ? weight_format_name(*format) : "as published",
                    std::string(kv_dtype_name(kv)).c_str(), r.table().c_str());
        ASSERT_EQ(r.steps.back().step, "logits");
        EXPECT_GT(r.max_step_error("resid_mlp"), 0.0);
        EXPECT_LT(r.max_step_error("resid_mlp"), 0.015);
        EXPECT_LT(r.max_step_error("logits"), 0.015);
        EXPECT_LT(r.mean_kl, 1e-8);
        EXPECT_GE(r.top1_agreement, 0.99);
        EXPECT_LE(r.routing_flips, r.routing_total / 50);
        EXPECT_GE(r.greedy_common_prefix, 16);
    }
}

}  // namespace
}  // namespace osprey::model
