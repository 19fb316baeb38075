// The envelope and the end shared by chat/completions and completions (see choices_job.h).
#include "server/choices_job.h"

#include "http/sse.h"
#include "server/api_error.h"
#include "server/routes.h"

namespace osprey::server {

ChoicesJob::ChoicesJob(ServerContext& ctx, std::vector<std::shared_ptr<engine::RequestStream>> streams,
                       int n_samples, bool streaming, bool include_usage, const char* id_prefix, const char* object,
                       const char* chunk_object, const std::string& request_id)
    : GenerationJob(ctx, std::move(streams), n_samples, streaming),
      id_(response_id(ctx, id_prefix, request_id)),
      created_(unix_time()),
      include_usage_(include_usage),
      object_(object),
      chunk_object_(chunk_object) {}

json::Value ChoicesJob::head(const char* object) const {
    json::Value v;
    v.set("id", id_);
    v.set("object", object);
    v.set("created", created_);
    v.set("model", ctx_.options.model_name);
    return v;
}

json::Value ChoicesJob::chunk_envelope(json::Value choice, bool usage_null) const {
    json::Value v = head(chunk_object_);
    v.set("system_fingerprint", json::Value());
    v.set("choices", json::Array{std::move(choice)});
    if (usage_null) v.set("usage", json::Value());
    return v;
}

void ChoicesJob::on_done(Progress& p) {
    const json::Value usage = usage_json(prompt_tokens_, completion_tokens_, cached_tokens_, reasoning_tokens());
    if (streaming_) {
        if (include_usage_) {
            json::Value v = head(chunk_object_);
            v.set("choices", json::Array{});
            v.set("usage", usage);
            p.body += sse(v);
        }
        p.body += http::sse_event("[DONE]");
        return;
    }
    if (!error_.empty()) {
        p.response = error_response(ApiError(500, "generation failed: " + error_));
        return;
    }
    json::Value v = head(object_);
    v.set("system_fingerprint", json::Value());
    v.set("choices", final_choices());
    v.set("usage", usage);
    p.response = http::HttpResponse::json(200, v.dump());
}

}  // namespace osprey::server
