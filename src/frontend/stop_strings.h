// Text-level stop strings for streamed output: text is released only once it cannot be the start
// of a stop string, and everything from the first match on is dropped. Tests: tests/frontend/test_chat_output.cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace osprey::frontend {

class StopStrings {
public:
    explicit StopStrings(std::vector<std::string> stops = {}) : stops_(std::move(stops)) {}

    // Adds text; returns what can be shown now. After a match, returns only the text before it and
    // matched() turns true (later calls return nothing).
    std::string push(std::string_view text);
    // End of output: the held-back tail (nothing after a match).
    std::string flush();
    bool matched() const { return matched_; }

private:
    std::vector<std::string> stops_;
    std::string held_;
    bool matched_ = false;
};

}  // namespace osprey::frontend
