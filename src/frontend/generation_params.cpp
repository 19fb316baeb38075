// Output limits (see generation_params.h).
#include "frontend/generation_params.h"

#include <algorithm>

#include "frontend/api_error.h"

namespace osprey::frontend {

namespace {

const char* max_tokens_field(Api api) {
    switch (api) {
        case Api::chat: return "max_completion_tokens";
        case Api::completions: return "max_tokens";
        case Api::responses: return "max_output_tokens";
    }
    return "max_tokens";
}

}  // namespace

void apply_to_request(const GenerationParams& p, engine::Request& request) {
    request.sampling = p.sampling;
    request.n = p.n;
    request.min_tokens = std::min(p.min_tokens, request.max_new_tokens);
    request.priority = -p.priority;
    request.prompt_logprobs = p.prompt_logprobs;
    for (int32_t t : p.stop_token_ids)
        if (std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(), t) == request.stop_token_ids.end())
            request.stop_token_ids.push_back(t);
}

int resolve_max_tokens(const GenerationParams& p, Api api, int n_prompt, int max_model_len,
                       const std::string& prompt_param, int default_max) {
    if (n_prompt >= max_model_len)
        throw ApiError(400,
                       str("the prompt has ", n_prompt, " tokens, but this model's maximum context length is ",
                           max_model_len, " tokens (prompt and output together)"),
                       prompt_param, "context_length_exceeded");
    if (!p.max_tokens) return default_max > 0 ? std::min(default_max, max_model_len - n_prompt) : max_model_len - n_prompt;
    if (int64_t(n_prompt) + *p.max_tokens > max_model_len)
        throw ApiError(400,
                       str("this model's maximum context length is ", max_model_len, " tokens; the prompt has ",
                           n_prompt, " and ", max_tokens_field(api), " asks for ", *p.max_tokens,
                           " more (at most ", max_model_len - n_prompt, " fit)"),
                       max_tokens_field(api), "context_length_exceeded");
    return *p.max_tokens;
}

}  // namespace osprey::frontend
