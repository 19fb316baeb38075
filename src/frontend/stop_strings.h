// Text-level stop strings for streamed output: text is released only once it cannot be the start
// of a stop string, and everything from the first match on is dropped. Tests: tests/frontend/test_chat_output.cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace osprey::frontend {

class StopStrings {
public:
    // include_stop: the matched stop string stays in the output (vLLM's include_stop_str_in_output).
    explicit StopStrings(std::vector<std::string> stops = {}, bool include_stop = false)
        : stops_(std::move(stops)), include_stop_(include_stop) {}

    // Adds text; returns what can be shown now. After a match, returns only the text before it (and the
    // stop string itself when include_stop) and
    // matched() turns true (later calls return nothing).
    std::string push(std::string_view text);
    // End of output: the held-back tail (nothing after a match).
    std::string flush();
    bool matched() const { return matched_; }

private:
    std::vector<std::string> stops_;
    bool include_stop_ = false;
    std::string held_;
    bool matched_ = false;
};

}  // namespace osprey::frontend
