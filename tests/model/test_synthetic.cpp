// Synthetic checkpoints: the tiny preset in both layouts, determinism, sharding, and the properties
// the initialisation promises (router margins, peaked unembedding with a known greedy successor,
// expert weight scales).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "checkpoint_test_util.h"
#include "core/bf16.h"
#include "core/json.h"
#include "core/mxfp4.h"
#include "io/checkpoint.h"
#include "model/weights.h"

namespace osprey::model {
namespace {

using test::expect_error;
using test::ScratchDir;

float bf16_at(const TensorView& v, int64_t i) { return bf16_to_float(v.as<bf16>()[i]); }

TEST(synthetic, tiny_preset_in_both_layouts_loads_and_validates) {
    ScratchDir hf("synth_tiny_hf"), orig("synth_tiny_orig");
    SyntheticOptions o;
    o.preset = "tiny";
    o.seed = 7;
    o.out = hf.path;
    write_synthetic_checkpoint(o);
    o.layout = Layout::original;
    o.out = orig.path;
    write_synthetic_checkpoint(o);

    for (const auto& dir : {hf.path, orig.path}) {
        const Weights w = Weights::load(dir);
        const Config& c = w.config;
        EXPECT_EQ(c.vocab_size, 201088);
        EXPECT_EQ(c.n_layers, 4);
        EXPECT_EQ(c.d_model, 128);
        EXPECT_EQ(c.n_heads, 8);
        EXPECT_EQ(c.n_kv_heads, 1);
        EXPECT_EQ(c.head_dim, 64);
        EXPECT_EQ(c.n_experts, 8);
        EXPECT_EQ(c.top_k, 4);
        EXPECT_EQ(c.d_ff, 128);
        EXPECT_EQ(c.sliding_window, 128);
        EXPECT_EQ(c.rope_factor, 32.0);
        EXPECT_EQ(c.rope_theta, 150000.0);
        EXPECT_EQ(w.n_tensors(), size_t(w.layout == Layout::hf ? 3 + 19 * 4 : 3 + 15 * 4));
    }
    EXPECT_TRUE(std::filesystem::is_regular_file(hf / "model-00000-of-00000.safetensors"));
    EXPECT_TRUE(std::filesystem::is_regular_file(hf / "generation_config.json"));
    EXPECT_TRUE(std::filesystem::is_regular_file(orig / "original/dtypes.json"));
    // The written config.json is the Hub's, with rope_scaling.
    const json::Value cfg = json::parse(test::read_file(hf / "config.json"));
    EXPECT_EQ(cfg.at("rope_scaling").at("rope_type").as_string(), "yarn");
    EXPECT_EQ(cfg.at("quantization_config").at("quant_method").as_string(), "mxfp4");
}

TEST(synthetic, same_seed_same_bytes_in_any_thread_count) {
    ScratchDir a("synth_det_a"), b("synth_det_b"), c("synth_det_c");
    const auto ra = test::write_small(a.path, Layout::hf, 3, 1);
    test::write_small(b.path, Layout::hf, 3, 3);
    test::write_small(c.path, Layout::hf, 4, 2);
    ASSERT_FALSE(ra.files.empty());
    for (const auto& f : ra.files) {
        const auto name = f.filename().string();
        EXPECT_EQ(test::read_file(a / name), test::read_file(b / name)) << name;
    }
    const std::string shard = "model-00000-of-00000.safetensors";
    EXPECT_NE(test::read_file(a / shard), test::read_file(c / shard)) << "different seeds must differ";
}

TEST(synthetic, shards_are_numbered_from_zero_with_the_last_index_and_indexed) {
    ScratchDir dir("synth_shards");
    const auto r = test::write_small(dir.path, Layout::hf, 1, 0, 120'000);
    std::vector<std::string> shards;
    for (const auto& f : r.files)
        if (f.extension() == ".safetensors") shards.push_back(f.filename().string());
    ASSERT_GE(shards.size(), 3u);
    const size_t last = shards.size() - 1;
    char want[64];
    std::snprintf(want, sizeof want, "model-%05zu-of-%05zu.safetensors", last, last);
    EXPECT_EQ(shards.back(), want);
    EXPECT_EQ(shards.front().substr(0, 12), "model-00000-");
    for (const auto& s : shards) {  // a shard holds several tensors only while they fit the limit
        if (io::SafetensorsFile::open(dir / s)->tensors().size() > 1) {
            EXPECT_LE(std::filesystem::file_size(dir / s), 120'000u + 8192u) << s;
        }
    }

    const json::Value index = json::parse(test::read_file(dir / "model.safetensors.index.json"));
    const Weights w = Weights::load(dir.path);
    EXPECT_EQ(uint64_t(index.at("metadata").at("total_size").as_int()), w.total_bytes());
    EXPECT_EQ(index.at("weight_map").size(), w.n_tensors());
    EXPECT_EQ(w.checkpoint->files().size(), shards.size());

    // Rewriting the folder with fewer shards leaves no stale shard behind.
    test::write_small(dir.path, Layout::hf, 1);
    size_t n_files = 0;
    for (const auto& f : std::filesystem::directory_iterator(dir.path)) n_files += f.path().extension() == ".safetensors";
    EXPECT_EQ(n_files, 1u);
    std::filesystem::remove(dir / "model.safetensors.index.json");  // the *.safetensors glob sees one model too
    EXPECT_EQ(Weights::load(dir.path).checkpoint->files().size(), 1u);
}

TEST(synthetic, router_picks_the_class_experts_with_a_clear_gap_and_uses_every_expert) {
    ScratchDir dir("synth_router");
    const uint64_t seed = 4;
    test::write_small(dir.path, Layout::hf, seed);
    const Weights w = Weights::load(dir.path);
    const Config& c = w.config;
    const SyntheticInit init;
    for (int l = 0; l < c.n_layers; ++l) {
        const LayerWeights& L = w.layers[size_t(l)];
        std::vector<int> used(static_cast<size_t>(c.n_experts));
        std::vector<std::vector<int>> distinct_sets;
        for (int64_t t = 0; t < c.vocab_size; t += 7) {
            // Router logits of the unperturbed state: the normalised embedding row (entries ±1).
            std::vector<std::pair<float, int>> logits;
            for (int e = 0; e < c.n_experts; ++e) {
                double s = bf16_at(L.router_b, e);
                for (int j = 0; j < c.d_model; ++j)
                    s += double(bf16_at(L.router_w, int64_t(e) * c.d_model + j)) *
                         (bf16_at(w.embedding, t * c.d_model + j) / init.embed_scale);
                logits.emplace_back(float(s), e);
            }
            std::sort(logits.rbegin(), logits.rend());
            std::vector<int> top;
            for (int i = 0; i < c.top_k; ++i) top.push_back(logits[size_t(i)].second);
            std::sort(top.begin(), top.end());
            ASSERT_EQ(top, synthetic_expert_set(c, seed, l, t)) << "layer " << l << " token " << t;
            EXPECT_GT(logits[size_t(c.top_k - 1)].first - logits[size_t(c.top_k)].first,
                      init.router_class_logit - 2 * init.router_bias_jitter - 1.0f)
                << "layer " << l << " token " << t;
            for (int e : top) used[size_t(e)]++;
            if (std::find(distinct_sets.begin(), distinct_sets.end(), top) == distinct_sets.end()) distinct_sets.push_back(top);
        }
        for (int e = 0; e < c.n_experts; ++e) EXPECT_GT(used[size_t(e)], 0) << "expert " << e << " never routed to";
        EXPECT_GE(distinct_sets.size(), 2u) << "routing does not depend on the token";
    }
}

TEST(synthetic, routing_spreads_over_all_experts_at_full_size) {
    // 120b: 128 experts, top 4, 32 classes -> every expert is some class's choice in every layer.
    const Config c = preset_config("120b");
    std::vector<int> used(static_cast<size_t>(c.n_experts));
    for (int64_t t = 0; t < 500; ++t)
        for (int e : synthetic_expert_set(c, 1, 5, t)) used[size_t(e)]++;
    for (int e = 0; e < c.n_experts; ++e) EXPECT_GT(used[size_t(e)], 0) << "expert " << e;
}

TEST(synthetic, unembedding_is_peaked_on_the_known_successor) {
    ScratchDir dir("synth_unembed");
    const uint64_t seed = 9;
    test::write_small(dir.path, Layout::hf, seed);
    const Weights w = Weights::load(dir.path);
    const Config& c = w.config;
    const SyntheticInit init;
    std::vector<bool> seen(static_cast<size_t>(c.vocab_size));
    for (int64_t t = 0; t < c.vocab_size; ++t) {
        const int64_t n = synthetic_next_token(c, seed, t);
        ASSERT_TRUE(n >= 0 && n < c.vocab_size);
        EXPECT_FALSE(seen[size_t(n)]) << "synthetic_next_token is not a permutation";
        seen[size_t(n)] = true;
    }
    // Logits of the unperturbed state (the normalised embedding row of t).
    for (int64_t t : {0, 1, 17, 500, 998, 999}) {
        std::vector<float> h(static_cast<size_t>(c.d_model));
        for (int j = 0; j < c.d_model; ++j) h[size_t(j)] = bf16_at(w.embedding, t * c.d_model + j) / init.embed_scale;
        std::vector<float> logits(static_cast<size_t>(c.vocab_size));
        for (int64_t v = 0; v < c.vocab_size; ++v) {
            double s = 0;
            for (int j = 0; j < c.d_model; ++j) s += double(bf16_at(w.unembedding, v * c.d_model + j)) * h[size_t(j)];
            logits[size_t(v)] = float(s);
        }
        const int64_t top = std::max_element(logits.begin(), logits.end()) - logits.begin();
        EXPECT_EQ(top, synthetic_next_token(c, seed, t)) << "token " << t;
        EXPECT_NEAR(logits[size_t(top)], init.top_logit, 0.05 * init.top_logit);
        std::vector<float> sorted = logits;
        std::sort(sorted.rbegin(), sorted.rend());
        EXPECT_GT(sorted[0] - sorted[1], 0.3f * init.top_logit) << "token " << t;
    }
}

TEST(synthetic, weight_scales_follow_the_init_constants) {
    ScratchDir dir("synth_scales");
    test::write_small(dir.path, Layout::hf);
    const Weights w = Weights::load(dir.path);
    const Config& c = w.config;
    const SyntheticInit init;
    auto rms_mxfp4 = [](const TensorView& blocks, const TensorView& scales, int64_t rows, int n_in) {
        double sq = 0;
        std::vector<float> row(static_cast<size_t>(n_in));
        for (int64_t r = 0; r < rows; ++r) {
            mxfp4::decode_row(blocks.as<uint8_t>() + r * (n_in / 2), scales.as<uint8_t>() + r * (n_in / 32), n_in, row.data());
            for (float x : row) sq += double(x) * x;
        }
        return std::sqrt(sq / double(rows * n_in));
    };
    const LayerWeights& L = w.layers[0];
    const double rms1 = rms_mxfp4(L.mlp1_blocks, L.mlp1_scales, c.n_experts * 2 * c.d_ff, c.d_model);
    const double want1 = 1.0 / std::sqrt(c.d_model);
    EXPECT_GT(rms1, want1 / 1.6);
    EXPECT_LT(rms1, want1 * 1.6);
    const double rms2 = rms_mxfp4(L.mlp2_blocks, L.mlp2_scales, c.n_experts * c.d_model, c.d_ff);
    const double want2 = init.mlp_update * init.embed_scale / std::sqrt(c.d_ff);
    EXPECT_GT(rms2, want2 / 1.6);
    EXPECT_LT(rms2, want2 * 1.6);
    for (int64_t i = 0; i < c.d_model; ++i) EXPECT_NEAR(bf16_at(L.attn_norm, i), 1.0f, 0.1f);
    // Scales vary across blocks (the decoder's scale path is exercised).
    const uint8_t* s = L.mlp1_scales.as<uint8_t>();
    EXPECT_NE(*std::min_element(s, s + L.mlp1_scales.numel()), *std::max_element(s, s + L.mlp1_scales.numel()));
}

// Runs `cmd` and returns its stdout; fails the test on a non-zero exit.
std::string run_command(const std::string& cmd) {
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    EXPECT_NE(p, nullptr) << cmd;
    if (p == nullptr) return out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    EXPECT_EQ(pclose(p), 0) << cmd;
    return out;
}

// The official safetensors library (Python, scripts/requirements-test.txt) opens the synthetic
// shards, and its view of every tensor (dtype, shape, U8 bytes) equals ours.
TEST(synthetic, official_safetensors_library_reads_the_same_tensors) {
    const std::string python = OSPREY_PYTHON;
    if (python.empty()) GTEST_SKIP() << "OSPREY_PYTHON not configured (scripts/test.sh sets it)";
    ScratchDir dir("synth_official");
    test::write_small(dir.path, Layout::hf, 2, 0, 200'000);
    const std::string script = std::string(OSPREY_SOURCE_DIR) + "/tests/io/official_safetensors_summary.py";
    const json::Value s = json::parse(run_command("'" + python + "' '" + script + "' '" + dir.path.string() + "'"));
    const Weights w = Weights::load(dir.path);
    ASSERT_EQ(s.at("tensors").size(), w.n_tensors());
    for (const auto& [name, e] : s.at("tensors").as_object()) {
        const TensorView& v = w.checkpoint->at(name);
        EXPECT_EQ(e.at("dtype").as_string(), dtype_name(v.dtype)) << name;
        std::vector<int64_t> shape;
        for (const auto& d : e.at("shape").as_array()) shape.push_back(d.as_int());
        EXPECT_EQ(shape, v.shape) << name;
        EXPECT_EQ(e.at("file").as_string(), w.checkpoint->file_of(name).filename().string()) << name;
        if (v.dtype == DType::u8) {
            uint64_t sum = 0;
            for (int64_t i = 0; i < v.numel(); ++i) sum += v.as<uint8_t>()[i];
            EXPECT_EQ(uint64_t(e.at("u8_sum").as_int()), sum) << name;
        }
    }
    for (const auto& [file, meta] : s.at("metadata").as_object()) EXPECT_EQ(meta.at("format").as_string(), "pt") << file;
    EXPECT_EQ(uint64_t(s.at("index").at("total_size").as_int()), w.total_bytes());
    EXPECT_EQ(s.at("index").at("missing").size(), 0u);
    EXPECT_EQ(s.at("index").at("extra").size(), 0u);
}

TEST(synthetic, full_size_layouts_match_the_published_counts_and_bytes) {
    // spec §2.2 / §6: tensor counts and checkpoint bytes of the published checkpoints.
    auto bytes = [](const std::vector<io::TensorSpec>& specs) {
        uint64_t n = 0;
        for (const auto& s : specs) n += s.nbytes();
        return n;
    };
    const auto hf20 = checkpoint_tensor_specs(preset_config("20b"), Layout::hf);
    const auto or20 = checkpoint_tensor_specs(preset_config("20b"), Layout::original);
    const auto hf120 = checkpoint_tensor_specs(preset_config("120b"), Layout::hf);
    const auto or120 = checkpoint_tensor_specs(preset_config("120b"), Layout::original);
    EXPECT_EQ(hf20.size(), 459u);
    EXPECT_EQ(or20.size(), 363u);
    EXPECT_EQ(hf120.size(), 687u);
    EXPECT_EQ(or120.size(), 543u);
    EXPECT_EQ(bytes(hf20), 13'761'264'768ull);
    EXPECT_EQ(bytes(or20), 13'761'264'768ull);
    EXPECT_EQ(bytes(hf120), 65'248'815'744ull);
    EXPECT_EQ(bytes(or120), 65'248'815'744ull);
}

TEST(synthetic, presets_and_errors) {
    EXPECT_EQ(preset_config("20b").n_layers, 24);
    EXPECT_EQ(preset_config("120b").n_experts, 128);
    EXPECT_EQ(preset_names(), (std::vector<std::string>{"tiny", "tiny-tp", "20b", "120b"}));
    expect_error([] { preset_config("7b"); }, {"unknown preset '7b'", "tiny, tiny-tp, 20b, 120b"});
    SyntheticOptions o;
    o.out = "";
    expect_error([&] { write_synthetic_checkpoint(test::small_config(), o); }, {"no output folder"});
    ScratchDir dir("synth_tok");
    o.out = dir.path;
    o.tokenizer_file = dir / "missing.tiktoken";
    expect_error([&] { write_synthetic_checkpoint(test::small_config(), o); }, {"missing.tiktoken: tokenizer file not found"});
}

TEST(synthetic, tokenizer_file_is_copied) {
    ScratchDir src("synth_tok_src"), dst("synth_tok_dst");
    test::write_file(src / "ranks.tiktoken", "IQ== 0\nIg== 1\n");
    SyntheticOptions o;
    o.out = dst.path;
    o.tokenizer_file = src / "ranks.tiktoken";
    write_synthetic_checkpoint(test::small_config(), o);
    EXPECT_EQ(test::read_file(dst / "o200k_base.tiktoken"), "IQ== 0\nIg== 1\n");
}

}  // namespace
}  // namespace osprey::model
