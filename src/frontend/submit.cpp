// Rendered conversations and token prompts -> engine requests (see submit.h).
#include "frontend/submit.h"

#include <iterator>
#include <string>

#include "frontend/api_error.h"
#include "harmony/render.h"
#include "harmony/special_tokens.h"

namespace osprey::frontend {

std::shared_ptr<engine::RequestStream> submit(engine::Engine& engine, engine::Request request) {
    try {
        return engine.submit(std::move(request));
    } catch (const ApiError&) {
        throw;
    } catch (const Error& e) {
        // The engine's only refusal that is not about the request itself is a full queue.
        const bool busy = std::string(e.what()).find("at capacity") != std::string::npos;
        throw ApiError(busy ? 503 : 400, e.what(), "", busy ? "server_busy" : "");
    }
}

Submitted submit_rendered(const SubmitTarget& target, const RenderedRequest& r) {
    std::vector<int32_t> prompt;
    try {
        prompt = harmony::render_for_completion(r.conversation).tokens(target.tokenizer);
    } catch (const ApiError&) {
        throw;
    } catch (const Error& e) {
        throw ApiError(400, std::string(r.prompt_param) + ": " + e.what(), r.prompt_param);
    }
    Submitted s;
    if (r.forced.on) s.primed = forced_call_tokens(target.tokenizer, r.forced);
    prompt.insert(prompt.end(), s.primed.begin(), s.primed.end());
    engine::Request request;
    request.id = r.id;
    request.max_new_tokens = resolve_max_tokens(r.params, r.api, int(prompt.size()), target.max_model_len,
                                                r.prompt_param, target.default_max_tokens);
    request.prompt = std::move(prompt);
    request.constraint = r.constraint;
    // The assistant's turn ends at <|return|> (answer done) or <|call|> (a tool call to run); <|end|>
    // only ends one message of the turn (shared/spec/harmony.md §7).
    request.stop_token_ids.assign(std::begin(harmony::kAssistantActionStopTokens),
                                  std::end(harmony::kAssistantActionStopTokens));
    apply_to_request(r.params, request);
    s.stream = submit(target.engine, std::move(request));
    return s;
}

}  // namespace osprey::frontend
