// POST /v1/chat/completions: Harmony prompt in, reasoning / content / tool calls out, streamed over
// SSE or answered whole. Request parsing: chat_request.cpp; token -> delta: frontend/chat_output.cpp.
#include <algorithm>
#include <optional>
#include <span>

#include "core/log.h"
#include "frontend/chat_output.h"
#include "frontend/submit.h"
#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/choices_job.h"
#include "server/routes.h"

namespace osprey::server {

using frontend::Api;
using frontend::ChatDelta;
using frontend::ChatOutput;
using frontend::ChatOutputOptions;
using frontend::ToolCall;
using frontend::ToolCallDelta;

void check_model(const ServerContext& ctx, const std::string& model) {
    const auto& extra = ctx.options.extra_model_names;
    if (model != ctx.options.model_name && std::find(extra.begin(), extra.end(), model) == extra.end())
        throw ApiError(404, "The model '" + model.substr(0, 200) + "' does not exist; this server serves '" +
                                ctx.options.model_name + "'",
                       "model", "model_not_found");
}

std::string response_id(ServerContext& ctx, const char* prefix, const std::string& request_id) {
    if (request_id.empty()) return ctx.new_id(prefix);
    return request_id.rfind(prefix, 0) == 0 ? request_id : prefix + request_id;
}

json::Value token_logprob_json(const tok::Tokenizer& tokenizer, const engine::Event& e) {
    auto entry = [&](int32_t id, float logprob) {
        json::Value v;
        std::string bytes;
        try {
            bytes = tokenizer.token_bytes(id);
        } catch (const std::exception&) {
            bytes.clear();
        }
        v.set("token", bytes);  // invalid UTF-8 pieces are written with U+FFFD by the serializer
        v.set("logprob", double(logprob));
        json::Array b;
        for (unsigned char c : bytes) b.emplace_back(int(c));
        v.set("bytes", std::move(b));
        return v;
    };
    json::Value v = entry(e.token, e.logprob);
    json::Array top;
    for (const auto& [id, lp] : e.top) top.push_back(entry(id, lp));
    v.set("top_logprobs", std::move(top));
    return v;
}

json::Value usage_json(int prompt_tokens, int completion_tokens, int cached_tokens, int reasoning_tokens) {
    json::Value u;
    u.set("prompt_tokens", prompt_tokens);
    u.set("completion_tokens", completion_tokens);
    u.set("total_tokens", prompt_tokens + completion_tokens);
    json::Value pd;
    pd.set("cached_tokens", cached_tokens);
    u.set("prompt_tokens_details", pd);
    json::Value cd;
    cd.set("reasoning_tokens", reasoning_tokens);
    u.set("completion_tokens_details", cd);
    return u;
}

namespace {

// A call's first streamed piece names it (arguments ""); the next ones carry only arguments.
json::Value tool_call_delta_json(const ToolCallDelta& piece) {
    json::Value v;
    v.set("index", piece.index);
    json::Value fn;
    if (!piece.id.empty()) {
        v.set("id", piece.id);
        v.set("type", "function");
        fn.set("name", piece.name);
    }
    fn.set("arguments", piece.arguments);
    v.set("function", fn);
    return v;
}

json::Value tool_call_json(const ToolCall& call, int index, bool with_index) {
    json::Value v;
    if (with_index) v.set("index", index);
    v.set("id", call.id);
    v.set("type", "function");
    json::Value fn;
    fn.set("name", call.name);
    fn.set("arguments", call.arguments);
    v.set("function", fn);
    return v;
}

class ChatJob : public ChoicesJob {
public:
    // primed: the prompt's tail that starts the assistant's turn (a forced call's header), parsed by
    // every choice before its first generated token.
    ChatJob(ServerContext& ctx, std::shared_ptr<engine::RequestStream> stream, const ChatRequest& r,
            std::span<const int32_t> primed)
        : ChoicesJob(ctx, {std::move(stream)}, r.params.n, r.params.stream, r.params.include_usage, "chatcmpl-",
                     "chat.completion", "chat.completion.chunk", r.params.request_id),
          logprobs_(r.params.sampling.logprobs) {
        ChatOutputOptions o;
        o.tool_names = r.tool_names;
        o.tools_enabled = r.tools_enabled;
        o.stop = r.params.stop;
        o.include_stop = r.params.include_stop_str_in_output;
        for (int i = 0; i < r.params.n; ++i) {
            choices_.emplace_back(ctx.tokenizer, o);
            choices_.back().output.prime(primed);
        }
    }

protected:
    struct Choice {
        Choice(const tok::Tokenizer& t, const ChatOutputOptions& o) : output(t, o) {}
        ChatOutput output;
        json::Array logprobs;     // all of it (non-streaming) or this poll's (streaming)
        bool role_sent = false;
        std::string finish_reason;
    };

    json::Value chunk(int index, json::Value delta, const json::Value& finish_reason, json::Value logprobs) const {
        json::Value c;
        c.set("index", index);
        c.set("delta", std::move(delta));
        c.set("logprobs", std::move(logprobs));
        c.set("finish_reason", finish_reason);
        return chunk_envelope(std::move(c), include_usage_);
    }

    void emit(int index, const ChatDelta& d, Progress& p) {
        Choice& c = choices_[size_t(index)];
        json::Value delta;
        if (!c.role_sent) {
            c.role_sent = true;
            delta.set("role", "assistant");
            delta.set("content", "");
        }
        if (!d.reasoning.empty()) {
            delta.set("reasoning_content", d.reasoning);
            delta.set("reasoning", d.reasoning);
        }
        if (!d.content.empty()) delta.set("content", d.content);
        if (!d.call_deltas.empty()) {  // streamed in pieces; d.tool_calls holds the same calls whole
            json::Array calls;
            for (const auto& piece : d.call_deltas) calls.push_back(tool_call_delta_json(piece));
            delta.set("tool_calls", std::move(calls));
        }
        json::Value logprobs;
        if (logprobs_ && !c.logprobs.empty()) {
            logprobs.set("content", std::move(c.logprobs));
            c.logprobs.clear();
        }
        if (delta.size() == 0 && logprobs.is_null()) return;
        p.body += sse(chunk(index, std::move(delta), json::Value(), std::move(logprobs)));
    }

    void on_token(int choice, const engine::Event& e, Progress& p) override {
        Choice& c = choices_[size_t(choice)];
        if (logprobs_) c.logprobs.push_back(token_logprob_json(ctx_.tokenizer, e));
        ChatDelta d = c.output.push(e.token);
        if (streaming_) emit(choice, d, p);
        if (c.output.stopped()) end_choice(choice);
    }

    void on_finish(int choice, const engine::Event& e, Progress& p) override {
        Choice& c = choices_[size_t(choice)];
        ChatDelta d = c.output.finish(e.stop_token);
        c.finish_reason = c.output.finish_reason(e.reason);
        if (e.reason == engine::FinishReason::error) {
            log::error("chat request ", id_, " failed: ", e.error);
            error_ = e.error;
        }
        last_finish_reason_ = c.finish_reason;
        if (!streaming_) return;
        emit(choice, d, p);
        if (e.reason == engine::FinishReason::error) {
            p.body += sse(error_body("generation failed: " + e.error, "server_error", "", ""));
            return;
        }
        p.body += sse(chunk(choice, json::Value(json::Object{}), c.finish_reason, json::Value()));
    }

    int reasoning_tokens() const override {
        int n = 0;
        for (const auto& c : choices_) n += c.output.n_reasoning_tokens();
        return n;
    }

    json::Array final_choices() override {
        json::Array choices;
        for (size_t i = 0; i < choices_.size(); ++i) {
            Choice& c = choices_[i];
            json::Value message;
            message.set("role", "assistant");
            const std::string& content = c.output.content();
            message.set("content", content.empty() && !c.output.tool_calls().empty() ? json::Value() : json::Value(content));
            const std::string& reasoning = c.output.reasoning();
            message.set("reasoning_content", reasoning.empty() ? json::Value() : json::Value(reasoning));
            message.set("reasoning", reasoning.empty() ? json::Value() : json::Value(reasoning));
            message.set("refusal", json::Value());
            if (!c.output.tool_calls().empty()) {
                json::Array calls;
                for (const auto& call : c.output.tool_calls()) calls.push_back(tool_call_json(call, 0, false));
                message.set("tool_calls", std::move(calls));
            }
            json::Value choice;
            choice.set("index", int(i));
            choice.set("message", std::move(message));
            if (logprobs_) {
                json::Value lp;
                lp.set("content", std::move(c.logprobs));
                choice.set("logprobs", std::move(lp));
            } else {
                choice.set("logprobs", json::Value());
            }
            choice.set("finish_reason", c.finish_reason);
            choices.push_back(std::move(choice));
        }
        return choices;
    }

private:
    const bool logprobs_;
    std::vector<Choice> choices_;
};

}  // namespace

http::Reply handle_chat_completions(ServerContext& ctx, const json::Value& body, RequestInfo& info) {
    ChatRequest r = parse_chat_request(body, ctx.limits);
    check_model(ctx, r.model);
    const auto constraint = frontend::make_harmony_constraint(
        ctx.target().tokenizer, {.final_format = r.format, .tools = r.tools, .forced = r.forced});
    if (!info.request_id.empty()) r.params.request_id = info.request_id;  // the header wins, as in vLLM
    frontend::Submitted s = frontend::submit_rendered(ctx.target(), {.id = "chat",
                                                                     .conversation = r.conversation,
                                                                     .forced = r.forced,
                                                                     .params = r.params,
                                                                     .api = Api::chat,
                                                                     .prompt_param = "messages",
                                                                     .constraint = constraint});
    auto job = std::make_unique<ChatJob>(ctx, std::move(s.stream), r, s.primed);
    info.request_id = r.params.request_id.empty() ? job->id() : r.params.request_id;
    return http::Reply(std::move(job));
}

}  // namespace osprey::server
