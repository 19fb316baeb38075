// Weights: both layouts load into the same views; every kind of mismatch gives one clear error.
#include <algorithm>

#include "checkpoint_test_util.h"
#include "io/checkpoint.h"
#include "model/weights.h"

namespace osprey::model {
namespace {

using test::expect_error;
using test::ScratchDir;

const char* kShard = "model-00000-of-00000.safetensors";

// A small HF checkpoint whose index is removed, so that shard edits are seen by the weights validator
// (with the index present, the index/shard consistency check would fire first).
struct EditableHf {
    ScratchDir dir{"weights_edit"};
    EditableHf() {
        test::write_small(dir.path, Layout::hf);
        std::filesystem::remove(dir / "model.safetensors.index.json");
    }
    void edit(const std::function<void(std::vector<io::TensorSpec>&)>& fn) { test::rewrite(dir / kShard, fn); }
};

TEST(weights, loads_hf_layout_with_expected_shapes) {
    ScratchDir dir("weights_hf");
    test::write_small(dir.path, Layout::hf);
    const Weights w = Weights::load(dir.path);
    const Config c = test::small_config();
    EXPECT_EQ(w.layout, Layout::hf);
    EXPECT_EQ(w.config.n_layers, c.n_layers);
    ASSERT_EQ(w.layers.size(), 2u);
    const LayerWeights& L = w.layers[1];
    EXPECT_EQ(L.q_w.shape, (std::vector<int64_t>{256, 128}));
    EXPECT_EQ(L.k_w.shape, (std::vector<int64_t>{128, 128}));
    EXPECT_EQ(L.out_w.shape, (std::vector<int64_t>{128, 256}));
    EXPECT_EQ(L.mlp1_blocks.shape, (std::vector<int64_t>{4, 128, 4, 16}));
    EXPECT_EQ(L.mlp2_scales.shape, (std::vector<int64_t>{4, 128, 2}));
    EXPECT_EQ(L.mlp1_blocks.dtype, DType::u8);
    EXPECT_EQ(w.embedding.shape, (std::vector<int64_t>{1000, 128}));
    EXPECT_EQ(w.n_tensors(), size_t(3 + 19 * c.n_layers));
    size_t views = 0, bytes = 0;
    w.for_each([&](const TensorView& v) {
        ++views;
        bytes += v.nbytes();
        EXPECT_NE(v.data, nullptr) << v.name;
    });
    EXPECT_EQ(views, size_t(3 + 19 * c.n_layers));
    EXPECT_EQ(bytes, w.total_bytes());
}

TEST(weights, original_layout_is_the_same_model_with_qkv_split_into_views) {
    ScratchDir hf("weights_same_hf"), orig("weights_same_orig");
    test::write_small(hf.path, Layout::hf, 5);
    test::write_small(orig.path, Layout::original, 5);
    const Weights a = Weights::load(hf.path);
    const Weights b = Weights::load(orig.path);
    EXPECT_EQ(b.layout, Layout::original);
    EXPECT_EQ(b.dir, orig / "original");
    EXPECT_EQ(b.n_tensors(), size_t(3 + 15 * 2));
    std::vector<TensorView> va, vb;
    a.for_each([&](const TensorView& v) { va.push_back(v); });
    b.for_each([&](const TensorView& v) { vb.push_back(v); });
    ASSERT_EQ(va.size(), vb.size());
    for (size_t i = 0; i < va.size(); ++i) {
        ASSERT_EQ(va[i].shape, vb[i].shape) << va[i].name << " vs " << vb[i].name;
        ASSERT_EQ(va[i].dtype, vb[i].dtype) << va[i].name;
        EXPECT_EQ(std::memcmp(va[i].data, vb[i].data, va[i].nbytes()), 0) << va[i].name << " differs from " << vb[i].name;
    }
    // The q/k/v views point into the fused tensor, no copy.
    const TensorView* qkv = b.checkpoint->find("block.1.attn.qkv.weight");
    ASSERT_NE(qkv, nullptr);
    EXPECT_EQ(b.layers[1].q_w.data, qkv->data);
    EXPECT_EQ(static_cast<const uint8_t*>(b.layers[1].v_w.data),
              static_cast<const uint8_t*>(qkv->data) + (256 + 128) * 128 * 2);
}

TEST(weights, missing_tensor_is_named) {
    EditableHf h;
    h.edit([](auto& specs) {
        specs.erase(std::remove_if(specs.begin(), specs.end(),
                                   [](const io::TensorSpec& s) { return s.name == "model.layers.1.self_attn.sinks"; }),
                    specs.end());
    });
    expect_error([&] { Weights::load(h.dir.path); }, {"1 missing tensor: model.layers.1.self_attn.sinks"});
}

TEST(weights, wrong_shape_is_reported_with_expected_and_actual) {
    EditableHf h;
    h.edit([](auto& specs) { test::spec(specs, "model.layers.1.mlp.experts.gate_up_proj_bias")->shape = {2, 128}; });
    expect_error([&] { Weights::load(h.dir.path); },
                 {"model.layers.1.mlp.experts.gate_up_proj_bias: expected BF16 [4, 128], got BF16 [2, 128]", kShard});
}

TEST(weights, wrong_dtype_is_reported) {
    EditableHf h;
    h.edit([](auto& specs) { test::spec(specs, "model.layers.0.mlp.router.bias")->dtype = DType::f32; });
    expect_error([&] { Weights::load(h.dir.path); }, {"model.layers.0.mlp.router.bias: expected BF16 [4], got F32 [4]"});
}

TEST(weights, f32_norm_gains_are_accepted) {
    EditableHf h;
    h.edit([](auto& specs) { test::spec(specs, "model.norm.weight")->dtype = DType::f32; });
    const Weights w = Weights::load(h.dir.path);
    EXPECT_EQ(w.final_norm.dtype, DType::f32);
    h.edit([](auto& specs) { test::spec(specs, "model.norm.weight")->dtype = DType::f16; });
    expect_error([&] { Weights::load(h.dir.path); }, {"model.norm.weight: expected BF16 or F32 [128], got F16 [128]"});
}

TEST(weights, unexpected_extra_tensor_is_reported) {
    EditableHf h;
    h.edit([](auto& specs) { specs.push_back({"model.layers.2.self_attn.sinks", DType::bf16, {4}}); });
    expect_error([&] { Weights::load(h.dir.path); }, {"1 unexpected tensor", "model.layers.2.self_attn.sinks"});
}

TEST(weights, config_with_more_layers_than_the_files) {
    ScratchDir dir("weights_layers");
    test::write_small(dir.path, Layout::hf);
    Config c = test::small_config();
    c.n_layers = 3;
    expect_error([&] { Weights::from_checkpoint(c, Layout::hf, io::Checkpoint::open_dir(dir.path)); },
                 {"19 missing tensors: model.layers.2.input_layernorm.weight", "and 11 more"});
}

TEST(weights, original_layout_missing_fused_qkv) {
    ScratchDir dir("weights_orig_missing");
    test::write_small(dir.path, Layout::original);
    std::filesystem::remove(dir / "original/dtypes.json");
    test::rewrite(dir / "original/model.safetensors", [](auto& specs) {
        specs.erase(std::remove_if(specs.begin(), specs.end(),
                                   [](const io::TensorSpec& s) { return s.name == "block.0.attn.qkv.weight"; }),
                    specs.end());
    });
    expect_error([&] { Weights::load(dir.path); }, {"1 missing tensor: block.0.attn.qkv.weight"});
}

TEST(weights, dtypes_json_must_match_the_files) {
    ScratchDir dir("weights_dtypes");
    test::write_small(dir.path, Layout::original);
    std::string d = test::read_file(dir / "original/dtypes.json");
    const std::string from = "\"norm.scale\": \"BF16\"";
    ASSERT_NE(d.find(from), std::string::npos) << d.substr(0, 200);
    d.replace(d.find(from), from.size(), "\"norm.scale\": \"FP4\"");
    test::write_file(dir / "original/dtypes.json", d);
    expect_error([&] { Weights::load(dir.path); }, {"dtypes.json", "'norm.scale' is FP4 but stored as BF16"});
}

TEST(weights, layout_detection) {
    ScratchDir hf("weights_detect_hf"), orig("weights_detect_orig"), empty("weights_detect_empty");
    test::write_small(hf.path, Layout::hf);
    test::write_small(orig.path, Layout::original);
    EXPECT_EQ(detect_layout(hf.path), Layout::hf);
    EXPECT_EQ(detect_layout(orig.path), Layout::original);
    EXPECT_EQ(detect_layout(orig / "original"), Layout::original);
    EXPECT_EQ(Weights::load(orig / "original").layout, Layout::original);
    expect_error([&] { detect_layout(empty.path); }, {"no checkpoint found"});
    expect_error([&] { Weights::load(hf.path, Layout::original); },
                 {"Hugging Face spelling but the original layout was requested"});
    expect_error([&] { Weights::load(empty / "nope"); }, {"not a directory"});
}

TEST(weights, mapped_files_live_as_long_as_any_copy) {
    ScratchDir dir("weights_alive");
    test::write_small(dir.path, Layout::hf);
    std::vector<uint8_t> before;
    Weights copy;
    {
        const Weights w = Weights::load(dir.path);
        const auto* p = static_cast<const uint8_t*>(w.layers[1].mlp2_bias.data);
        before.assign(p, p + w.layers[1].mlp2_bias.nbytes());
        copy = w;
    }
    std::filesystem::remove_all(dir.path);  // the mapping outlives the directory entry
    const auto* p = static_cast<const uint8_t*>(copy.layers[1].mlp2_bias.data);
    EXPECT_TRUE(std::equal(before.begin(), before.end(), p));
}

}  // namespace
}  // namespace osprey::model
