// POST /v1/responses (streaming events or one response object), GET and DELETE /v1/responses/{id}.
// Input items (messages, function_call, function_call_output, reasoning) map onto Harmony like the
// chat API's messages; previous_response_id continues a stored conversation (store defaults to true,
// as in OpenAI's API); output items are reasoning, message and function_call. Streamed, a function
// call is announced by its first piece and its arguments follow as deltas (ChatOutput's call pieces);
// a call whose arguments end up not JSON is closed with status "incomplete" and no arguments.done,
// and its text follows as a message. Not streamed, only complete calls become items.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <span>

#include "core/log.h"
#include "frontend/chat_output.h"
#include "frontend/harmony_prompt.h"
#include "frontend/submit.h"
#include "http/sse.h"
#include "server/api_error.h"
#include "server/format_fields.h"
#include "server/generation_fields.h"
#include "server/generation_job.h"
#include "server/harmony_fields.h"
#include "server/json_fields.h"
#include "server/routes.h"

namespace osprey::server {

using namespace harmony;
using frontend::Api;
using frontend::ChatDelta;
using frontend::ChatOutput;
using frontend::ChatOutputOptions;
using frontend::ForcedCall;
using frontend::GenerationParams;
using frontend::PromptSpec;
using frontend::tool_call_message;
using frontend::tool_result_message;
using frontend::ToolCall;
using frontend::ToolCallDelta;

namespace {

struct ResponsesRequest {
    std::string model;
    PromptSpec spec;
    std::vector<std::string> instructions_only;  // the request's own "instructions"
    GenerationParams params;
    bool store = true;
    bool tools_enabled = true;
    ForcedCall forced;  // tool_choice "required" or a named function
    frontend::OutputFormat format;  // text.format
    json::Value format_echo;        // text.format as the response object shows it
    std::optional<std::string> previous_response_id;
    json::Value echo;  // request fields echoed in the response object
    json::Array input_items;  // the input as items with ids, for GET /v1/responses/{id}/input_items
};

// The include values OpenAI's API defines: message.output_text.logprobs is honoured; the others
// concern tools or inputs this server does not have (or, reasoning.encrypted_content, reasoning it
// does not encrypt) and change nothing. Anything else is a 400.
constexpr const char* kIncludeValues[] = {"message.output_text.logprobs",     "reasoning.encrypted_content",
                                          "code_interpreter_call.outputs",    "computer_call_output.output.image_url",
                                          "file_search_call.results",         "message.input_image.image_url",
                                          "web_search_call.action.sources",   "web_search_call.results"};

// An input item as GET .../input_items lists it: with an id, a string content as input_text.
json::Value input_item_json(const json::Value& item, ServerContext& ctx) {
    json::Value v = item;
    if (!v.find("type")) v.set("type", "message");
    if (!v.find("id")) {
        const std::string& type = v.at("type").as_string();
        v.set("id", ctx.new_id(type == "message" ? "msg_" : type == "function_call" ? "fc_" :
                               type == "reasoning" ? "rs_" : "fco_"));
    }
    if (const json::Value* content = v.find("content"); content && content->is_string()) {
        json::Value part;
        const bool assistant = v.find("role") && v.at("role").is_string() && v.at("role").as_string() == "assistant";
        part.set("type", assistant ? "output_text" : "input_text");
        part.set("text", content->as_string());
        v.set("content", json::Array{part});
    }
    return v;
}

// Function names of the function_call items of a stored response, by call id.
void collect_calls(const json::Value& response, std::map<std::string, std::string>& names) {
    if (const json::Value* output = response.find("output"))
        for (const auto& item : output->as_array())
            if (item.at("type").as_string() == "function_call")
                names[item.at("call_id").as_string()] = item.at("name").as_string();
}

void parse_input_item(const json::Value& value, const std::string& path, PromptSpec& spec,
                      std::map<std::string, std::string>& call_names) {
    Fields f(value, path);
    const std::string type = f.string("type").value_or("message");
    if (type == "message") {
        auto role = f.string("role");
        if (!role) bad_param(f.path("role"), "required", "missing_required_parameter");
        const json::Value* content = f.get("content");
        if (!content) bad_param(f.path("content"), "required", "missing_required_parameter");
        const std::string text = content_text(*content, f.path("content"), {"input_text", "output_text", "text"});
        if (*role == "user") {
            spec.turns.push_back(Message::user(text));
        } else if (*role == "system" || *role == "developer") {
            spec.instructions.push_back(text);
        } else if (*role == "assistant") {
            spec.turns.push_back(Message::assistant(text, "final"));
        } else {
            bad_param(f.path("role"), "must be 'user', 'assistant', 'system' or 'developer'");
        }
        f.ignore({"id", "status"});
    } else if (type == "function_call") {
        auto name = f.string("name");
        auto call_id = f.string("call_id");
        if (!name) bad_param(f.path("name"), "required", "missing_required_parameter");
        if (!call_id) bad_param(f.path("call_id"), "required", "missing_required_parameter");
        const std::string args = f.string("arguments").value_or("{}");
        call_names[*call_id] = *name;
        spec.turns.push_back(tool_call_message(*name, args));
        f.ignore({"id", "status"});
    } else if (type == "function_call_output") {
        auto call_id = f.string("call_id");
        if (!call_id) bad_param(f.path("call_id"), "required", "missing_required_parameter");
        const json::Value* output = f.get("output");
        if (!output) bad_param(f.path("output"), "required", "missing_required_parameter");
        const std::string text = content_text(*output, f.path("output"), {"input_text", "output_text", "text"});
        auto it = call_names.find(*call_id);
        if (it == call_names.end())
            bad_param(f.path("call_id"), "'" + call_id->substr(0, 64) + "' matches no earlier function_call");
        spec.turns.push_back(tool_result_message(it->second, text));
        f.ignore({"id", "status"});
    } else if (type == "reasoning") {
        std::string text;
        if (const json::Value* content = f.array("content")) text = content_text(*content, f.path("content"), {"reasoning_text"});
        // The summary, when there is no full text (an item echoed back holds both: the text wins).
        if (const json::Value* summary = f.array("summary"); summary && text.empty())
            text = content_text(*summary, f.path("summary"), {"summary_text"});
        if (!text.empty()) spec.turns.push_back(Message::assistant(text, "analysis"));
        f.ignore({"id", "status", "encrypted_content"});
    } else {
        bad_param(f.path("type"), "input item type '" + type.substr(0, 40) + "' is not supported");
    }
    f.finish();
}

ResponsesRequest parse_responses_request(ServerContext& ctx, const json::Value& body) {
    Fields f(body, "");
    ResponsesRequest r;
    auto model = f.string("model");
    if (!model) bad_param("model", "required", "missing_required_parameter");
    r.model = *model;
    check_model(ctx, r.model);

    std::map<std::string, std::string> call_names;
    r.previous_response_id = f.string("previous_response_id");
    if (r.previous_response_id) {
        auto prev = ctx.responses.get(*r.previous_response_id);
        if (!prev)
            throw ApiError(404, "no stored response '" + r.previous_response_id->substr(0, 80) + "'",
                           "previous_response_id", "previous_response_not_found");
        r.spec.turns = prev->conversation.messages;
        collect_calls(prev->response, call_names);
    }
    if (auto instructions = f.string("instructions")) {
        r.spec.instructions.push_back(*instructions);
        r.echo.set("instructions", *instructions);
    } else {
        r.echo.set("instructions", json::Value());
    }

    const json::Value* input = f.get("input");
    if (!input) bad_param("input", "required", "missing_required_parameter");
    if (input->is_string()) {
        r.spec.turns.push_back(Message::user(input->as_string()));
        json::Value item;
        item.set("type", "message");
        item.set("role", "user");
        item.set("content", input->as_string());
        r.input_items.push_back(input_item_json(item, ctx));
    } else if (input->is_array()) {
        for (size_t i = 0; i < input->size(); ++i) {
            parse_input_item(input->as_array()[i], str("input[", i, "]"), r.spec, call_names);
            r.input_items.push_back(input_item_json(input->as_array()[i], ctx));
        }
    } else {
        wrong_type("input", "a string or an array of input items", *input);
    }

    if (const json::Value* reasoning = f.object("reasoning")) {
        Fields rf(*reasoning, "reasoning");
        if (auto e = rf.get("effort")) r.spec.effort = parse_effort(*e, "reasoning.effort");
        rf.ignore({"summary", "generate_summary"});
        rf.finish();
    }
    json::Value reasoning_echo;
    reasoning_echo.set("effort", effort_name(r.spec.effort));
    reasoning_echo.set("summary", json::Value());
    r.echo.set("reasoning", reasoning_echo);

    json::Array tools_echo;
    if (const json::Value* ts = f.array("tools")) {
        for (size_t i = 0; i < ts->size(); ++i) {
            const std::string path = str("tools[", i, "]");
            const json::Value& t = ts->as_array()[i];
            const json::Value* type = t.is_object() ? t.find("type") : nullptr;
            if (!type || !type->is_string() || type->as_string() != "function")
                bad_param(path + ".type", "must be 'function' (built-in tools are not available)");
            r.spec.tools.push_back(parse_function(t, path, {"type"}));
            tools_echo.push_back(t);
        }
    }
    r.echo.set("tools", tools_echo);
    json::Value choice_echo = "auto";
    if (const json::Value* choice = f.get("tool_choice")) {
        choice_echo = *choice;
        r.forced = apply_tool_choice(*choice, /*nested_name=*/false, r.spec.tools, r.tools_enabled);
    }
    r.echo.set("tool_choice", choice_echo);

    if (const json::Value* text = f.object("text")) {
        Fields tf(*text, "text");
        if (const json::Value* format = tf.object("format")) {
            r.format = parse_text_format(*format, "text.format");
            r.format_echo = *format;
        }
        tf.ignore({"verbosity"});
        tf.finish();
    }
    if (auto background = f.boolean("background"); background && *background)
        bad_param("background", "background responses are not supported");
    if (auto truncation = f.string("truncation"); truncation && *truncation != "disabled" && *truncation != "auto")
        bad_param("truncation", "must be 'disabled' or 'auto'");
    r.store = f.boolean("store").value_or(true);
    r.params = parse_generation_params(f, Api::responses, ctx.limits);
    if (const json::Value* include = f.array("include")) {
        for (size_t i = 0; i < include->size(); ++i) {
            const json::Value& v = include->as_array()[i];
            const std::string path = str("include[", i, "]");
            if (!v.is_string()) wrong_type(path, "a string", v);
            if (std::find(std::begin(kIncludeValues), std::end(kIncludeValues), v.as_string()) == std::end(kIncludeValues))
                bad_param(path, "unknown include value '" + v.as_string().substr(0, 80) + "'");
            if (v.as_string() == "message.output_text.logprobs") r.params.sampling.logprobs = true;
        }
    }
    r.echo.set("temperature", double(r.params.sampling.temperature));
    r.echo.set("top_p", double(r.params.sampling.top_p));
    r.echo.set("max_output_tokens", r.params.max_tokens ? json::Value(*r.params.max_tokens) : json::Value());
    const json::Value* metadata = f.object("metadata");
    r.echo.set("metadata", metadata ? *metadata : json::Value(json::Object{}));
    r.echo.set("parallel_tool_calls", f.boolean("parallel_tool_calls").value_or(true));
    f.ignore({"user", "service_tier", "prompt_cache_key", "safety_identifier", "max_tool_calls",
              "stream_options"});
    f.finish();
    return r;
}

class ResponsesJob : public GenerationJob {
public:
    // primed: the prompt's tail that starts the assistant's turn (a forced call's header).
    ResponsesJob(ServerContext& ctx, std::shared_ptr<engine::RequestStream> stream, ResponsesRequest r,
                 std::span<const int32_t> primed)
        : GenerationJob(ctx, {std::move(stream)}, 1, r.params.stream),
          r_(std::move(r)),
          id_(response_id(ctx, "resp_", r_.params.request_id)),
          created_(unix_time()),
          output_(ctx.tokenizer, [&] {
              ChatOutputOptions o;
              for (const auto& t : r_.spec.tools) o.tool_names.push_back(t.name);
              o.tools_enabled = r_.tools_enabled;
              return o;
          }()) {
        output_.prime(primed);
        stream_error_type_ = "error";
    }

    const std::string& id() const { return id_; }

    void start(std::function<void()> wake) override {
        if (streaming_) {
            initial_ = event("response.created", "response", response_object("in_progress"));
            initial_ += event("response.in_progress", "response", response_object("in_progress"));
        }
        GenerationJob::start(std::move(wake));
    }

private:
    enum class ItemKind { none, reasoning, message };

    std::string event(const char* type, const char* key, json::Value value) {
        json::Value v;
        v.set("type", type);
        v.set("sequence_number", sequence_++);
        v.set(key, std::move(value));
        return http::sse_event(v.dump(), type);
    }
    std::string event(const char* type, json::Value fields) {
        json::Value v;
        v.set("type", type);
        v.set("sequence_number", sequence_++);
        for (auto& [k, x] : fields.as_object()) v.set(k, x);
        return http::sse_event(v.dump(), type);
    }

    json::Value item_json(size_t i, const char* status) const {
        const Item& it = items_[i];
        json::Value v;
        if (it.kind == "reasoning") {
            v.set("type", "reasoning");
            v.set("id", it.id);
            v.set("summary", json::Array{});
            json::Value part;
            part.set("type", "reasoning_text");
            part.set("text", it.text);
            v.set("content", json::Array{part});
            v.set("status", status);
        } else if (it.kind == "message") {
            v.set("type", "message");
            v.set("id", it.id);
            v.set("role", "assistant");
            v.set("status", status);
            json::Value part;
            part.set("type", "output_text");
            part.set("text", it.text);
            part.set("annotations", json::Array{});
            part.set("logprobs", it.logprobs);
            v.set("content", json::Array{part});
        } else {
            v.set("type", "function_call");
            v.set("id", it.id);
            v.set("call_id", it.call_id);
            v.set("name", it.name);
            v.set("arguments", it.text);
            v.set("status", status);
        }
        return v;
    }

    json::Value response_object(const std::string& status) const {
        json::Value v;
        v.set("id", id_);
        v.set("object", "response");
        v.set("created_at", created_);
        v.set("status", status);
        v.set("model", ctx_.options.model_name);
        json::Array output;
        if (status != "in_progress")
            for (size_t i = 0; i < items_.size(); ++i) output.push_back(item_json(i, final_status(items_[i])));
        v.set("output", std::move(output));
        v.set("error", error_.empty() ? json::Value() : error_body(error_, "server_error", "", "").at("error"));
        if (status == "incomplete") {
            json::Value d;
            d.set("reason", "max_output_tokens");
            v.set("incomplete_details", d);
        } else {
            v.set("incomplete_details", json::Value());
        }
        v.set("previous_response_id", r_.previous_response_id ? json::Value(*r_.previous_response_id) : json::Value());
        for (const auto& [k, x] : r_.echo.as_object()) v.set(k, x);
        v.set("store", r_.store);
        json::Value format;
        format.set("type", "text");
        json::Value text;
        text.set("format", r_.format_echo.is_null() ? format : r_.format_echo);
        v.set("text", text);
        v.set("truncation", "disabled");
        v.set("user", json::Value());
        if (status == "in_progress") {
            v.set("usage", json::Value());
        } else {
            json::Value u;
            u.set("input_tokens", prompt_tokens_);
            json::Value id;
            id.set("cached_tokens", cached_tokens_);
            u.set("input_tokens_details", id);
            u.set("output_tokens", completion_tokens_);
            json::Value od;
            od.set("reasoning_tokens", output_.n_reasoning_tokens());
            u.set("output_tokens_details", od);
            u.set("total_tokens", prompt_tokens_ + completion_tokens_);
            v.set("usage", u);
        }
        return v;
    }

    // Opens an item of `kind` (closing the open one) and returns its index; a function_call item gets
    // its name and call id before it is announced.
    size_t open_item(const std::string& kind, Progress& p, const std::string& name = "",
                     const std::string& call_id = "") {
        if (open_ >= 0 && items_[size_t(open_)].kind == kind && kind != "function_call") return size_t(open_);
        close_item(p);
        Item it;
        it.kind = kind;
        it.name = name;
        it.call_id = call_id;
        it.id = (kind == "reasoning" ? "rs_" : kind == "message" ? "msg_" : "fc_") + ctx_.new_id("");
        items_.push_back(it);
        open_ = int(items_.size() - 1);
        if (streaming_) {
            json::Value f;
            f.set("output_index", open_);
            f.set("item", item_json(size_t(open_), "in_progress"));
            p.body += event("response.output_item.added", f);
            if (kind == "message") {
                json::Value c;
                c.set("item_id", items_.back().id);
                c.set("output_index", open_);
                c.set("content_index", 0);
                json::Value part;
                part.set("type", "output_text");
                part.set("text", "");
                part.set("annotations", json::Array{});
                c.set("part", part);
                p.body += event("response.content_part.added", c);
            }
        }
        return size_t(open_);
    }

    void close_item(Progress& p) {
        if (open_ < 0) return;
        const size_t i = size_t(open_);
        open_ = -1;
        if (!streaming_) return;
        const Item& it = items_[i];
        json::Value base;
        base.set("item_id", it.id);
        base.set("output_index", int(i));
        if (it.kind == "reasoning") {
            json::Value f = base;
            f.set("content_index", 0);
            f.set("text", it.text);
            p.body += event("response.reasoning_text.done", f);
        } else if (it.kind == "message") {
            json::Value f = base;
            f.set("content_index", 0);
            f.set("text", it.text);
            f.set("logprobs", it.logprobs);
            p.body += event("response.output_text.done", f);
            json::Value c = base;
            c.set("content_index", 0);
            json::Value part;
            part.set("type", "output_text");
            part.set("text", it.text);
            part.set("annotations", json::Array{});
            c.set("part", part);
            p.body += event("response.content_part.done", c);
        } else if (it.complete) {
            json::Value f = base;
            f.set("name", it.name);
            f.set("arguments", it.text);
            p.body += event("response.function_call_arguments.done", f);
        }
        json::Value d;
        d.set("output_index", int(i));
        d.set("item", item_json(i, final_status(it)));
        p.body += event("response.output_item.done", d);
    }

    // Appends text to the open reasoning or message item (opening it) and streams the delta.
    // `logprobs`: of the tokens that produced a message delta (the tokens of Harmony's headers and of
    // the reasoning have none in the output).
    void append_text(const char* kind, const char* event_type, const std::string& text, Progress& p,
                     json::Array logprobs = {}) {
        if (text.empty()) return;
        const size_t i = open_item(kind, p);
        items_[i].text += text;
        for (const auto& lp : logprobs) items_[i].logprobs.push_back(lp);
        if (!streaming_) return;
        json::Value f;
        f.set("item_id", items_[i].id);
        f.set("output_index", int(i));
        f.set("content_index", 0);
        f.set("delta", text);
        if (std::string_view(kind) == "message") f.set("logprobs", std::move(logprobs));
        p.body += event(event_type, f);
    }

    void apply(const ChatDelta& d, Progress& p, json::Array logprobs = {}) {
        append_text("reasoning", "response.reasoning_text.delta", d.reasoning, p);
        append_text("message", "response.output_text.delta", d.content, p, std::move(logprobs));
        // Streaming: a call is announced by its first piece and its arguments follow as deltas; it
        // completes (or is closed incomplete) later. Not streaming: only complete calls become items.
        if (streaming_) {
            for (const ToolCallDelta& piece : d.call_deltas) {
                if (!piece.id.empty()) {
                    open_item("function_call", p, piece.name, piece.id);
                }
                if (piece.arguments.empty() || open_ < 0 || items_[size_t(open_)].kind != "function_call") continue;
                Item& it = items_[size_t(open_)];
                it.text += piece.arguments;
                json::Value f;
                f.set("item_id", it.id);
                f.set("output_index", open_);
                f.set("delta", piece.arguments);
                p.body += event("response.function_call_arguments.delta", f);
            }
        }
        for (const ToolCall& call : d.tool_calls) {
            const bool streamed =
                open_ >= 0 && items_[size_t(open_)].kind == "function_call" && items_[size_t(open_)].call_id == call.id;
            const size_t i = streamed ? size_t(open_) : open_item("function_call", p, call.name, call.id);
            items_[i].text = call.arguments;  // equal to the streamed pieces (frontend/chat_output.h)
            items_[i].complete = true;
            close_item(p);
        }
    }

    Progress poll() override {
        Progress p = GenerationJob::poll();
        if (!initial_.empty()) {
            p.body = initial_ + p.body;
            initial_.clear();
        }
        return p;
    }

    void on_token(int, const engine::Event& e, Progress& p) override {
        ChatDelta d = output_.push(e.token);
        json::Array logprobs;
        if (r_.params.sampling.logprobs && !d.content.empty()) {
            json::Value lp = token_logprob_json(ctx_.tokenizer, e);
            // The responses API's top_logprobs entries are {token, logprob, bytes}.
            logprobs.push_back(std::move(lp));
        }
        apply(d, p, std::move(logprobs));
    }

    void on_finish(int, const engine::Event& e, Progress& p) override {
        apply(output_.finish(e.stop_token), p);
        // Cut by max_output_tokens: the item being written is incomplete too, not only the response.
        if (e.reason == engine::FinishReason::length && open_ >= 0) items_[size_t(open_)].cut = true;
        close_item(p);
        reason_ = e.reason;
        if (e.reason == engine::FinishReason::error) {
            log::error("response ", id_, " failed: ", e.error);
            error_ = "generation failed: " + e.error;
        }
        last_finish_reason_ = output_.finish_reason(e.reason);
    }

    void on_done(Progress& p) override {
        const std::string status = !error_.empty()                         ? "failed"
                                   : reason_ == engine::FinishReason::length ? "incomplete"
                                   : reason_ == engine::FinishReason::abort  ? "cancelled"
                                                                              : "completed";
        json::Value response = response_object(status);
        if (r_.store && error_.empty()) {
            StoredResponse stored;
            stored.response = response;
            stored.conversation.messages = r_.spec.turns;
            stored.input_items = r_.input_items;
            for (const Message& m : output_.messages()) stored.conversation.messages.push_back(m);
            ctx_.responses.put(id_, std::move(stored));
        }
        if (streaming_) {
            const char* type = status == "failed" ? "response.failed" : status == "incomplete" ? "response.incomplete"
                                                                                             : "response.completed";
            p.body += event(type, "response", response);
            return;
        }
        if (!error_.empty()) {
            p.response = error_response(ApiError(500, error_));
            return;
        }
        p.response = http::HttpResponse::json(200, response.dump());
    }

    struct Item {
        std::string kind;  // "reasoning", "message", "function_call"
        std::string id, text, name, call_id;
        // function_call items only: the arguments parsed as JSON when the call message ended; a
        // streamed call whose arguments never did is closed as "incomplete" (its text then follows
        // as a message, as in the chat API).
        bool complete = false;
        bool cut = false;         // open when max_output_tokens ended the response
        json::Array logprobs;     // message items: of its tokens, when asked for
    };
    const char* final_status(const Item& it) const {
        return it.cut || (it.kind == "function_call" && !it.complete) ? "incomplete" : "completed";
    }

    ResponsesRequest r_;
    const std::string id_;
    const int64_t created_;
    ChatOutput output_;
    std::vector<Item> items_;
    int open_ = -1;
    int sequence_ = 0;
    std::string initial_;
    std::string error_;
    engine::FinishReason reason_ = engine::FinishReason::stop;
};

}  // namespace

http::Reply handle_responses(ServerContext& ctx, const json::Value& body, RequestInfo& info) {
    ResponsesRequest r = parse_responses_request(ctx, body);
    if (!info.request_id.empty()) r.params.request_id = info.request_id;  // the header wins, as in vLLM
    const Conversation conversation = frontend::build_conversation(r.spec);
    frontend::HarmonyConstraintSpec cs{.final_format = r.format, .tools = r.spec.tools, .forced = r.forced};
    const auto constraint = frontend::make_harmony_constraint(ctx.target().tokenizer, cs);
    frontend::Submitted s = frontend::submit_rendered(ctx.target(), {.id = "response",
                                                                     .conversation = conversation,
                                                                     .forced = r.forced,
                                                                     .params = r.params,
                                                                     .api = Api::responses,
                                                                     .prompt_param = "input",
                                                                     .constraint = constraint});
    const std::string request_id = r.params.request_id;
    auto job = std::make_unique<ResponsesJob>(ctx, std::move(s.stream), std::move(r), s.primed);
    info.request_id = request_id.empty() ? job->id() : request_id;
    return http::Reply(std::move(job));
}

http::HttpResponse get_response_input_items(ServerContext& ctx, const std::string& id, const std::string& query) {
    auto r = ctx.responses.get(id);
    if (!r) throw ApiError(404, "no stored response '" + id.substr(0, 80) + "'", "response_id", "not_found");
    // Query: limit (1..100, default 20), order (asc | desc, default desc), after (an item id).
    int limit = 20;
    bool ascending = false;
    std::string after;
    size_t at = 0;
    while (at < query.size()) {
        size_t end = query.find('&', at);
        if (end == std::string::npos) end = query.size();
        const std::string pair = query.substr(at, end - at);
        at = end + 1;
        const size_t eq = pair.find('=');
        const std::string key = pair.substr(0, eq), value = eq == std::string::npos ? "" : pair.substr(eq + 1);
        if (key == "limit") {
            char* stop = nullptr;
            const long v = std::strtol(value.c_str(), &stop, 10);
            if (value.empty() || *stop || v < 1 || v > 100) bad_param("limit", "must be an integer in [1, 100]");
            limit = int(v);
        } else if (key == "order") {
            if (value != "asc" && value != "desc") bad_param("order", "must be 'asc' or 'desc'");
            ascending = value == "asc";
        } else if (key == "after") {
            after = value;
        } else if (key == "include" || key == "include[]" || key.empty()) {
            // accepted (the items are returned whole)
        } else {
            bad_param(key.substr(0, 40), "unknown query parameter");
        }
    }
    json::Array items = r->input_items;
    if (!ascending) std::reverse(items.begin(), items.end());
    size_t first = 0;
    if (!after.empty()) {
        while (first < items.size() && items[first].at("id").as_string() != after) ++first;
        if (first == items.size()) bad_param("after", "no input item '" + after.substr(0, 80) + "'");
        ++first;
    }
    json::Array page;
    for (size_t i = first; i < items.size() && int(page.size()) < limit; ++i) page.push_back(items[i]);
    json::Value v;
    v.set("object", "list");
    v.set("first_id", page.empty() ? json::Value() : page.front().at("id"));
    v.set("last_id", page.empty() ? json::Value() : page.back().at("id"));
    v.set("has_more", first + page.size() < items.size());
    v.set("data", std::move(page));
    return http::HttpResponse::json(200, v.dump());
}

http::HttpResponse get_stored_response(ServerContext& ctx, const std::string& id) {
    auto r = ctx.responses.get(id);
    if (!r) throw ApiError(404, "no stored response '" + id.substr(0, 80) + "'", "response_id", "not_found");
    return http::HttpResponse::json(200, r->response.dump());
}

http::HttpResponse delete_stored_response(ServerContext& ctx, const std::string& id) {
    if (!ctx.responses.erase(id)) throw ApiError(404, "no stored response '" + id.substr(0, 80) + "'", "response_id", "not_found");
    json::Value v;
    v.set("id", id);
    v.set("object", "response.deleted");
    v.set("deleted", true);
    return http::HttpResponse::json(200, v.dump());
}

}  // namespace osprey::server
