// Engine streams -> formatter hooks (see generation_job.h).
#include "server/generation_job.h"

#include <random>

#include "http/sse.h"
#include "server/api_error.h"

namespace osprey::server {

using Clock = std::chrono::steady_clock;

int64_t unix_time() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string ServerContext::new_id(const char* prefix) {
    static thread_local std::mt19937_64 rng(std::random_device{}());
    char buf[40];
    std::snprintf(buf, sizeof buf, "%016llx%08llx", static_cast<unsigned long long>(rng()),
                  static_cast<unsigned long long>(next_request.fetch_add(1)));
    return std::string(prefix) + buf;
}

GenerationJob::GenerationJob(ServerContext& ctx, std::vector<std::shared_ptr<engine::RequestStream>> streams,
                             int n_samples, bool streaming)
    : ctx_(ctx),
      n_samples_(n_samples),
      streaming_(streaming),
      arrival_(Clock::now()),
      streams_(std::move(streams)),
      ended_(streams_.size() * size_t(n_samples), false),
      last_token_(ended_.size()),
      delivered_(ended_.size(), 0),
      prompt_counted_(streams_.size(), false) {}

GenerationJob::~GenerationJob() {
    if (!done_) {  // the client went away first
        cancel();
        ctx_.metrics.request_finished("abort", prompt_tokens_, completion_tokens_, cached_tokens_,
                                      std::chrono::duration<double>(Clock::now() - arrival_).count());
    }
    for (auto& s : streams_) s->set_callback({});
}

void GenerationJob::start(std::function<void()> wake) {
    for (auto& s : streams_) s->set_callback(wake);
    wake();  // events pushed before the callback was set
}

void GenerationJob::cancel() {
    for (auto& s : streams_) s->cancel();
}

http::AsyncJob::Progress GenerationJob::abort(const std::string& reason) {
    cancel();
    Progress p;
    p.done = true;
    const std::string message = reason + "; the request was cut off";
    if (streaming_) {
        json::Value body = error_body(message, "server_error", "", "server_shutdown");
        if (stream_error_type_) {  // the responses API's "error" event: its fields at the top too
            body.set("type", stream_error_type_);
            body.set("code", "server_shutdown");
            body.set("message", message);
            body.set("param", json::Value());
        }
        p.body = http::sse_event(body.dump(), stream_error_type_ ? stream_error_type_ : "");
        p.body += http::sse_event("[DONE]");
    } else {
        p.response = error_response(ApiError(503, message, "", "server_shutdown"));
    }
    return p;
}

void GenerationJob::set_paused(bool paused) {
    for (auto& s : streams_) s->set_paused(paused);
}

void GenerationJob::end_choice(int choice) {
    ended_[size_t(choice)] = true;
    const size_t prompt = size_t(choice) / size_t(n_samples_);
    for (int s = 0; s < n_samples_; ++s)
        if (!ended_[prompt * size_t(n_samples_) + size_t(s)]) return;
    streams_[prompt]->cancel();
}

std::string GenerationJob::sse(const json::Value& data) {
    return http::sse_event(data.dump());
}

http::AsyncJob::Progress GenerationJob::poll() {
    Progress p;
    if (done_) {
        p.done = true;
        return p;
    }
    // At most kEventsPerPoll events per call (the loop comes back for the rest: Progress::more), so
    // one busy request neither stalls the loop nor builds an unbounded chunk before backpressure
    // can act on it.
    constexpr int kEventsPerPoll = 64;  // ~1-5 ms of formatting with 20 top logprobs per token
    int n_events = 0;
    for (size_t i = 0; i < streams_.size(); ++i) {
        while (n_events < kEventsPerPoll) {
            auto e = streams_[i]->try_pop();
            if (!e) break;
            ++n_events;
            const int choice = int(i) * n_samples_ + e->sample;
            const auto now = Clock::now();
            if (e->kind == engine::Event::Kind::token) {
                if (!first_token_seen_) {
                    first_token_seen_ = true;
                    ctx_.metrics.first_token(std::chrono::duration<double>(now - arrival_).count());
                } else if (last_token_[size_t(choice)] != Clock::time_point{}) {
                    ctx_.metrics.inter_token(std::chrono::duration<double>(now - last_token_[size_t(choice)]).count());
                }
                last_token_[size_t(choice)] = now;
                if (!ended_[size_t(choice)]) {
                    ++delivered_[size_t(choice)];
                    on_token(choice, *e, p);
                }
            } else {
                if (!prompt_counted_[i]) {
                    prompt_counted_[i] = true;
                    prompt_tokens_ += e->usage.prompt_tokens;
                    cached_tokens_ += e->usage.cached_tokens;
                }
                // Ended early by the job (a stop string): the tokens up to the match, as vLLM counts.
                completion_tokens_ += ended_[size_t(choice)] ? delivered_[size_t(choice)] : e->usage.completion_tokens;
                on_finish(choice, *e, p);
                ended_[size_t(choice)] = true;
            }
        }
    }
    if (n_events == kEventsPerPoll) {
        p.more = true;
        return p;
    }
    bool all_done = true;
    for (auto& s : streams_) all_done = all_done && s->done();
    if (all_done) {
        on_done(p);
        done_ = true;
        p.done = true;
        ctx_.metrics.request_finished(last_finish_reason_, prompt_tokens_, completion_tokens_, cached_tokens_,
                                      std::chrono::duration<double>(Clock::now() - arrival_).count());
    }
    return p;
}

}  // namespace osprey::server
