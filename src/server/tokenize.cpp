// POST /tokenize and /detokenize, in vLLM's shape. tokenize takes a "prompt" (text, encoded as
// /v1/completions does) or chat "messages" (rendered as /v1/chat/completions renders them, with the
// assistant's "<|start|>assistant" header when add_generation_prompt, the default) and answers
// {"count", "max_model_len", "tokens"} (plus "token_strs" when return_token_strs); detokenize takes
// "tokens" and answers {"prompt"}. "model" is optional; when given it must be a served name.
#include "harmony/render.h"
#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/json_fields.h"
#include "server/routes.h"

namespace osprey::server {

http::HttpResponse handle_tokenize(ServerContext& ctx, const json::Value& body) {
    Fields f(body, "");
    if (auto model = f.string("model")) check_model(ctx, *model);
    const json::Value* prompt = f.get("prompt");
    const json::Value* messages = f.get("messages");
    if (!prompt == !messages) bad_param("prompt", "give exactly one of \"prompt\" and \"messages\"");
    std::vector<int32_t> tokens;
    if (prompt) {
        if (!prompt->is_string()) wrong_type("prompt", "a string", *prompt);
        f.ignore({"add_special_tokens"});  // o200k adds no BOS: nothing to add
        tokens = ctx.tokenizer.encode(prompt->as_string());
    } else {
        const bool generation_prompt = f.boolean("add_generation_prompt").value_or(true);
        if (auto cont = f.boolean("continue_final_message"); cont && *cont)
            bad_param("continue_final_message", "is not supported (Harmony closes every message)");
        // The chat route's own parser, on the members a chat request would have.
        json::Value chat;
        chat.set("model", ctx.options.model_name);
        chat.set("messages", *messages);
        for (const char* key : {"tools", "tool_choice", "reasoning_effort", "chat_template_kwargs"})
            if (const json::Value* v = f.get(key)) chat.set(key, *v);
        f.ignore({"add_special_tokens", "chat_template", "mm_processor_kwargs"});
        const ChatRequest r = parse_chat_request(chat, ctx.limits);
        try {
            tokens = generation_prompt ? harmony::render_for_completion(r.conversation).tokens(ctx.tokenizer)
                                       : harmony::render_conversation(r.conversation).tokens(ctx.tokenizer);
        } catch (const ApiError&) {
            throw;
        } catch (const Error& e) {
            bad_param("messages", e.what());
        }
    }
    const bool strs = f.boolean("return_token_strs").value_or(false);
    f.finish();
    json::Array ids;
    for (int32_t t : tokens) ids.emplace_back(int64_t(t));
    json::Value v;
    v.set("count", int64_t(tokens.size()));
    v.set("max_model_len", ctx.max_model_len);
    v.set("tokens", std::move(ids));
    if (strs) {
        json::Array pieces;
        for (int32_t t : tokens) pieces.emplace_back(ctx.tokenizer.token_bytes(t));
        v.set("token_strs", std::move(pieces));
    }
    return http::HttpResponse::json(200, v.dump());
}

http::HttpResponse handle_detokenize(ServerContext& ctx, const json::Value& body) {
    Fields f(body, "");
    if (auto model = f.string("model")) check_model(ctx, *model);
    const json::Value* tokens = f.array("tokens");
    if (!tokens) bad_param("tokens", "required", "missing_required_parameter");
    const std::vector<int32_t> ids = token_id_array(*tokens, "tokens", ctx.tokenizer.vocab_size());
    f.finish();
    json::Value v;
    v.set("prompt", ctx.tokenizer.decode_bytes(ids));  // a cut character is written as U+FFFD
    return http::HttpResponse::json(200, v.dump());
}

}  // namespace osprey::server
