// Stored responses (see response_store.h).
#include "server/response_store.h"

#include <algorithm>

namespace osprey::server {

void ResponseStore::put(const std::string& id, StoredResponse r) {
    std::lock_guard lock(mu_);
    if (items_.insert_or_assign(id, std::move(r)).second) order_.push_back(id);
    while (items_.size() > capacity_ && !order_.empty()) {
        items_.erase(order_.front());
        order_.pop_front();
    }
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id) const {
    std::lock_guard lock(mu_);
    auto it = items_.find(id);
    if (it == items_.end()) return std::nullopt;
    return it->second;
}

bool ResponseStore::erase(const std::string& id) {
    std::lock_guard lock(mu_);
    if (items_.erase(id) == 0) return false;
    order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
    return true;
}

size_t ResponseStore::size() const {
    std::lock_guard lock(mu_);
    return items_.size();
}

}  // namespace osprey::server
