// OpenAI sampling parameters -> SamplingParams (see generation_fields.h).
#include "server/generation_fields.h"

#include <algorithm>
#include <random>

#include "server/api_error.h"

namespace osprey::server {

using frontend::Api;
using frontend::GenerationParams;

namespace {

uint64_t random_seed() {
    static thread_local std::mt19937_64 rng(std::random_device{}());
    return rng();
}

}  // namespace

GenerationParams parse_generation_params(Fields& f, Api api, const GenerationLimits& limits) {
    GenerationParams p;
    SamplingParams& s = p.sampling;
    if (auto v = f.number("temperature", 0.0, 2.0)) s.temperature = float(*v);
    if (auto v = f.number("top_p", 0.0, 1.0)) {
        if (*v <= 0.0) bad_param(f.path("top_p"), "must be in (0, 1], got 0");
        s.top_p = float(*v);
    }
    if (auto v = f.integer("top_k", -1, limits.vocab_size)) s.top_k = *v < 0 ? 0 : int(*v);
    if (auto v = f.number("min_p", 0.0, 1.0)) s.min_p = float(*v);
    if (api != Api::responses) {
        if (auto v = f.number("presence_penalty", -2.0, 2.0)) s.presence_penalty = float(*v);
        if (auto v = f.number("frequency_penalty", -2.0, 2.0)) s.frequency_penalty = float(*v);
        if (auto v = f.number("repetition_penalty", 0.0, 10.0)) {
            if (*v <= 0.0) bad_param(f.path("repetition_penalty"), "must be > 0");
            s.repetition_penalty = float(*v);
        }
        if (auto v = f.integer("seed", INT64_MIN, INT64_MAX)) {
            s.seed = uint64_t(*v);
        } else {
            s.seed = random_seed();
        }
        if (const json::Value* bias = f.object("logit_bias")) {
            for (const auto& [key, value] : bias->as_object()) {
                const std::string path = f.path("logit_bias") + "." + key;
                int64_t id = -1;
                try {
                    size_t used = 0;
                    id = std::stoll(key, &used);
                    if (used != key.size()) id = -1;
                } catch (const std::exception&) {
                    id = -1;
                }
                if (id < 0 || id >= limits.vocab_size)
                    bad_param(path, str("key must be a token id in [0, ", limits.vocab_size, ")"));
                if (!value.is_number()) wrong_type(path, "a number", value);
                const double b = value.as_double();
                if (!(b >= -100.0 && b <= 100.0)) bad_param(path, "must be in [-100, 100]");
                s.logit_bias.emplace_back(int32_t(id), float(b));
            }
        }
        if (auto v = f.integer("n", 1, limits.max_n)) p.n = int(*v);
        const json::Value* stop = f.get("stop");
        if (stop) {
            const std::string path = f.path("stop");
            if (stop->is_string()) {
                p.stop.push_back(stop->as_string());
            } else if (stop->is_array()) {
                if (stop->size() > 16) bad_param(path, "at most 16 stop strings");
                for (size_t i = 0; i < stop->size(); ++i) {
                    const json::Value& item = stop->as_array()[i];
                    if (!item.is_string()) wrong_type(str(path, "[", i, "]"), "a string", item);
                    p.stop.push_back(item.as_string());
                }
            } else {
                wrong_type(path, "a string or an array of strings", *stop);
            }
            for (size_t i = 0; i < p.stop.size(); ++i)
                if (p.stop[i].empty()) bad_param(str(path, "[", i, "]"), "stop strings must not be empty");
        }
    } else {
        s.seed = random_seed();
    }

    // Log-probabilities: chat spells them logprobs (bool) + top_logprobs; completions uses one integer.
    if (api == Api::chat) {
        if (auto v = f.boolean("logprobs")) s.logprobs = *v;
        if (auto v = f.integer("top_logprobs", 0, limits.max_top_logprobs)) {
            if (!s.logprobs && *v > 0) bad_param(f.path("top_logprobs"), "needs \"logprobs\": true");
            s.top_logprobs = int(*v);
        }
    } else if (api == Api::completions) {
        if (auto v = f.integer("logprobs", 0, limits.max_top_logprobs)) {
            s.logprobs = true;
            s.top_logprobs = int(*v);
        }
        if (auto v = f.boolean("echo")) p.echo = *v;
        if (p.echo && s.logprobs) p.prompt_logprobs = s.top_logprobs;
        if (auto v = f.integer("prompt_logprobs", 0, limits.max_top_logprobs)) p.prompt_logprobs = std::max(p.prompt_logprobs, int(*v));
    } else {
        if (auto v = f.integer("top_logprobs", 0, limits.max_top_logprobs)) {
            s.logprobs = *v > 0;
            s.top_logprobs = int(*v);
        }
    }

    const int64_t max_limit = INT32_MAX / 2;
    if (api == Api::chat) {
        auto a = f.integer("max_completion_tokens", 1, max_limit);
        auto b = f.integer("max_tokens", 1, max_limit);
        if (a) p.max_tokens = int(*a);
        else if (b) p.max_tokens = int(*b);
    } else if (api == Api::completions) {
        if (auto v = f.integer("max_tokens", 1, max_limit)) p.max_tokens = int(*v);
    } else {
        if (auto v = f.integer("max_output_tokens", 1, max_limit)) p.max_tokens = int(*v);
    }

    // vLLM's extras, in every API.
    if (auto v = f.integer("min_tokens", 0, max_limit)) {
        p.min_tokens = int(*v);
        if (p.max_tokens && p.min_tokens > *p.max_tokens)
            bad_param(f.path("min_tokens"), str("must not exceed the output limit (", *p.max_tokens, ")"));
    }
    if (const json::Value* ids = f.array("stop_token_ids")) {
        if (ids->size() > 64) bad_param(f.path("stop_token_ids"), "at most 64 token ids");
        for (size_t i = 0; i < ids->size(); ++i) {
            const json::Value& t = ids->as_array()[i];
            const std::string path = str(f.path("stop_token_ids"), "[", i, "]");
            if (!t.is_integer()) wrong_type(path, "a token id (integer)", t);
            if (t.as_int() < 0 || t.as_int() >= limits.vocab_size)
                bad_param(path, str("token id ", t.as_int(), " is outside the vocabulary [0, ", limits.vocab_size, ")"));
            p.stop_token_ids.push_back(int32_t(t.as_int()));
        }
    }
    if (auto v = f.boolean("skip_special_tokens")) p.skip_special_tokens = *v;
    if (auto v = f.boolean("include_stop_str_in_output")) p.include_stop_str_in_output = *v;
    if (auto v = f.integer("priority", -1000000, 1000000)) p.priority = int(*v);
    if (auto v = f.string("request_id")) {
        if (v->empty() || v->size() > 256) bad_param(f.path("request_id"), "must be 1 to 256 characters");
        for (unsigned char ch : *v)
            if (ch < 0x20 || ch > 0x7e) bad_param(f.path("request_id"), "must be printable ASCII");
        p.request_id = *v;
    }
    // Accepted, no effect: detokenisation never adds spaces between special tokens here.
    f.ignore({"spaces_between_special_tokens"});

    if (auto v = f.boolean("stream")) p.stream = *v;
    if (api != Api::responses) {
        if (const json::Value* so = f.object("stream_options")) {
            Fields o(*so, f.path("stream_options"));
            if (auto v = o.boolean("include_usage")) p.include_usage = *v;
            o.ignore({"continuous_usage_stats", "include_obfuscation"});
            o.finish();
            if (!p.stream) bad_param(f.path("stream_options"), "only allowed with \"stream\": true");
        }
    }
    return p;
}

}  // namespace osprey::server
