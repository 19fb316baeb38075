// The front end's way into the engine. submit_rendered() is what /v1/chat/completions and
// /v1/responses share: render the conversation for completion, end the prompt with a forced call's
// header, and submit one request whose assistant turn ends at <|return|> or <|call|>. submit() alone
// takes a prompt already in tokens (/v1/completions). Both turn the engine's refusals into ApiError.
// Tests: tests/server/test_server_e2e.cpp and tools/server/test_openai_client.py (through the routes).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "frontend/generation_params.h"
#include "frontend/harmony_prompt.h"
#include "harmony/message.h"

namespace osprey::tok {
class Tokenizer;
}

namespace osprey::frontend {

// Where requests go, and the context limits they are held to.
struct SubmitTarget {
    engine::Engine& engine;
    const tok::Tokenizer& tokenizer;  // renders the prompts
    int max_model_len = 0;            // prompt and output tokens together
    int default_max_tokens = 0;       // output limit of requests that give none (0: the rest of the context)
};

// Submits to the engine, turning its refusals (osprey::Error) into ApiError: 503 server_busy when its
// queue is full, else 400 with the engine's message.
std::shared_ptr<engine::RequestStream> submit(engine::Engine& engine, engine::Request request);

// A conversation to continue as the assistant, and how to generate.
struct RenderedRequest {
    const char* id;                             // the engine request's id ("chat", "response")
    const harmony::Conversation& conversation;  // rendered for completion (it ends <|start|>assistant)
    const ForcedCall& forced;                   // tool_choice "required" or a named function
    const GenerationParams& params;             // sampling, n, max_tokens
    Api api;                                    // names the max-tokens field in errors
    const char* prompt_param;                   // names the prompt in errors: "messages", "input"
    std::shared_ptr<const engine::TokenConstraint> constraint = nullptr;  // structured output (constraint.h)
};

struct Submitted {
    std::shared_ptr<engine::RequestStream> stream;
    std::vector<int32_t> primed;  // the forced call's header tokens ending the prompt, for ChatOutput::prime
};

// Throws ApiError(400) naming prompt_param when the conversation does not render ("messages: ..."),
// resolve_max_tokens' errors, and submit()'s.
Submitted submit_rendered(const SubmitTarget& target, const RenderedRequest& r);

}  // namespace osprey::frontend
