// Stored /v1/responses objects (store: true): the response JSON for GET, and the whole Harmony
// conversation it ended with, so previous_response_id can continue it. Bounded (oldest dropped).
// Thread-safe.
#pragma once

#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "core/json.h"
#include "harmony/message.h"

namespace osprey::server {

struct StoredResponse {
    json::Value response;                // as returned to the client
    harmony::Conversation conversation;  // turns so far (without system/developer messages)
    std::vector<std::string> instructions;
    json::Array input_items;             // the request's input, as items with ids (GET .../input_items)
};

class ResponseStore {
public:
    explicit ResponseStore(size_t capacity) : capacity_(capacity) {}
    void put(const std::string& id, StoredResponse r);
    std::optional<StoredResponse> get(const std::string& id) const;
    bool erase(const std::string& id);
    size_t size() const;

private:
    size_t capacity_;
    mutable std::mutex mu_;
    std::map<std::string, StoredResponse> items_;
    std::deque<std::string> order_;  // insertion order, for eviction
};

}  // namespace osprey::server
