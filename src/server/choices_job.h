// The part chat/completions and completions share on top of GenerationJob: the object's id and
// creation time, the {"id", "object", "created", "model", ...} envelope of every chunk and body, and
// the end of the request (the stream_options.include_usage chunk then "data: [DONE]" when streaming;
// the 500 error or the whole body with "usage" otherwise). The API-specific formatter fills in the
// choices.
#pragma once

#include <string>
#include <vector>

#include "server/generation_job.h"

namespace osprey::server {

class ChoicesJob : public GenerationJob {
public:
    // `object`: the body's "object" ("chat.completion"); `chunk_object`: a streamed chunk's.
    ChoicesJob(ServerContext& ctx, std::vector<std::shared_ptr<engine::RequestStream>> streams, int n_samples,
               bool streaming, bool include_usage, const char* id_prefix, const char* object,
               const char* chunk_object, const std::string& request_id = "");

    const std::string& id() const { return id_; }

protected:
    // One streamed chunk: {"id", "object": chunk_object, "created", "model", "system_fingerprint",
    // "choices": [choice]}, plus "usage": null when `usage_null`.
    json::Value chunk_envelope(json::Value choice, bool usage_null) const;

    // The choices of the whole (non-streaming) body, in choice order; called once, from on_done.
    virtual json::Array final_choices() = 0;
    // "completion_tokens_details.reasoning_tokens" of the usage.
    virtual int reasoning_tokens() const { return 0; }

    void on_done(Progress& p) final;

    const std::string id_;
    const int64_t created_;
    const bool include_usage_;
    std::string error_;  // the engine's error, when generation failed

private:
    // {"id", "object", "created", "model"}: how every body and chunk starts.
    json::Value head(const char* object) const;

    const char* const object_;
    const char* const chunk_object_;
};

}  // namespace osprey::server
