// Stop-string matching over streamed text (see stop_strings.h).
#include "frontend/stop_strings.h"

#include <algorithm>

#include "core/utf8.h"

namespace osprey::frontend {

std::string StopStrings::push(std::string_view text) {
    if (matched_) return {};
    held_ += text;
    if (stops_.empty()) {
        std::string out;
        out.swap(held_);
        return out;
    }
    size_t first = std::string::npos, length = 0;
    for (const auto& s : stops_) {
        const size_t at = held_.find(s);
        if (at < first || (at == first && at != std::string::npos && s.size() > length)) first = at, length = s.size();
    }
    if (first != std::string::npos) {
        matched_ = true;
        std::string out = held_.substr(0, first + (include_stop_ ? length : 0));
        held_.clear();
        return out;
    }
    // Hold back the longest suffix that is a proper prefix of some stop string.
    size_t keep = 0;
    for (const auto& s : stops_) {
        for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
            if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
                keep = k;
                break;
            }
        }
    }
    size_t release = held_.size() - keep;
    // Never cut a UTF-8 character in two.
    release = utf8::complete_prefix_length(std::string_view(held_).substr(0, release));
    std::string out = held_.substr(0, release);
    held_.erase(0, release);
    return out;
}

std::string StopStrings::flush() {
    if (matched_) return {};
    std::string out;
    out.swap(held_);
    return out;
}

}  // namespace osprey::frontend
