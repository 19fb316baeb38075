#include "model/config.h"

#include <charconv>
#include <cmath>
#include <numbers>
#include <optional>

#include "core/check.h"
#include "core/file.h"
#include "model/kv_spec.h"

namespace osprey::model {

namespace {

using json::Value;

// Reads the first present key of `keys` from `obj` (aliases: HF name first, then original name).
const Value* find_any(const Value& obj, std::initializer_list<std::string_view> keys, std::string* found = nullptr) {
    for (std::string_view k : keys) {
        if (const Value* v = obj.find(k); v != nullptr && !v->is_null()) {
            if (found) *found = std::string(k);
            return v;
        }
    }
    return nullptr;
}

std::string key_list(std::initializer_list<std::string_view> keys) {
    std::string s;
    for (std::string_view k : keys) s += (s.empty() ? "'" : " or '") + std::string(k) + "'";
    return s;
}

int get_int(const Value& obj, std::initializer_list<std::string_view> keys, std::optional<int> fallback,
            const char* where = "config") {
    std::string key;
    const Value* v = find_any(obj, keys, &key);
    if (v == nullptr) {
        OSPREY_CHECK(fallback.has_value(), where, ": missing ", key_list(keys));
        return *fallback;
    }
    // Some writers emit integral floats (e.g. 4096.0); accept them when exact.
    OSPREY_CHECK(v->is_number(), where, ": '", key, "' must be an integer, got ", v->dump());
    const double d = v->as_double();
    OSPREY_CHECK(d == std::floor(d) && std::fabs(d) <= 2147483647.0, where, ": '", key,
                 "' must be an integer, got ", v->dump());
    return int(d);
}

double get_double(const Value& obj, std::initializer_list<std::string_view> keys, std::optional<double> fallback,
                  const char* where = "config") {
    std::string key;
    const Value* v = find_any(obj, keys, &key);
    if (v == nullptr) {
        OSPREY_CHECK(fallback.has_value(), where, ": missing ", key_list(keys));
        return *fallback;
    }
    OSPREY_CHECK(v->is_number(), where, ": '", key, "' must be a number, got ", v->dump());
    return v->as_double();
}

// A float written the shortest way that reads back as the same float (1e-5f -> 1e-05, not 9.99e-06).
Value float_value(float f) {
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, f);
    double d = 0;
    std::from_chars(buf, r.ptr, d);
    return Value(d);
}

// YaRN correction range bound (spec §3.4): (D/2) ln(L0 / (beta 2pi)) / ln(theta).
double yarn_dim(int head_dim, int original_context, double beta, double theta) {
    return (head_dim / 2.0) * std::log(original_context / (beta * 2.0 * std::numbers::pi)) / std::log(theta);
}

}  // namespace

Config Config::from_json(const Value& j) {
    OSPREY_CHECK(j.is_object(), "config: must be a JSON object, got ", json::type_name(j.type()));
    if (const Value* mt = j.find("model_type"); mt != nullptr) {
        OSPREY_CHECK(mt->is_string() && mt->as_string() == "gpt_oss", "config: model_type must be \"gpt_oss\", got ",
                     mt->dump());
    }
    if (const Value* q = j.find("quantization_config"); q != nullptr && !q->is_null()) {
        const Value* m = q->find("quant_method");
        OSPREY_CHECK(m != nullptr && m->is_string() && (m->as_string() == "mxfp4" || m->as_string() == "fp8"),
                     "config: quantization_config.quant_method must be \"mxfp4\" or \"fp8\" (got ",
                     m ? m->dump() : std::string("nothing"),
                     "); only MXFP4 expert checkpoints and their `osprey convert --to fp8` form are supported");
        if (m->as_string() == "fp8") {
            // 128 x 128 block scales (docs/fp8.md); the tensors themselves are checked by the loader.
            const Value* b = q->find("weight_block_size");
            OSPREY_CHECK(b != nullptr && *b == Value(json::Array{Value(128), Value(128)}),
                         "config: quantization_config.weight_block_size must be [128, 128] for fp8, got ",
                         b ? b->dump() : std::string("nothing"));
            const Value* fmt = q->find("fmt");
            OSPREY_CHECK(fmt == nullptr || (fmt->is_string() && fmt->as_string() == "e4m3"),
                         "config: quantization_config.fmt must be \"e4m3\" for fp8, got ", fmt->dump());
        }
    }

    Config c;
    c.n_layers = get_int(j, {"num_hidden_layers"}, std::nullopt);
    c.d_model = get_int(j, {"hidden_size"}, std::nullopt);
    c.n_heads = get_int(j, {"num_attention_heads"}, std::nullopt);
    c.n_kv_heads = get_int(j, {"num_key_value_heads"}, std::nullopt);
    c.head_dim = get_int(j, {"head_dim"}, std::nullopt);
    c.n_experts = get_int(j, {"num_local_experts", "num_experts"}, std::nullopt);
    c.top_k = get_int(j, {"num_experts_per_tok", "experts_per_token"}, std::nullopt);
    c.d_ff = get_int(j, {"intermediate_size"}, std::nullopt);
    c.vocab_size = get_int(j, {"vocab_size"}, std::nullopt);
    c.sliding_window = get_int(j, {"sliding_window"}, std::nullopt);
    c.norm_eps = float(get_double(j, {"rms_norm_eps"}, 1e-5));
    c.swiglu_alpha = float(get_double(j, {"swiglu_alpha"}, 1.702));
    c.swiglu_limit = float(get_double(j, {"swiglu_limit"}, 7.0));
    // The HF spellings carry both ids; an array eos (generation-config style) uses its first entry.
    if (const Value* eos = j.find("eos_token_id"); eos != nullptr && eos->is_array() && eos->size() > 0) {
        OSPREY_CHECK(eos->as_array()[0].is_integer(), "config: eos_token_id entries must be integers");
        c.eos_token_id = int(eos->as_array()[0].as_int());
    } else {
        c.eos_token_id = get_int(j, {"eos_token_id"}, c.eos_token_id);
    }
    c.pad_token_id = get_int(j, {"pad_token_id"}, c.pad_token_id);

    // RoPE / YaRN: transformers v5 `rope_parameters` (theta inside), Hub `rope_scaling` (theta at top
    // level), or the original keys. Reading only one spelling silently gives plain RoPE (spec §2.1).
    const Value* params = j.find("rope_parameters");
    const Value* scaling = j.find("rope_scaling");
    if (params != nullptr && params->is_null()) params = nullptr;
    if (scaling != nullptr && scaling->is_null()) scaling = nullptr;
    const bool original = j.contains("rope_scaling_factor") || j.contains("rope_ntk_beta");
    OSPREY_CHECK(params != nullptr || scaling != nullptr || original,
                 "config: no YaRN RoPE parameters (expected 'rope_scaling', 'rope_parameters' or the original "
                 "'rope_scaling_factor'); gpt-oss requires YaRN");
    auto read_block = [&](const Value& b, const char* where, bool theta_inside) {
        OSPREY_CHECK(b.is_object(), "config: '", where, "' must be an object, got ", b.dump());
        const Value* type = find_any(b, {"rope_type", "type"});
        OSPREY_CHECK(type != nullptr && type->is_string() && type->as_string() == "yarn", "config: ", where,
                     ".rope_type must be \"yarn\", got ", type ? type->dump() : std::string("nothing"));
        Config r = c;
        r.rope_theta = theta_inside ? get_double(b, {"rope_theta"}, j.contains("rope_theta")
                                                                        ? std::optional(get_double(j, {"rope_theta"}, {}))
                                                                        : std::nullopt, where)
                                    : get_double(j, {"rope_theta"}, std::nullopt);
        r.rope_factor = get_double(b, {"factor"}, std::nullopt, where);
        r.rope_original_context = get_int(b, {"original_max_position_embeddings"},
                                          find_any(j, {"initial_context_length"})
                                              ? std::optional(get_int(j, {"initial_context_length"}, {}))
                                              : std::nullopt,
                                          where);
        r.rope_beta_fast = get_double(b, {"beta_fast"}, 32.0, where);
        r.rope_beta_slow = get_double(b, {"beta_slow"}, 1.0, where);
        // transformers defaults a missing `truncate` to true, but gpt-oss's reference never truncates
        // and the Hub files say false explicitly; a missing key follows the reference.
        r.rope_truncate = false;
        if (const Value* t = b.find("truncate"); t != nullptr && !t->is_null()) {
            OSPREY_CHECK(t->is_bool(), "config: ", where, ".truncate must be true or false, got ", t->dump());
            r.rope_truncate = t->as_bool();
        }
        return r;
    };
    if (params != nullptr) {
        const Config p = read_block(*params, "rope_parameters", true);
        if (scaling != nullptr) {
            const Config s = read_block(*scaling, "rope_scaling", false);
            OSPREY_CHECK(s.rope_factor == p.rope_factor && s.rope_beta_fast == p.rope_beta_fast &&
                             s.rope_beta_slow == p.rope_beta_slow && s.rope_original_context == p.rope_original_context &&
                             s.rope_truncate == p.rope_truncate,
                         "config: 'rope_scaling' and 'rope_parameters' disagree");
        }
        c = p;
    } else if (scaling != nullptr) {
        c = read_block(*scaling, "rope_scaling", false);
    } else {
        c.rope_theta = get_double(j, {"rope_theta"}, std::nullopt);
        c.rope_factor = get_double(j, {"rope_scaling_factor"}, std::nullopt);
        c.rope_original_context = get_int(j, {"initial_context_length"}, std::nullopt);
        c.rope_beta_fast = get_double(j, {"rope_ntk_beta"}, 32.0);
        c.rope_beta_slow = get_double(j, {"rope_ntk_alpha"}, 1.0);
        c.rope_truncate = false;
    }
    c.max_position = get_int(j, {"max_position_embeddings"},
                             int(std::lround(c.rope_original_context * c.rope_factor)));

    // The KV spec hard-wires "even layers slide" (is_sliding_layer); a config that says otherwise is not gpt-oss.
    if (const Value* lt = j.find("layer_types"); lt != nullptr && !lt->is_null()) {
        OSPREY_CHECK(lt->is_array() && int(lt->size()) == c.n_layers, "config: layer_types must list ", c.n_layers,
                     " layers, got ", lt->is_array() ? std::to_string(lt->size()) + " entries" : lt->dump());
        for (int i = 0; i < c.n_layers; ++i) {
            const Value& t = lt->as_array()[size_t(i)];
            const char* want = is_sliding_layer(i) ? "sliding_attention" : "full_attention";
            OSPREY_CHECK(t.is_string() && t.as_string() == want, "config: layer_types[", i, "] must be \"", want,
                         "\" (even layers slide, odd layers are full), got ", t.dump());
        }
    }
    c.validate();
    return c;
}

Config Config::load(const std::filesystem::path& config_file) {
    const std::string text = read_file(config_file);
    try {
        return from_json(json::parse(text));
    } catch (const Error& e) {
        OSPREY_FAIL(config_file.string(), ": ", e.what());
    }
}

void Config::validate() const {
    auto positive = [](const char* name, double v) { OSPREY_CHECK(v > 0, "config: ", name, " must be > 0, got ", v); };
    positive("num_hidden_layers", n_layers);
    positive("hidden_size", d_model);
    positive("num_attention_heads", n_heads);
    positive("num_key_value_heads", n_kv_heads);
    positive("head_dim", head_dim);
    positive("num_local_experts", n_experts);
    positive("num_experts_per_tok", top_k);
    positive("intermediate_size", d_ff);
    positive("vocab_size", vocab_size);
    positive("sliding_window", sliding_window);
    positive("max_position_embeddings", max_position);
    positive("rms_norm_eps", norm_eps);
    positive("swiglu_alpha", swiglu_alpha);
    positive("swiglu_limit", swiglu_limit);
    positive("rope_theta", rope_theta);
    positive("initial_context_length", rope_original_context);
    OSPREY_CHECK(n_heads % n_kv_heads == 0, "config: num_attention_heads (", n_heads,
                 ") must be a multiple of num_key_value_heads (", n_kv_heads, ")");
    OSPREY_CHECK(top_k <= n_experts, "config: num_experts_per_tok (", top_k, ") exceeds num_local_experts (",
                 n_experts, ")");
    OSPREY_CHECK(head_dim % 2 == 0, "config: head_dim must be even for RoPE, got ", head_dim);
    OSPREY_CHECK(d_model % 32 == 0, "config: hidden_size must be a multiple of 32 (MXFP4 blocks), got ", d_model);
    OSPREY_CHECK(d_ff % 32 == 0, "config: intermediate_size must be a multiple of 32 (MXFP4 blocks), got ", d_ff);
    OSPREY_CHECK(rope_factor >= 1.0, "config: YaRN factor must be >= 1, got ", rope_factor);
    OSPREY_CHECK(rope_beta_fast > rope_beta_slow && rope_beta_slow > 0, "config: YaRN needs beta_fast > beta_slow > 0, got ",
                 rope_beta_fast, " and ", rope_beta_slow);
    const double low = yarn_dim(head_dim, rope_original_context, rope_beta_fast, rope_theta);
    const double high = yarn_dim(head_dim, rope_original_context, rope_beta_slow, rope_theta);
    OSPREY_CHECK(0 < low && low < high && high < head_dim / 2.0 - 1, "config: YaRN correction range [", low, ", ",
                 high, "] must satisfy 0 < low < high < head_dim/2 - 1 (check rope_theta, beta_fast/slow, context)");
    OSPREY_CHECK(eos_token_id >= 0 && eos_token_id < vocab_size, "config: eos_token_id ", eos_token_id,
                 " outside the vocabulary [0, ", vocab_size, ")");
    OSPREY_CHECK(pad_token_id >= 0 && pad_token_id < vocab_size, "config: pad_token_id ", pad_token_id,
                 " outside the vocabulary [0, ", vocab_size, ")");
}

Value Config::to_hf_json() const {
    Value layer_types{json::Array{}};
    for (int i = 0; i < n_layers; ++i)
        layer_types.push_back(is_sliding_layer(i) ? "sliding_attention" : "full_attention");
    Value rope{json::Object{}};
    rope.set("beta_fast", rope_beta_fast);
    rope.set("beta_slow", rope_beta_slow);
    rope.set("factor", rope_factor);
    rope.set("original_max_position_embeddings", rope_original_context);
    rope.set("rope_type", "yarn");
    rope.set("truncate", rope_truncate);
    Value quant{json::Object{}};
    quant.set("modules_to_not_convert", json::Array{"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                    "model.embed_tokens", "lm_head"});
    quant.set("quant_method", "mxfp4");

    // Key order and extra keys as in the Hub's config.json (shared/conformance/model/configs.json).
    Value j{json::Object{}};
    j.set("architectures", json::Array{"GptOssForCausalLM"});
    j.set("attention_bias", true);
    j.set("attention_dropout", 0.0);
    j.set("eos_token_id", eos_token_id);
    j.set("experts_per_token", top_k);
    j.set("head_dim", head_dim);
    j.set("hidden_act", "silu");
    j.set("hidden_size", d_model);
    j.set("initial_context_length", rope_original_context);
    j.set("initializer_range", 0.02);
    j.set("intermediate_size", d_ff);
    j.set("layer_types", layer_types);
    j.set("max_position_embeddings", max_position);
    j.set("model_type", "gpt_oss");
    j.set("num_attention_heads", n_heads);
    j.set("num_experts_per_tok", top_k);
    j.set("num_hidden_layers", n_layers);
    j.set("num_key_value_heads", n_kv_heads);
    j.set("num_local_experts", n_experts);
    j.set("output_router_logits", false);
    j.set("pad_token_id", pad_token_id);
    j.set("quantization_config", quant);
    j.set("rms_norm_eps", float_value(norm_eps));
    j.set("rope_scaling", rope);
    j.set("rope_theta", rope_theta);
    j.set("router_aux_loss_coef", 0.9);
    j.set("sliding_window", sliding_window);
    if (swiglu_alpha != 1.702f) j.set("swiglu_alpha", float_value(swiglu_alpha));  // not a Hub key
    j.set("swiglu_limit", float_value(swiglu_limit));
    j.set("tie_word_embeddings", false);
    j.set("transformers_version", "4.55.0.dev0");
    j.set("use_cache", true);
    j.set("vocab_size", vocab_size);
    return j;
}

Value Config::to_original_json() const {
    OSPREY_CHECK(!rope_truncate && norm_eps == 1e-5f && swiglu_alpha == 1.702f,
                 "config: the original layout cannot express YaRN truncation, rms_norm_eps != 1e-5 or swiglu_alpha "
                 "!= 1.702 (its reference hard-codes them)");
    Value j{json::Object{}};
    j.set("num_hidden_layers", n_layers);
    j.set("num_experts", n_experts);
    j.set("experts_per_token", top_k);
    j.set("vocab_size", vocab_size);
    j.set("hidden_size", d_model);
    j.set("intermediate_size", d_ff);
    j.set("swiglu_limit", float_value(swiglu_limit));
    j.set("head_dim", head_dim);
    j.set("num_attention_heads", n_heads);
    j.set("num_key_value_heads", n_kv_heads);
    j.set("sliding_window", sliding_window);
    j.set("initial_context_length", rope_original_context);
    j.set("rope_theta", rope_theta);
    j.set("rope_scaling_factor", rope_factor);
    j.set("rope_ntk_alpha", rope_beta_slow);
    j.set("rope_ntk_beta", rope_beta_fast);
    // Not original keys (OpenAI's files leave the ids to the tokenizer); written only for models whose
    // ids differ from gpt-oss's, e.g. small-vocabulary test models, so that they read back.
    if (eos_token_id != Config{}.eos_token_id || pad_token_id != Config{}.pad_token_id) {
        j.set("eos_token_id", eos_token_id);
        j.set("pad_token_id", pad_token_id);
    }
    return j;
}

Value Config::to_generation_config_json() const {
    // gpt-oss's Harmony ids: <|startoftext|> 199998, <|return|> 200002, <|endoftext|> 199999, <|call|> 200012.
    Value j{json::Object{}};
    j.set("bos_token_id", 199998);
    j.set("do_sample", true);
    j.set("eos_token_id", json::Array{Value(eos_token_id), Value(pad_token_id), Value(200012)});
    j.set("pad_token_id", pad_token_id);
    j.set("transformers_version", "4.55.0.dev0");
    return j;
}

}  // namespace osprey::model
