// Request validation and names (see request.h).
#include "engine/request.h"

#include <cmath>

#include "core/check.h"
#include "engine/request_limits.h"

namespace osprey::engine {

const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::stop:
            return "stop";
        case FinishReason::length:
            return "length";
        case FinishReason::abort:
            return "abort";
        case FinishReason::error:
            return "error";
    }
    return "unknown";
}

uint64_t sample_seed(uint64_t seed, int sample) {
    if (sample == 0) return seed;
    uint64_t x = seed + 0x9E3779B97F4A7C15ull * uint64_t(sample);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void validate_request(const Request& r, const RequestLimits& limits) {
    const std::string who = r.id.empty() ? std::string("request") : "request '" + r.id + "'";
    OSPREY_CHECK(!r.prompt.empty(), who, ": the prompt is empty");
    for (size_t i = 0; i < r.prompt.size(); ++i)
        OSPREY_CHECK(r.prompt[i] >= 0 && r.prompt[i] < limits.vocab_size, who, ": prompt token ", i, " is ",
                     r.prompt[i], ", outside the vocabulary [0, ", limits.vocab_size, ")");
    OSPREY_CHECK(r.max_new_tokens >= 1, who, ": max_new_tokens must be at least 1, got ", r.max_new_tokens);
    const int64_t total = int64_t(r.prompt.size()) + r.max_new_tokens;
    OSPREY_CHECK(total <= limits.max_model_len, who, ": prompt of ", r.prompt.size(), " tokens + max_new_tokens ",
                 r.max_new_tokens, " = ", total, " exceeds max_model_len ", limits.max_model_len);
    OSPREY_CHECK(r.n >= 1 && r.n <= limits.max_n, who, ": n must be in [1, ", limits.max_n, "], got ", r.n);
    for (int32_t t : r.stop_token_ids)
        OSPREY_CHECK(t >= 0 && t < limits.vocab_size, who, ": stop token ", t, " is outside the vocabulary");
    OSPREY_CHECK(r.min_tokens >= 0 && r.min_tokens <= r.max_new_tokens, who, ": min_tokens must be in [0, max_new_tokens = ",
                 r.max_new_tokens, "], got ", r.min_tokens);
    OSPREY_CHECK(r.prompt_logprobs >= -1 && r.prompt_logprobs <= 20, who, ": prompt_logprobs must be in [-1, 20], got ",
                 r.prompt_logprobs);

    const SamplingParams& p = r.sampling;
    OSPREY_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f, who,
                 ": temperature must be a finite number >= 0, got ", p.temperature);
    OSPREY_CHECK(p.top_k >= 0, who, ": top_k must be >= 0 (0 is off), got ", p.top_k);
    OSPREY_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, who, ": top_p must be in (0, 1], got ", p.top_p);
    OSPREY_CHECK(p.min_p >= 0.0f && p.min_p <= 1.0f, who, ": min_p must be in [0, 1], got ", p.min_p);
    OSPREY_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f, who,
                 ": repetition_penalty must be > 0, got ", p.repetition_penalty);
    OSPREY_CHECK(std::isfinite(p.frequency_penalty), who, ": frequency_penalty must be finite");
    OSPREY_CHECK(std::isfinite(p.presence_penalty), who, ": presence_penalty must be finite");
    for (const auto& [token, bias] : p.logit_bias) {
        OSPREY_CHECK(token >= 0 && token < limits.vocab_size, who, ": logit_bias token ", token,
                     " is outside the vocabulary");
        OSPREY_CHECK(!std::isnan(bias), who, ": logit_bias for token ", token, " is NaN");
    }
    OSPREY_CHECK(p.top_logprobs >= 0 && p.top_logprobs <= limits.max_top_logprobs, who,
                 ": top_logprobs must be in [0, ", limits.max_top_logprobs, "], got ", p.top_logprobs);
}

}  // namespace osprey::engine
