// POST /v1/completions: a raw prompt (text or token ids, one or a batch) continued as plain text,
// no Harmony parsing. Stops at the model's end-of-text tokens (<|return|>, <|call|>, <|endoftext|>)
// unless "ignore_eos" (a vLLM extension) is set.
#include "core/log.h"
#include "frontend/stop_strings.h"
#include "frontend/submit.h"
#include "server/api_error.h"
#include "server/choices_job.h"
#include "server/format_fields.h"
#include "server/generation_fields.h"
#include "server/json_fields.h"
#include "server/routes.h"

namespace osprey::server {

using frontend::Api;
using frontend::GenerationParams;
using frontend::StopStrings;

namespace {

struct Prompt {
    std::vector<int32_t> ids;
    std::string text;  // for echo
};

std::vector<int32_t> token_array(const json::Value& v, const std::string& path, int vocab_size) {
    std::vector<int32_t> ids = token_id_array(v, path, vocab_size);
    if (ids.empty()) bad_param(path, "must not be empty");
    return ids;
}

std::vector<Prompt> parse_prompts(const json::Value* prompt, const ServerContext& ctx) {
    if (!prompt) bad_param("prompt", "required", "missing_required_parameter");
    const int vocab = ctx.limits.vocab_size;
    std::vector<Prompt> out;
    auto text_prompt = [&](const std::string& text, const std::string& path) {
        if (text.empty()) bad_param(path, "must not be empty");
        Prompt p;
        p.text = text;
        p.ids = ctx.tokenizer.encode(text);
        out.push_back(std::move(p));
    };
    if (prompt->is_string()) {
        text_prompt(prompt->as_string(), "prompt");
    } else if (prompt->is_array()) {
        if (prompt->size() == 0) bad_param("prompt", "must not be empty");
        const json::Value& first = prompt->as_array()[0];
        if (first.is_integer()) {
            Prompt p;
            p.ids = token_array(*prompt, "prompt", vocab);
            out.push_back(std::move(p));
        } else {
            if (prompt->size() > 64) bad_param("prompt", "at most 64 prompts per request");
            for (size_t i = 0; i < prompt->size(); ++i) {
                const json::Value& item = prompt->as_array()[i];
                const std::string path = str("prompt[", i, "]");
                if (item.is_string()) {
                    text_prompt(item.as_string(), path);
                } else if (item.is_array()) {
                    Prompt p;
                    p.ids = token_array(item, path, vocab);
                    out.push_back(std::move(p));
                } else {
                    wrong_type(path, "a string or an array of token ids", item);
                }
            }
        }
    } else {
        wrong_type("prompt", "a string, an array of strings, or an array of token ids", *prompt);
    }
    return out;
}

// Characters (code points) of UTF-8 text: OpenAI's text_offset counts characters, not bytes.
int64_t n_chars(std::string_view text) {
    int64_t n = 0;
    for (unsigned char ch : text) n += (ch & 0xC0) != 0x80;
    return n;
}

class CompletionJob : public ChoicesJob {
public:
    CompletionJob(ServerContext& ctx, std::vector<std::shared_ptr<engine::RequestStream>> streams,
                  const GenerationParams& params, std::vector<Prompt> prompts)
        : ChoicesJob(ctx, std::move(streams), params.n, params.stream, params.include_usage, "cmpl-",
                     "text_completion", "text_completion", params.request_id),
          logprobs_(params.sampling.logprobs),
          echo_(params.echo),
          skip_special_(params.skip_special_tokens),
          prompt_logprobs_(params.prompt_logprobs),
          prompts_(std::move(prompts)) {
        for (size_t i = 0; i < prompts_.size(); ++i) {
            for (int s = 0; s < params.n; ++s) {
                Choice c(ctx.tokenizer, StopStrings(params.stop, params.include_stop_str_in_output));
                if (params.echo) {
                    c.text = prompts_[i].text.empty() ? ctx.tokenizer.decode_bytes(prompts_[i].ids) : prompts_[i].text;
                    c.pending_echo = c.text;
                    // Echoed prompt tokens come first in the logprobs (filled when their scores arrive).
                    if (!logprobs_) c.chars = n_chars(c.text);
                }
                choices_.push_back(std::move(c));
            }
        }
    }

private:
    struct Choice {
        Choice(const tok::Tokenizer& t, StopStrings s) : decoder(t), stops(std::move(s)) {}
        tok::StreamDecoder decoder;
        StopStrings stops;
        std::string text;
        std::string pending_echo;  // streaming: echo goes out with the first chunk
        json::Value logprobs;      // {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
        std::string finish_reason;
        int64_t chars = 0;              // characters of text so far (text_offset of the next token)
        json::Value prompt_logprobs;    // vLLM's "prompt_logprobs" (null until they arrive)
        bool prompt_scored = false;
        bool prompt_sent = false;  // streaming: prompt_logprobs went out with the first chunk
    };

    json::Value chunk(int index, const std::string& text, const json::Value& finish_reason, json::Value logprobs,
                      const json::Value* prompt_logprobs = nullptr) const {
        json::Value c;
        c.set("index", index);
        c.set("text", text);
        c.set("logprobs", std::move(logprobs));
        c.set("finish_reason", finish_reason);
        if (prompt_logprobs) c.set("prompt_logprobs", *prompt_logprobs);
        return chunk_envelope(std::move(c), false);
    }

    void ensure_logprobs(Choice& c) {
        if (!c.logprobs.is_null()) return;
        c.logprobs.set("tokens", json::Array{});
        c.logprobs.set("token_logprobs", json::Array{});
        c.logprobs.set("top_logprobs", json::Array{});
        c.logprobs.set("text_offset", json::Array{});
    }

    void push_logprob(Choice& c, json::Value token, json::Value logprob, json::Value top, int64_t offset) {
        ensure_logprobs(c);
        json::Object& o = c.logprobs.as_object();
        o[0].second.push_back(std::move(token));
        o[1].second.push_back(std::move(logprob));
        o[2].second.push_back(std::move(top));
        o[3].second.push_back(offset);
    }

    void add_logprob(Choice& c, const engine::Event& e) {
        if (!logprobs_) return;
        const json::Value lp = token_logprob_json(ctx_.tokenizer, e);
        json::Value top = json::Value(json::Object{});
        for (const auto& t : lp.at("top_logprobs").as_array()) top.set(t.at("token").as_string(), t.at("logprob"));
        push_logprob(c, lp.at("token"), lp.at("logprob"), std::move(top), c.chars);
    }

    std::string piece(int32_t id) const {
        try {
            return ctx_.tokenizer.token_bytes(id);
        } catch (const std::exception&) {
            return {};
        }
    }

    // The prompt's scores arrived (Event::prompt_logprobs): echo's prompt entries in the logprobs
    // (the first token has none: null), and vLLM's prompt_logprobs, for every choice of the prompt.
    void on_prompt_scores(size_t prompt, const std::vector<TokenScore>& scores) {
        const std::vector<int32_t>& ids = prompts_[prompt].ids;
        for (int s = 0; s < n_samples_; ++s) {
            Choice& c = choices_[prompt * size_t(n_samples_) + size_t(s)];
            if (c.prompt_scored) continue;
            c.prompt_scored = true;
            json::Array vllm{json::Value()};
            int64_t offset = 0;
            for (size_t t = 0; t < ids.size(); ++t) {
                const std::string text = piece(ids[t]);
                const TokenScore* score = t > 0 && t - 1 < scores.size() ? &scores[t - 1] : nullptr;
                if (echo_ && logprobs_) {
                    json::Value top;
                    if (score) {
                        top = json::Value(json::Object{});
                        for (const auto& [id, lp] : score->top) top.set(piece(id), double(lp));
                    }
                    push_logprob(c, text, score ? json::Value(double(score->logprob)) : json::Value(), std::move(top),
                                 offset);
                }
                offset += n_chars(text);
                if (t == 0) continue;
                json::Value entry = json::Value(json::Object{});
                auto add = [&](int32_t id, float lp, int rank) {
                    json::Value v;
                    v.set("logprob", double(lp));
                    v.set("rank", rank);
                    v.set("decoded_token", piece(id));
                    entry.set(std::to_string(id), std::move(v));
                };
                if (score) {
                    add(ids[t], score->logprob, score->rank);
                    for (size_t k = 0; k < score->top.size(); ++k)
                        if (score->top[k].first != ids[t]) add(score->top[k].first, score->top[k].second, int(k) + 1);
                }
                vllm.push_back(std::move(entry));
            }
            if (echo_ && logprobs_) c.chars = n_chars(c.text);
            if (prompt_logprobs_requested_) c.prompt_logprobs = json::Value(std::move(vllm));
        }
    }

    void send(int choice, std::string text, const json::Value& finish_reason, Progress& p) {
        Choice& c = choices_[size_t(choice)];
        const bool first = !c.pending_echo.empty() || (prompt_logprobs_requested_ && !c.prompt_sent);
        if (!c.pending_echo.empty()) {
            text = c.pending_echo + text;
            c.pending_echo.clear();
        }
        json::Value lp = std::move(c.logprobs);
        c.logprobs = json::Value();
        if (text.empty() && lp.is_null() && finish_reason.is_null() && !first) return;
        const bool with_prompt = prompt_logprobs_requested_ && !c.prompt_sent;
        c.prompt_sent = c.prompt_sent || with_prompt;
        p.body += sse(chunk(choice, text, finish_reason, std::move(lp), with_prompt ? &c.prompt_logprobs : nullptr));
    }

    void take_scores(int choice, const engine::Event& e) {
        if (prompt_logprobs_ >= 0 && e.sample == 0)
            on_prompt_scores(size_t(choice) / size_t(n_samples_), e.prompt_logprobs);
    }

    void on_token(int choice, const engine::Event& e, Progress& p) override {
        take_scores(choice, e);
        Choice& c = choices_[size_t(choice)];
        const bool hidden = skip_special_ && ctx_.tokenizer.is_special(e.token);
        const std::string text = hidden ? std::string() : c.stops.push(c.decoder.push(e.token));
        add_logprob(c, e);
        c.text += text;
        c.chars += n_chars(text);
        if (streaming_) send(choice, text, json::Value(), p);
        if (c.stops.matched()) end_choice(choice);
    }

    void on_finish(int choice, const engine::Event& e, Progress& p) override {
        take_scores(choice, e);
        Choice& c = choices_[size_t(choice)];
        std::string tail;
        if (!c.stops.matched()) tail = c.stops.push(c.decoder.flush()) + c.stops.flush();
        c.text += tail;
        if (c.stops.matched()) {
            c.finish_reason = "stop";
        } else if (e.reason == engine::FinishReason::error) {
            log::error("completion ", id_, " failed: ", e.error);
            error_ = e.error;
            c.finish_reason = "error";
        } else {
            c.finish_reason = engine::finish_reason_name(e.reason);
        }
        last_finish_reason_ = c.finish_reason;
        if (streaming_) {
            if (!error_.empty()) {
                p.body += sse(error_body("generation failed: " + error_, "server_error", "", ""));
                return;
            }
            send(choice, tail, c.finish_reason, p);
        }
    }

    json::Array final_choices() override {
        json::Array choices;
        for (size_t i = 0; i < choices_.size(); ++i) {
            json::Value c;
            c.set("index", int(i));
            c.set("text", choices_[i].text);
            c.set("logprobs", choices_[i].logprobs);
            c.set("finish_reason", choices_[i].finish_reason);
            if (prompt_logprobs_requested_) c.set("prompt_logprobs", choices_[i].prompt_logprobs);
            choices.push_back(std::move(c));
        }
        return choices;
    }

    const bool logprobs_;
    const bool echo_;
    const bool skip_special_;
    const int prompt_logprobs_;  // -1: the prompt is not scored
    std::vector<Prompt> prompts_;
    std::vector<Choice> choices_;

public:
    bool prompt_logprobs_requested_ = false;  // vLLM's prompt_logprobs field was given
};

}  // namespace

http::Reply handle_completions(ServerContext& ctx, const json::Value& body, RequestInfo& info) {
    Fields f(body, "");
    auto model = f.string("model");
    if (!model) bad_param("model", "required", "missing_required_parameter");
    std::vector<Prompt> prompts = parse_prompts(f.get("prompt"), ctx);
    const bool prompt_logprobs_field = body.find("prompt_logprobs") && !body.at("prompt_logprobs").is_null();
    GenerationParams params = parse_generation_params(f, Api::completions, ctx.limits);
    if (!info.request_id.empty()) params.request_id = info.request_id;  // the header wins, as in vLLM
    const bool ignore_eos = f.boolean("ignore_eos").value_or(false);
    if (auto best_of = f.integer("best_of", 1, ctx.limits.max_n); best_of && *best_of != params.n)
        bad_param("best_of", "only best_of == n is supported");
    if (auto suffix = f.string("suffix"); suffix && !suffix->empty()) bad_param("suffix", "is not supported by this model");
    if (params.prompt_logprobs >= 0 && !ctx.engine.runner().supports_prompt_scoring())
        bad_param(prompt_logprobs_field ? "prompt_logprobs" : "echo",
                  "prompt scoring is not available on this backend (" + ctx.engine.runner().name() + ")");
    const frontend::OutputFormat format = parse_output_format(f);
    f.ignore({"user", "metadata", "service_tier"});
    f.finish();
    check_model(ctx, *model);
    // Structured output on raw text: constrained from the first token, ended by the end tokens (the
    // usual ones, also when ignore_eos: a finished constraint has nothing else to write).
    const int eos = ctx.engine.runner().config().eos_token_id;
    std::vector<int32_t> end_tokens = {200002, 200012, 199999};
    if (eos != 200002 && eos != 200012 && eos != 199999) end_tokens.push_back(eos);
    const auto constraint = frontend::make_raw_constraint(ctx.target().tokenizer, format, end_tokens);

    std::vector<std::shared_ptr<engine::RequestStream>> streams;
    try {
        for (size_t i = 0; i < prompts.size(); ++i) {
            engine::Request request;
            request.id = "completion";
            request.max_new_tokens = frontend::resolve_max_tokens(
                params, Api::completions, int(prompts[i].ids.size()), ctx.max_model_len,
                prompts.size() > 1 ? str("prompt[", i, "]") : "prompt", ctx.options.default_max_tokens);
            request.prompt = prompts[i].ids;
            if (!ignore_eos || constraint) request.stop_token_ids = end_tokens;
            request.constraint = constraint;
            frontend::apply_to_request(params, request);
            streams.push_back(frontend::submit(ctx.engine, std::move(request)));
        }
    } catch (...) {
        for (auto& s : streams) s->cancel();
        throw;
    }
    auto job = std::make_unique<CompletionJob>(ctx, std::move(streams), params, std::move(prompts));
    job->prompt_logprobs_requested_ = prompt_logprobs_field;
    info.request_id = params.request_id.empty() ? job->id() : params.request_id;
    return http::Reply(std::move(job));
}

}  // namespace osprey::server
