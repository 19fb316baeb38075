// The asynchronous side of a generation request: drains the engine's RequestStreams on the event
// loop (woken by the engine thread through the stream callback), hands each token and finish to the
// API-specific formatter (chat, completions, responses), records latency metrics, and cancels the
// engine request when the client disconnects or every sample has stopped on a stop string.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/request_stream.h"
#include "http/server.h"
#include "server/server_context.h"

namespace osprey::server {

class GenerationJob : public http::AsyncJob {
public:
    // `streams`: one per prompt; choice index = prompt index * n_samples + sample.
    GenerationJob(ServerContext& ctx, std::vector<std::shared_ptr<engine::RequestStream>> streams, int n_samples,
                  bool streaming);
    ~GenerationJob() override;

    bool streaming() const override { return streaming_; }
    void start(std::function<void()> wake) override;
    Progress poll() override;
    void cancel() override;
    // The client does not read: the engine stops generating for this request (engine::RequestStream).
    void set_paused(bool paused) override;
    // Shutdown: the engine request is cancelled; a stream ends with an error event (code
    // "server_shutdown") and "data: [DONE]", a non-streaming request gets a 503.
    Progress abort(const std::string& reason) override;

protected:
    // Formatter hooks, all on the event loop thread. Streaming ones append SSE bytes to p.body.
    virtual void on_token(int choice, const engine::Event& e, Progress& p) = 0;
    virtual void on_finish(int choice, const engine::Event& e, Progress& p) = 0;
    virtual void on_done(Progress& p) = 0;  // every choice finished: write the end (or the response)

    // The formatter ended this choice early (stop string): later tokens are not delivered, and the
    // engine request is cancelled once every choice of its prompt has ended.
    void end_choice(int choice);
    bool choice_ended(int choice) const { return ended_[size_t(choice)]; }
    int n_choices() const { return int(ended_.size()); }
    static std::string sse(const json::Value& data);  // one server-sent event: "data: {...}\n\n"

    ServerContext& ctx_;
    const int n_samples_;
    const bool streaming_;
    const std::chrono::steady_clock::time_point arrival_;
    // Totals over every prompt (each prompt's usage counted once).
    int prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0;
    std::string last_finish_reason_ = "stop";  // for the metrics
    const char* stream_error_type_ = nullptr;   // SSE event name of a streamed error (responses: "error")

private:
    std::vector<std::shared_ptr<engine::RequestStream>> streams_;
    std::vector<bool> ended_;                                        // [n_choices]
    std::vector<std::chrono::steady_clock::time_point> last_token_;  // [n_choices]
    // Tokens handed to on_token per choice: a choice the job ended itself (a stop string) counts
    // these in its usage, not what the engine generated before the cancellation reached it.
    std::vector<int> delivered_;                                     // [n_choices]
    std::vector<bool> prompt_counted_;                               // [n_prompts]
    bool first_token_seen_ = false;
    bool done_ = false;
};

}  // namespace osprey::server
