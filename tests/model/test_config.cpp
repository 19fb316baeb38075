// Config: both Hub spellings (rope_scaling / rope_parameters), the original keys, validation errors,
// and round trips against shared/conformance/model/configs.json.
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "core/check.h"
#include "core/json.h"
#include "model/config.h"

namespace osprey::model {
namespace {

json::Value conformance() {
    std::ifstream f(std::string(OSPREY_SHARED_DIR) + "/conformance/model/configs.json");
    EXPECT_TRUE(f.good()) << "shared/conformance/model/configs.json not found under " << OSPREY_SHARED_DIR;
    std::stringstream ss;
    ss << f.rdbuf();
    return json::parse(ss.str());
}

json::Value hf(const char* model) { return conformance().at("hf_config_json").at(model); }
json::Value original(const char* model) { return conformance().at("original_config_json").at(model); }

std::string error_of(const json::Value& j) {
    try {
        Config::from_json(j);
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

// Removes `key` from an object.
json::Value without(json::Value j, const std::string& key) {
    auto& o = j.as_object();
    o.erase(std::remove_if(o.begin(), o.end(), [&](const auto& kv) { return kv.first == key; }), o.end());
    return j;
}

void expect_gpt_oss(const Config& c, int layers, int experts) {
    EXPECT_EQ(c.n_layers, layers);
    EXPECT_EQ(c.n_experts, experts);
    EXPECT_EQ(c.d_model, 2880);
    EXPECT_EQ(c.n_heads, 64);
    EXPECT_EQ(c.n_kv_heads, 8);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.top_k, 4);
    EXPECT_EQ(c.d_ff, 2880);
    EXPECT_EQ(c.vocab_size, 201088);
    EXPECT_EQ(c.sliding_window, 128);
    EXPECT_EQ(c.max_position, 131072);
    EXPECT_EQ(c.norm_eps, 1e-5f);
    EXPECT_EQ(c.swiglu_limit, 7.0f);
    EXPECT_EQ(c.swiglu_alpha, 1.702f);
    EXPECT_EQ(c.rope_theta, 150000.0);
    EXPECT_EQ(c.rope_factor, 32.0);
    EXPECT_EQ(c.rope_original_context, 4096);
    EXPECT_EQ(c.rope_beta_fast, 32.0);
    EXPECT_EQ(c.rope_beta_slow, 1.0);
    EXPECT_FALSE(c.rope_truncate);
    EXPECT_EQ(c.eos_token_id, 200002);
    EXPECT_EQ(c.pad_token_id, 199999);
    EXPECT_EQ(c.q_dim(), 4096);
    EXPECT_EQ(c.kv_dim(), 512);
    EXPECT_EQ(c.group(), 8);
}

TEST(config, hub_config_json_with_rope_scaling) {
    expect_gpt_oss(Config::from_json(hf("gpt-oss-20b")), 24, 32);
    expect_gpt_oss(Config::from_json(hf("gpt-oss-120b")), 36, 128);
}

TEST(config, original_config_json) {
    expect_gpt_oss(Config::from_json(original("gpt-oss-20b")), 24, 32);
    expect_gpt_oss(Config::from_json(original("gpt-oss-120b")), 36, 128);
}

TEST(config, transformers_v5_rope_parameters_with_theta_inside) {
    json::Value j = without(without(hf("gpt-oss-20b"), "rope_scaling"), "rope_theta");
    json::Value rp = hf("gpt-oss-20b").at("rope_scaling");
    rp.set("rope_theta", 150000.0);
    j.set("rope_parameters", rp);
    expect_gpt_oss(Config::from_json(j), 24, 32);
}

TEST(config, rope_scaling_and_rope_parameters_must_agree) {
    json::Value j = hf("gpt-oss-20b");
    json::Value rp = j.at("rope_scaling");
    rp.set("factor", 16.0);
    rp.set("rope_theta", 150000.0);
    j.set("rope_parameters", rp);
    EXPECT_NE(error_of(j).find("'rope_scaling' and 'rope_parameters' disagree"), std::string::npos) << error_of(j);
}

TEST(config, missing_rope_block_is_an_error_not_plain_rope) {
    const std::string e = error_of(without(hf("gpt-oss-20b"), "rope_scaling"));
    EXPECT_NE(e.find("no YaRN RoPE parameters"), std::string::npos) << e;
    json::Value j = hf("gpt-oss-20b");
    json::Value rs = j.at("rope_scaling");
    rs.set("rope_type", "linear");
    j.set("rope_scaling", rs);
    EXPECT_NE(error_of(j).find("rope_scaling.rope_type must be \"yarn\""), std::string::npos) << error_of(j);
}

TEST(config, truncate_true_is_read) {
    json::Value j = hf("gpt-oss-20b");
    json::Value rs = j.at("rope_scaling");
    rs.set("truncate", true);
    j.set("rope_scaling", rs);
    EXPECT_TRUE(Config::from_json(j).rope_truncate);
    rs.set("truncate", "no");
    j.set("rope_scaling", rs);
    EXPECT_NE(error_of(j).find("truncate must be true or false"), std::string::npos) << error_of(j);
}

TEST(config, errors_name_the_field) {
    json::Value j = hf("gpt-oss-20b");
    j.set("num_hidden_layers", "24");
    EXPECT_NE(error_of(j).find("'num_hidden_layers' must be an integer, got \"24\""), std::string::npos) << error_of(j);
    EXPECT_NE(error_of(without(hf("gpt-oss-20b"), "hidden_size")).find("missing 'hidden_size'"), std::string::npos);
    const std::string e = error_of(without(without(hf("gpt-oss-20b"), "num_local_experts"), "num_experts"));
    EXPECT_NE(e.find("missing 'num_local_experts' or 'num_experts'"), std::string::npos) << e;
    j = hf("gpt-oss-20b");
    j.set("num_key_value_heads", 7);
    EXPECT_NE(error_of(j).find("must be a multiple of num_key_value_heads (7)"), std::string::npos) << error_of(j);
    j = hf("gpt-oss-20b");
    j.set("num_experts_per_tok", 64);
    EXPECT_NE(error_of(j).find("num_experts_per_tok (64) exceeds num_local_experts (32)"), std::string::npos);
    j = hf("gpt-oss-20b");
    j.set("hidden_size", 2880 + 16);
    EXPECT_NE(error_of(j).find("multiple of 32"), std::string::npos) << error_of(j);
    j = hf("gpt-oss-20b");
    j.set("model_type", "llama");
    EXPECT_NE(error_of(j).find("model_type must be \"gpt_oss\""), std::string::npos);
    j = hf("gpt-oss-20b");
    j.set("quantization_config", json::Value(json::Object{{"quant_method", "awq"}}));
    EXPECT_NE(error_of(j).find("quant_method must be \"mxfp4\" or \"fp8\""), std::string::npos);
    // fp8 (osprey convert, docs/fp8.md) must say its 128 x 128 blocks.
    j.set("quantization_config", json::Value(json::Object{{"quant_method", "fp8"}}));
    EXPECT_NE(error_of(j).find("weight_block_size must be [128, 128]"), std::string::npos);
    j.set("quantization_config",
          json::Value(json::Object{{"quant_method", "fp8"},
                                   {"weight_block_size", json::Array{json::Value(128), json::Value(64)}}}));
    EXPECT_NE(error_of(j).find("weight_block_size must be [128, 128]"), std::string::npos);
    EXPECT_NE(error_of(json::Value(json::Array{})).find("must be a JSON object"), std::string::npos);
}

TEST(config, layer_types_must_alternate_sliding_and_full) {
    json::Value j = hf("gpt-oss-20b");
    json::Value lt = j.at("layer_types");
    lt.as_array()[3] = "sliding_attention";
    j.set("layer_types", lt);
    EXPECT_NE(error_of(j).find("layer_types[3] must be \"full_attention\""), std::string::npos) << error_of(j);
    lt.as_array().pop_back();
    j.set("layer_types", lt);
    EXPECT_NE(error_of(j).find("layer_types must list 24 layers"), std::string::npos) << error_of(j);
}

TEST(config, yarn_range_is_validated) {
    json::Value j = hf("gpt-oss-20b");
    json::Value rs = j.at("rope_scaling");
    rs.set("beta_fast", 0.5);
    j.set("rope_scaling", rs);
    EXPECT_NE(error_of(j).find("beta_fast > beta_slow"), std::string::npos) << error_of(j);
}

TEST(config, to_hf_json_reproduces_the_hub_files) {
    for (const char* m : {"gpt-oss-20b", "gpt-oss-120b"}) {
        const json::Value want = hf(m);
        const json::Value got = Config::from_json(want).to_hf_json();
        EXPECT_EQ(got, want) << m << "\n got: " << got.dump() << "\nwant: " << want.dump();
        EXPECT_EQ(got.dump(), want.dump()) << "key order differs";
    }
}

TEST(config, to_original_json_reproduces_the_original_files) {
    for (const char* m : {"gpt-oss-20b", "gpt-oss-120b"}) {
        const json::Value want = original(m);
        const json::Value got = Config::from_json(hf(m)).to_original_json();
        EXPECT_EQ(got, want) << m << "\n got: " << got.dump() << "\nwant: " << want.dump();
    }
}

TEST(config, generation_config_matches_the_hub) {
    const json::Value want = conformance().at("generation_config_json");
    const json::Value got = Config::from_json(hf("gpt-oss-20b")).to_generation_config_json();
    for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id", "do_sample"}) EXPECT_EQ(got.at(k), want.at(k)) << k;
}

TEST(config, load_names_the_file) {
    try {
        Config::load("/nonexistent/config.json");
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("/nonexistent/config.json: cannot open"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace osprey::model
